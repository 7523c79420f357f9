"""Live policy reload: SIGHUP, and (``policy.watch``) a change to any configured policy file on
disk, make the registry read its files again (``PolicyRegistry.reload``): switching a policy from
shadow to routing, or serving a re-tuned file, needs no restart. An invalid new file is refused
with a log line naming it, and the policies loaded before keep serving.

The file watch is ``watchfiles`` (Rust's notify; uvicorn's reloader uses it) on the files'
folders, so a file written atomically (a temporary file renamed over it, as ``slotgate tune``
writes) is seen like one edited in place.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator
from pathlib import Path

from router.routing.registry import PolicyRegistry

log = logging.getLogger("slotgate")


@contextlib.asynccontextmanager
async def live_reload(registry: PolicyRegistry, *, watch: bool) -> AsyncIterator[None]:
    """While inside: SIGHUP reloads (where the loop can take signals: the main thread of a
    Unix process), and with ``watch`` so does a change to a policy file."""
    loop = asyncio.get_running_loop()
    hooked = False
    try:
        loop.add_signal_handler(signal.SIGHUP, _reload, registry, "SIGHUP")
        hooked = True
    except (NotImplementedError, RuntimeError, ValueError, AttributeError):
        pass  # not the main thread, or no SIGHUP here: the file watch still works
    stop = asyncio.Event()
    paths = [p.resolve() for p in registry.paths()]
    task = asyncio.create_task(_watch(registry, paths, stop)) if watch and paths else None
    try:
        yield
    finally:
        stop.set()
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if hooked:
            loop.remove_signal_handler(signal.SIGHUP)


def _reload(registry: PolicyRegistry, why: str) -> None:
    log.info("reloading policies (%s)", why)
    registry.reload()


async def _watch(registry: PolicyRegistry, paths: list[Path], stop: asyncio.Event) -> None:
    from watchfiles import awatch

    wanted = {str(p) for p in paths}
    folders = sorted({str(p.parent) for p in paths if p.parent.is_dir()})
    if not folders:
        log.warning("policy watch: none of the folders of %s exists; SIGHUP still reloads",
                    sorted(wanted))
        return
    async for changes in awatch(*folders, stop_event=stop, recursive=False,
                                watch_filter=lambda _, path: str(Path(path).resolve()) in wanted):
        _reload(registry, "changed: " + ", ".join(sorted({path for _, path in changes})))
