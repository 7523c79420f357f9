"""What a one-pass read (onepass.py) takes: its batch's device tensors and the shared prefix's
cached keys/values."""

from __future__ import annotations

from dataclasses import dataclass
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
