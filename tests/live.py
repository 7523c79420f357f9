"""slotgate's app under a real uvicorn on a free loopback port, in a background thread: the one
live-server harness the HTTP tests share (tests that need more subclass it)."""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any, Self

import httpx
import uvicorn

from router.http.app import create_app
from router.settings import Settings
from tests.conftest import free_port


class LiveServer:
    """``create_app(settings, **parts)`` served in a thread that runs its own asyncio loop, kept
    in ``loop`` so tests can inspect the server side (e.g. count its tasks)."""

    def __init__(self, settings: Settings, **parts: Any) -> None:
        self.port = free_port()
        self.app = create_app(settings, **parts)
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning",
                                loop="asyncio", ws="none", timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        await self.server.serve()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Self:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("slotgate did not start")
            time.sleep(0.02)
        # every test starts on a warmed slow path: litellm's background import took 2.8 s on a
        # cold 2-core machine, past the 2 s slow timeout most of these tests use (a test that
        # forgot to wait got a 504 on its first escalation: CI, 2026-12-03)
        self.wait_for_slow_path()
        return self

    def wait_for_slow_path(self, timeout_s: float = 120.0) -> None:
        """Until the slow path's background import of litellm is done. Escalations wait for it
        within their own deadline (slow.timeout_s), so tests with a short one start after it."""
        from router.http.state import app_state

        warmed_up = getattr(app_state(self.app).service.slow, "warmed_up", None)
        if warmed_up is not None and not warmed_up.wait(timeout_s):
            raise RuntimeError(f"litellm was not imported within {timeout_s} s")

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


def wait_until_up(url: str, proc: subprocess.Popen[Any], *, path: str = "/healthz",
                  timeout_s: float = 60.0, output: Callable[[], str] = lambda: "") -> None:
    """Poll ``url + path`` until it answers 200 while ``proc`` (a ``slotgate serve`` process)
    runs; fail with ``output()`` (e.g. the server's log) if it exits or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{url}{path}", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"slotgate did not come up at {url}{path}: {output()}")
        time.sleep(0.05)
