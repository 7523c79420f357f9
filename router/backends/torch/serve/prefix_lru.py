"""A small LRU of computed prompt-prefix KV caches, keyed by the prefix's token ids: the torch
readers encode a static prefix once and reuse it across requests."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class PrefixLRU:
    """At most ``max_entries`` values; ``get_or_build`` returns the cached one (marking it recent)
    or builds, stores and returns a new one, evicting the least recently used.

    Counts its hits, misses and evictions (``stats``, shown on ``/readyz``). Why: each question
    has its own static prefix, and traffic that rotates through more questions than
    ``max_entries`` misses on every read, each miss one more encoder pass over the whole prefix
    (about a read's time on a GPU). The first eviction, and then the 10th, 100th, ..., log a
    WARNING naming ``fast.options.prefix_cache_entries``."""

    def __init__(self, *, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries!r}")
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[int, ...], Any] = OrderedDict()
        self.hits = self.misses = self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get_or_build(self, key: tuple[int, ...], build: Callable[[], Any]) -> Any:
        cached = self._entries.get(key)
        if cached is not None:
            self._entries.move_to_end(key)
            self.hits += 1
            return cached
        self.misses += 1
        value = build()
        self._entries[key] = value
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
            self.evictions += 1
            if _power_of_ten(self.evictions):
                log.warning(
                    "prefix cache full: %d eviction(s) so far (%d hits, %d misses); questions in "
                    "rotation exceed fast.options.prefix_cache_entries=%d, and each miss encodes "
                    "its whole prefix again", self.evictions, self.hits, self.misses,
                    self.max_entries)
        return value

    def stats(self) -> dict[str, int]:
        return {"entries": len(self._entries), "capacity": self.max_entries, "hits": self.hits,
                "misses": self.misses, "evictions": self.evictions}


def _power_of_ten(n: int) -> bool:
    while n >= 10 and n % 10 == 0:
        n //= 10
    return n == 1
