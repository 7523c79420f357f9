"""A small LRU of computed prompt-prefix KV caches, keyed by the prefix's token ids: the torch
readers encode a static prefix once and reuse it across requests."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any


class PrefixLRU:
    """At most ``max_entries`` values; ``get_or_build`` returns the cached one (marking it recent)
    or builds, stores and returns a new one, evicting the least recently used."""

    def __init__(self, *, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries!r}")
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[int, ...], Any] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get_or_build(self, key: tuple[int, ...], build: Callable[[], Any]) -> Any:
        cached = self._entries.get(key)
        if cached is not None:
            self._entries.move_to_end(key)
            return cached
        value = build()
        self._entries[key] = value
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return value
