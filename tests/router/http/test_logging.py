"""The server's logging: slotgate's own INFO lines, not one from watchfiles per change it sees
in the policy folder (the decision log beside the policy file changes on every request)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from router.http.server import configure_logging


@pytest.fixture
def watchfiles_level() -> Iterator[None]:
    logger = logging.getLogger("watchfiles")
    level = logger.level
    yield
    logger.setLevel(level)


async def test_a_change_in_the_watched_folder_logs_no_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, watchfiles_level: None) -> None:
    from watchfiles import awatch

    caplog.set_level(logging.INFO)
    configure_logging()
    seen: set[tuple[object, str]] = set()
    # yield_on_timeout: the first (empty) yield says the watcher runs, so the write is seen.
    async for changes in awatch(tmp_path, yield_on_timeout=True, rust_timeout=50,
                                debounce=10, step=5):
        if changes:
            seen = changes
            break
        (tmp_path / "decisions.jsonl").write_text("{}\n")
    assert seen  # watchfiles saw the write...
    logging.getLogger("router.http.server").info("serving")
    assert [r.name for r in caplog.records] == ["router.http.server"]  # ...and said nothing
