"""The static prefixes' cache under traffic that mixes questions (prefix_lru.py): it counts its
hits, misses and evictions, says when questions in rotation outgrow it, its size is an option
(``fast.options.prefix_cache_entries``; before, 8 fixed), and /readyz shows it (test_serving.py,
tests/router/http/test_app_fast_backend.py)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from router.backends.torch.serve.prefix_lru import PrefixLRU
from router.errors import ConfigError
from router.settings import load_settings


def test_hits_misses_and_evictions_are_counted() -> None:
    lru = PrefixLRU(max_entries=2)
    built: list[tuple[int, ...]] = []

    def get(key: tuple[int, ...]) -> Any:
        return lru.get_or_build(key, lambda: built.append(key) or f"kv{key}")

    assert get((1,)) == "kv(1,)" and get((2,)) == "kv(2,)" and get((1,)) == "kv(1,)"
    assert lru.stats() == {"entries": 2, "capacity": 2, "hits": 1, "misses": 2, "evictions": 0}
    get((3,))  # evicts (2,), the least recently used
    get((2,))  # built again: evicts (1,)
    assert built == [(1,), (2,), (3,), (2,)]
    assert lru.stats() == {"entries": 2, "capacity": 2, "hits": 1, "misses": 4, "evictions": 2}


def test_questions_outgrowing_the_cache_are_logged_without_flooding(
        caplog: pytest.LogCaptureFixture) -> None:
    lru = PrefixLRU(max_entries=1)
    with caplog.at_level(logging.WARNING, logger="router.backends.torch.serve.prefix_lru"):
        for k in range(101):  # two questions in turn: every read after the first evicts
            lru.get_or_build((k % 2,), lambda: "kv")
    assert lru.evictions == 100
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 3  # the 1st, 10th and 100th eviction
    assert "fast.options.prefix_cache_entries=1" in warnings[0]
    assert warnings[2].startswith("prefix cache full: 100 eviction(s) so far (0 hits, 101 misses)")


@pytest.mark.parametrize("value", [0, -3, "many"])
def test_a_bad_cache_size_is_refused_naming_it(value: Any, tmp_path: Path) -> None:
    config = tmp_path / "slotgate.yaml"
    config.write_text("fast:\n  kind: torch\n  model_path: /nowhere\n  options:\n"
                      f"    kind: diffusion\n    prefix_cache_entries: {value}\n")
    with pytest.raises(ConfigError, match="prefix_cache_entries"):
        load_settings(config)
