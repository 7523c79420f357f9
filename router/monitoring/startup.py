"""The app's monitor, built and restored at start-up: alarms and audit labels go to the decision
log, audits to the slow path, and the alarms and watch evidence a decision log and its
checkpoint hold are taken up again."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from policies.types import DecisionRequest
from router.monitoring.checkpoint import checkpoint_path
from router.monitoring.monitor import Monitor
from router.routing.ports import SlowModel

if TYPE_CHECKING:
    from router.settings import Settings
    from router.store.metrics import Metrics

logger = logging.getLogger(__name__)


def make_monitor(settings: Settings, *, metrics: Metrics, decision_log: Any,
                 slow: SlowModel | None) -> Monitor:
    """The app's monitor: alarms and audit labels go to the decision log, audits to the slow
    path (when one is configured), alarms recorded in the log before a restart are re-armed
    once the policies are loaded (``restore_from_log``)."""

    async def answer(request: DecisionRequest) -> str:
        if slow is None or not slow.available:
            from router.errors import NoSlowModel

            raise NoSlowModel("audit")
        # Outside the clients' slots: the audit workers are the audits' budget.
        return str((await slow.audit(request)).answer)

    return Monitor(metrics=metrics, events=getattr(decision_log, "add_event", None),
                   answer=answer, audit_capacity=settings.monitoring.audit_queue,
                   audit_workers=settings.monitoring.audit_workers,
                   dedupe_window_s=float(settings.cache.ttl_s))


def restore_from_log(monitor: Monitor, path: Path) -> int:
    """Re-arm the alarms a decision log holds for the policies ``monitor`` watches (an
    operator's later clear wins), resume the watches' evidence from the checkpoint beside it and
    keep checkpointing there. The typed reader skips (and counts) damaged lines: a bad record
    never stops a start."""
    from router.store.log_join import alarms
    from router.store.log_reader import read_log

    resumed = monitor.keep_checkpoints(checkpoint_path(path))
    if resumed:
        logger.info("%d policy watch(es) resumed from %s", resumed, checkpoint_path(path))
    if not monitor.watches:
        return 0
    # quiet: the decision log warned of damaged lines once already, rebuilding its index
    restored = monitor.restore(alarms(read_log(path, quiet=True)))
    if restored:
        logger.warning("%d policy alarm(s) restored from %s: those policies stay in alarm "
                       "until cleared (`slotgate alarms clear`) or re-tuned", restored, path)
    return restored
