"""Live policy reload: SIGHUP, and (``policy.watch``) a change to any configured policy file on
disk, make the registry read its files again (``PolicyRegistry.reload``): switching a policy from
shadow to routing, or serving a re-tuned file, needs no restart. An invalid new file is refused
with one ERROR line naming it (and the field), the policies loaded before keep serving, and the
watch goes on: nothing a load raises ends it (docs/reliability.md, "Policy reload").

The watch is ``watchfiles`` (Rust's notify) on the files' folders, both the configured one and
the one a symlink resolves to, plus a look at the files every ``WATCH_RESCAN_MS`` without
events. What counts as a change is the file's identity, stat'ed through the symlink each time
(resolved path, inode, mtime, size): a file renamed over (``slotgate tune``), edited in place, or
a Kubernetes ConfigMap's ``..data`` symlink swapped to a new revision folder (whose old folder,
the one the watch resolved to before, is deleted) all change it, any number of times.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from router.routing.registry import PolicyRegistry
from router.settings import PolicySettings
from router.store.metrics import Metrics

log = logging.getLogger("slotgate")
# Without any event, the files are stat'ed this often: a revision folder that was deleted under
# the watch sends nothing more, and an event missed for any reason is caught within this time.
WATCH_RESCAN_MS = 1000

FileId = tuple[str, int, int, int] | None  # (resolved path, inode, mtime ns, size); None: missing


@contextlib.asynccontextmanager
async def live_reload(registry: PolicyRegistry, *, watch: bool, metrics: Metrics | None = None,
                      settings: PolicySettings | None = None) -> AsyncIterator[None]:
    """While inside: SIGHUP reloads (where the loop can take signals: the main thread of a
    Unix process), and with ``watch`` so does a change to a policy file. With ``settings``, a
    disagreement between ``policy.shadow`` and a file's own flag is logged now and at reloads."""
    if settings is not None:
        log_shadow_precedence(registry, settings)
    loop = asyncio.get_running_loop()
    hooked = False
    try:
        loop.add_signal_handler(signal.SIGHUP, reload_now, registry, "SIGHUP", metrics, settings)
        hooked = True
    except (NotImplementedError, RuntimeError, ValueError, AttributeError):
        pass  # not the main thread, or no SIGHUP here: the file watch still works
    stop = asyncio.Event()
    paths = [Path(os.path.abspath(p)) for p in registry.paths()]
    task = asyncio.create_task(_watch(registry, paths, stop, metrics, settings)) \
        if watch and paths else None
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


def reload_now(registry: PolicyRegistry, why: str, metrics: Metrics | None = None,
               settings: PolicySettings | None = None) -> bool:
    """One reload, counted by result. The reload boundary: whatever a load raises is logged as
    one refusal (the registry names the file and field for what it knows), never raised into a
    signal handler or the watch task, where it would end the watch without a word."""
    log.info("reloading policies (%s)", why)
    try:
        loaded = registry.reload()
    except Exception as exc:  # noqa: BLE001 - see the docstring: nothing may end the watch
        log.error("policy reload refused, the loaded policies keep serving: %s: %s",
                  type(exc).__name__, exc)
        loaded = False
    if metrics is not None:
        metrics.policy_reload("loaded" if loaded else "refused")
    if loaded and settings is not None:
        log_shadow_precedence(registry, settings)
    return loaded


def log_shadow_precedence(registry: PolicyRegistry, settings: PolicySettings) -> list[str]:
    """A policy file's own ``shadow`` flag wins over the server's ``policy.shadow`` (set in the
    config or as SLOTGATE_POLICY__SHADOW): the file is the artifact that moves a policy from shadow
    to routing, live. Where an explicitly set ``policy.shadow`` disagrees with a file, one WARNING
    line per policy says which wins. Returns the policies named."""
    if "shadow" not in settings.model_fields_set:
        return []
    named = []
    for policy in registry.loaded():
        shadow = policy.file.shadow
        if shadow is None or shadow == settings.shadow:
            continue
        named.append(policy.name)
        log.warning(
            "policy %r (%s) says \"shadow\": %s, which wins over policy.shadow = %s "
            "(SLOTGATE_POLICY__SHADOW): its decisions are %s. Change the file's flag to change "
            "that (it reloads live); policy.shadow covers only files that leave it out.",
            policy.name, policy.path, str(shadow).lower(), str(settings.shadow).lower(),
            "shadowed" if shadow else "routed, not shadowed")
    return named


def file_id(path: Path) -> FileId:
    """What a change to ``path`` changes, followed through symlinks at every call."""
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except OSError:
        return None
    return (real, st.st_ino, st.st_mtime_ns, st.st_size)


def watched_folders(paths: Sequence[Path]) -> list[str]:
    """Each file's own folder (where a ConfigMap swaps ``..data``) and its target's folder."""
    folders = {str(p.parent) for p in paths} | {os.path.dirname(os.path.realpath(p)) for p in paths}
    return sorted(f for f in folders if os.path.isdir(f))


async def _watch(registry: PolicyRegistry, paths: list[Path], stop: asyncio.Event,
                 metrics: Metrics | None, settings: PolicySettings | None) -> None:
    from watchfiles import awatch

    seen = {p: file_id(p) for p in paths}
    warned = False
    while not stop.is_set():
        folders = watched_folders(paths)
        if not folders:
            if not warned:
                log.warning("policy watch: none of the folders of %s exists yet; looking again "
                            "every %d ms (SIGHUP still reloads)", [str(p) for p in paths],
                            WATCH_RESCAN_MS)
                warned = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), WATCH_RESCAN_MS / 1000)
            continue
        try:
            async for _ in awatch(*folders, stop_event=stop, recursive=False, watch_filter=None,
                                  rust_timeout=WATCH_RESCAN_MS, yield_on_timeout=True,
                                  debounce=200):
                now = {p: file_id(p) for p in paths}
                changed = sorted(str(p) for p in paths if now[p] != seen[p])
                seen = now
                if changed:
                    reload_now(registry, "changed: " + ", ".join(changed), metrics, settings)
                if watched_folders(paths) != folders:
                    break  # a symlink now points elsewhere: watch the folders it resolves to
        except Exception:  # the watch outlives a failing notify backend
            log.exception("policy watch failed; watching again in %d ms", WATCH_RESCAN_MS)
            await asyncio.sleep(WATCH_RESCAN_MS / 1000)
