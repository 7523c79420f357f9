"""What a one-pass read (fused.py) takes: its batch's device tensors, the shared prefix's cached
keys/values, and, for a batch of several questions, which items read which prefix
(``PrefixGroups``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

FAR = 1 << 40  # key position of an empty prefix slot: never visible


@dataclass
class PrefixKV:
    """A prefix's keys/values per layer, (1, H_kv, capacity, D), left-aligned; ``positions`` per
    layer kind gives each slot's token position (FAR when empty); ``length`` is the prefix's
    token count as a 0-d long tensor (device data, so a captured graph reads it)."""

    keys: list[Any]
    values: list[Any]
    positions: dict[str, Any]
    length: Any


@dataclass
class OnePassBatch:
    """Device tensors of one read: prompt rests (B, S) right-padded with their ``lengths`` (B,),
    canvases (R, C) one per (item, draw) with ``row_item`` (R,), slots (R,), labels (R, L)."""

    input_ids: Any
    lengths: Any
    canvas: Any
    row_item: Any
    slots: Any
    label_index: Any
    label_valid: Any


@dataclass(frozen=True)
class PrefixGroups:
    """Several questions' prefixes read in ONE pass: the batch's items ``items[p]:items[p+1]`` and
    their canvas rows ``rows[p]:rows[p+1]`` read ``prefixes[p]`` (each item's tokens sit after its
    own prefix: its positions start at that prefix's length). Only the prefix part of attention
    runs per group, over that group's queries alone, so it costs what one prefix's read of the
    same queries costs; the weights, the experts and the rows' own keys run once for the batch.
    Why: a batch of several questions otherwise runs as one read a question, back to back, each
    padded to its graph bucket and each streaming the expert weights again (153 reads/s at 32
    callers over 4 questions on an H200, against 224 over one: docs/backends.md)."""

    prefixes: tuple[PrefixKV, ...]
    items: tuple[int, ...]  # P + 1 rising bounds over the batch's items, from 0
    rows: tuple[int, ...]  # P + 1 rising bounds over its canvas rows, from 0

    def __post_init__(self) -> None:
        n = len(self.prefixes)
        for name, bounds in (("items", self.items), ("rows", self.rows)):
            if n < 1 or len(bounds) != n + 1 or bounds[0] != 0 or any(
                    b <= a for a, b in pairwise(bounds)):
                raise ValueError(f"prefix groups: {name} must be {n + 1} rising bounds from 0 "
                                 f"(one group a prefix, none empty), got {bounds}")

    @classmethod
    def one(cls, prefix: PrefixKV, n_items: int, n_rows: int) -> PrefixGroups:
        """Every item of the batch reading ``prefix`` (the one-question read)."""
        return cls((prefix,), (0, n_items), (0, n_rows))

    def spans(self) -> Iterator[tuple[PrefixKV, slice, slice]]:
        """Each group: its prefix, its items and its canvas rows."""
        for p, prefix in enumerate(self.prefixes):
            yield prefix, slice(self.items[p], self.items[p + 1]), slice(self.rows[p], self.rows[p + 1])

    def starts(self) -> Any:
        """Each item's prefix length, (B,) long on the prefixes' device (no host sync)."""
        import torch

        return torch.cat([prefix.length.reshape(1).expand(span.stop - span.start)
                          for prefix, span, _ in self.spans()])
