"""What the torch backend asks of a slot reader (diffusion.py, causal.py, masked.py), and the
immutability the readers share: a reader's kernels and settings are fixed when it is built."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from router.backends.torch.diffusion import SlotItem, SlotRead


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

    def read(self, items: Sequence[SlotItem]) -> list[SlotRead]: ...

    def warm_up(self, sample: SlotItem) -> SlotReader:
        """The reader to serve with, made ready on ``sample``: this one, or (when compiling or
        capturing fails) an eager twin over the same model; never this one changed."""
        ...


class Frozen:
    """Attributes are set in ``__init__``, which ends with ``self._seal()``, and never again."""

    _sealed = False

    def _seal(self) -> None:
        object.__setattr__(self, "_sealed", True)

    def __setattr__(self, name: str, value: object) -> None:
        if self._sealed:
            raise AttributeError(f"{type(self).__name__} is immutable once built "
                                 f"(its kernels are chosen at construction): {name}")
        object.__setattr__(self, name, value)
