"""What the torch backend asks of a slot reader (diffusion.py, causal.py, masked.py): the items it
reads, the reads it returns and the protocol. The readers are immutable once built (model/frozen.py:
a reader's kernels and settings are fixed when it is built)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Self

import numpy as np

from router.backends.torch.model.frozen import Frozen

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, slots=True)
class SlotItem:
    """One read: prompt ids split into the static prefix (cached) and the rest, the canvas
    template, the slot to noise and read, the label ids, and the noise draws."""

    prefix_ids: tuple[int, ...]
    suffix_ids: tuple[int, ...]
    canvas_ids: tuple[int, ...]
    slot: int
    label_ids: tuple[int, ...]
    draws: int = 1
    seed: int = 42


@dataclass(frozen=True, slots=True)
class SlotRead:
    """A read's label distribution (mean of the draws) and what the draws said."""

    proba: np.ndarray  # (n_labels,)
    draws: np.ndarray  # (draws, n_labels)
    entropy_nats: float  # over the full vocabulary at the slot, mean over draws
    label_mass: float  # the labels' share of the full-vocabulary softmax, mean over draws


class SlotReader(Protocol):
    """Reads token-level slot items; not thread-safe (the backend serialises calls)."""

    @property
    def device(self) -> torch.device: ...

    @property
    def compiled(self) -> bool:
        """Whether reads run compiled (and replay CUDA graphs where it has them)."""
        ...

    @property
    def needs_warm_up(self) -> bool:
        """Whether ``warm_up`` does work (compiling, capturing) before the first read."""
        ...

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """The item counts a read is padded up to (its graph buckets, ascending); () when reads
        are not padded."""
        ...

    def read(self, items: Sequence[SlotItem]) -> list[SlotRead]: ...

    def warm_up(self, sample: SlotItem) -> SlotReader:
        """The reader to serve with, made ready on ``sample``: this one, or (when compiling or
        capturing fails) an eager twin over the same model; never this one changed."""
        ...


class EagerReader(Frozen):
    """A reader over transformers' eager forward: nothing compiled, nothing to warm up, no
    padding to graph buckets (the causal and masked readers)."""

    compiled = False
    needs_warm_up = False
    batch_sizes: tuple[int, ...] = ()

    def warm_up(self, sample: SlotItem) -> Self:
        return self
