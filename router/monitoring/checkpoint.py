"""The watches' evidence on disk, beside the decision log, so it outlives the process: claimed
by one process at a time, read once at start-up (each watch resumes what passes its checks),
written atomically every few seconds and at shutdown (``Monitor.keep_checkpoints``).

The file is one JSON object: each watch's ``PolicyWatch.state()`` under its policy id, and the
cost checks' ``CostChecks.state()`` under ``COST_KEY`` (no policy id takes that form), left out
when no policy has a cost promise. A reader that knows no cost checks skips that entry; one
reading a file without it starts the cost checks afresh."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from calibration.state import DamagedState
from router.errors import ConfigError
from router.monitoring.cost import CostChecks
from router.monitoring.watch import STATE_VERSION, PolicyWatch

logger = logging.getLogger("slotgate.monitoring")
CHECKPOINT_EVERY_S = 10.0  # how often each watch's evidence is written
COST_KEY = "cost"  # the cost checks' entry; policy ids are "name@hash"


class CheckpointInUse(ConfigError):
    """Another process keeps its watches' evidence in this checkpoint: two replicas must not
    share one (each one's writes would silently replace the other's evidence)."""


def checkpoint_path(decision_log_path: Path) -> Path:
    """Where a replica keeps its watches' evidence: beside its decision log."""
    return decision_log_path.with_name(decision_log_path.name + ".watch.json")


def check_unclaimed(decision_log_path: Path) -> None:
    """Raise ``CheckpointInUse`` when another process holds the checkpoint beside this
    decision log: for a start-up check before the server starts (the lock is let go at once;
    ``Checkpoints.open`` takes it for good)."""
    handle = _claim(checkpoint_path(decision_log_path))
    if handle is not None:
        handle.close()


def resume(path: Path, watches: Mapping[str, PolicyWatch],
           costs: CostChecks | None = None) -> int:
    """Resume each watch from its entry at ``path``, and each of ``costs``' checks from the
    cost entry (``CostChecks.resume``). An entry gathered on another basis is not taken; one of
    another format is not taken either, with one warning naming the policy and both formats; a
    damaged file or entry is discarded with one warning naming the file, the policy and the
    field. Either way those watches start afresh. Returns how many watches resumed."""
    try:
        states = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: nested too deep
        logger.warning("watch checkpoint %s unreadable, the watches start afresh: %s", path,
                       str(exc)[:200])
        return 0
    if not isinstance(states, dict):
        logger.warning("watch checkpoint %s is not a JSON object: the watches start afresh", path)
        return 0
    resumed = 0
    for policy_id, watch in watches.items():
        state = states.get(policy_id)
        if state is None:
            continue
        try:
            if not isinstance(state, dict):
                raise DamagedState(f"the entry must be a JSON object, got {type(state).__name__}")
            taken = watch.resume(state)
            resumed += taken
            if not taken and state.get("version") != STATE_VERSION:
                logger.warning(
                    "watch checkpoint %s: policy %s: its entry is of format %r and this slotgate "
                    "keeps format %d: evidence saved in another format cannot be carried over, "
                    "so its watch starts afresh",
                    path, policy_id, state.get("version"), STATE_VERSION)
        except DamagedState as exc:
            logger.warning("watch checkpoint %s: policy %s: %s; that watch starts afresh", path,
                           policy_id, exc)
    if costs is not None:
        costs.resume(states.get(COST_KEY), path)
    return resumed


def write(path: Path, watches: Mapping[str, PolicyWatch],
          costs: CostChecks | None = None) -> None:
    """Every watch's and cost check's evidence to ``path``, atomically (a temporary file, then
    a rename: a crash mid-write leaves the previous checkpoint; a failed write leaves no
    temporary file). A retired policy's watch and cost check are no longer in it."""
    states: dict[str, object] = {policy_id: watch.state() for policy_id, watch in watches.items()}
    if costs is not None and costs.checks:
        states[COST_KEY] = costs.state()
    temporary = path.with_name(path.name + ".tmp")
    try:
        temporary.write_text(json.dumps(states, allow_nan=False), encoding="utf-8")
        os.replace(temporary, path)
    except (OSError, ValueError) as exc:  # ValueError: a non-finite number, never written
        logger.warning("watch checkpoint not written to %s: %s", path, exc)
        with contextlib.suppress(OSError):  # its folder may be gone, or a file now
            temporary.unlink(missing_ok=True)


class Checkpoints:
    """One process's checkpoint: ``open`` claims it (an exclusive lock on ``<path>.lock``,
    held until ``close``: a second process pointed at the same decision log is refused with
    ``CheckpointInUse``), then ``resume``, ``start`` (a write every ``every_s``), ``stop`` and
    ``close`` (the last write, then the lock goes)."""

    def __init__(self, path: Path, watches: Mapping[str, PolicyWatch],
                 lock: IO[str] | None, costs: CostChecks | None = None) -> None:
        self.path = path
        self._watches = watches
        self._costs = costs
        self._lock = lock
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def open(cls, path: Path, watches: Mapping[str, PolicyWatch],
             costs: CostChecks | None = None) -> Checkpoints:
        return cls(path, watches, _claim(path), costs)

    def resume(self) -> int:
        return resume(self.path, self._watches, self._costs)

    def write(self) -> None:
        write(self.path, self._watches, self._costs)

    def start(self, every_s: float) -> None:
        self._task = asyncio.get_running_loop().create_task(self._every(every_s))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def close(self) -> None:
        try:
            self.write()
        finally:
            if self._lock is not None:
                self._lock.close()  # closing the file releases its lock
                self._lock = None

    async def _every(self, every_s: float) -> None:
        while True:
            await asyncio.sleep(every_s)
            self.write()


def _claim(path: Path) -> IO[str] | None:
    """The lock on ``path`` for this process; None (warned) where no lock file can be made:
    nothing can be written beside it then either."""
    lock_path = path.with_name(path.name + ".lock")
    try:
        handle = lock_path.open("a", encoding="utf-8")
    except OSError as exc:
        logger.warning("watch checkpoint %s: no lock file (%s): it is not guarded against a "
                       "second replica", path, exc)
        return None
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        handle.close()
        raise CheckpointInUse(
            f"watch checkpoint {path} is held by another slotgate process ({lock_path} is "
            "locked): replicas must not share a decision log and its checkpoint; give each its "
            "own log.decision_log_path", field="log.decision_log_path") from exc
    return handle
