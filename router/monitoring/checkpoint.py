"""The watches' evidence on disk, beside the decision log, so it outlives the process: read
once at start-up (each watch resumes what it can), written atomically every few seconds and at
shutdown (``Monitor.keep_checkpoints``)."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path

from router.monitoring.watch import PolicyWatch

logger = logging.getLogger("slotgate.monitoring")
CHECKPOINT_EVERY_S = 10.0  # how often each watch's evidence is written


def checkpoint_path(decision_log_path: Path) -> Path:
    """Where a replica keeps its watches' evidence: beside its decision log."""
    return decision_log_path.with_name(decision_log_path.name + ".watch.json")


def resume(path: Path, watches: Mapping[str, PolicyWatch]) -> int:
    """Resume each watch from its entry at ``path``; one gathered on another basis, or
    damaged, is skipped (logged) and that watch starts afresh. Returns how many resumed."""
    try:
        states = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError) as exc:
        logger.warning("watch checkpoint %s unreadable, the watches start afresh: %s", path, exc)
        return 0
    if not isinstance(states, dict):
        logger.warning("watch checkpoint %s is not a JSON object: the watches start afresh", path)
        return 0
    resumed = 0
    for policy_id, watch in watches.items():
        state = states.get(policy_id)
        if not isinstance(state, dict):
            continue
        try:
            resumed += watch.resume(state)
        except ValueError as exc:
            logger.warning("%s (%s): that watch starts afresh", exc, path)
    return resumed


def write(path: Path, watches: Mapping[str, PolicyWatch]) -> None:
    """Every watch's evidence to ``path``, atomically (a temporary file, then a rename: a crash
    mid-write leaves the previous checkpoint). A retired policy's watch is no longer in it."""
    states = {policy_id: watch.state() for policy_id, watch in watches.items()}
    temporary = path.with_name(path.name + ".tmp")
    try:
        temporary.write_text(json.dumps(states, allow_nan=False), encoding="utf-8")
        os.replace(temporary, path)
    except OSError as exc:
        logger.warning("watch checkpoint not written to %s: %s", path, exc)
