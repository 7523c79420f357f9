"""The start-up heap is frozen out of the garbage collector's reach: at the end of the app's
start-up, and again once the slow path's background import of litellm is done."""

from __future__ import annotations

import asyncio
import gc
import threading
from pathlib import Path

from fastapi.testclient import TestClient

from router.backends.mock import MockBackend
from router.http.app import create_app
from router.http.startup_freeze import freeze_after_warm_up
from router.settings import Settings


def _collectable(obj: object) -> bool:
    return any(o is obj for o in gc.get_objects())


def test_app_start_up_freezes_what_is_alive(tmp_path: Path) -> None:
    gc.unfreeze()
    before = [["alive before start-up"]]
    assert _collectable(before)
    settings = Settings(log={"decision_log_path": tmp_path / "d.jsonl"})
    backend = MockBackend(lambda request: [1.0 / len(request.options)] * len(request.options))
    with TestClient(create_app(settings, backend=backend)) as client:
        assert client.get("/healthz").status_code == 200
        assert gc.get_freeze_count() > 0 and not _collectable(before)
    gc.unfreeze()


async def test_freezes_again_once_the_warm_up_is_done() -> None:
    gc.unfreeze()
    warmed_up = threading.Event()
    task = asyncio.create_task(freeze_after_warm_up(warmed_up, poll_s=0.01))
    await asyncio.sleep(0.05)
    assert gc.get_freeze_count() == 0 and not task.done()  # waits for the warm-up
    late = [["made by the warm-up"]]
    warmed_up.set()
    await asyncio.wait_for(task, timeout=5)
    assert not _collectable(late)
    gc.unfreeze()


async def test_gives_up_after_its_timeout_without_freezing() -> None:
    gc.unfreeze()
    await freeze_after_warm_up(threading.Event(), timeout_s=0.05, poll_s=0.01)
    assert gc.get_freeze_count() == 0
