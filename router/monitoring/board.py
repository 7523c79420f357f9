"""What replicas share through an alarm board (``router/store/alarm_board.py``): the board's
port, the records of alarms and operators' clears, and the counter of watches rebuilt."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import Counter

from router.monitoring.watch import Alarm
from router.store.records import AlarmRecord

if TYPE_CHECKING:
    from router.store.metrics import Metrics

__all__ = ["CLEAR_DETAIL", "AlarmBoard", "alarm_of", "alarm_record", "clear_record",
           "watch_resets"]

CLEAR_DETAIL = "cleared by an operator (slotgate alarms clear)"


class AlarmBoard(Protocol):
    """Where replicas share alarm and clear records. Never raises: ``read`` answers None while
    the store fails (so nothing is taken for lost), and skips a damaged record, its key only."""

    async def post(self, record: AlarmRecord) -> None: ...

    async def read(self, policy_ids: Sequence[str]) -> list[AlarmRecord] | None: ...


def alarm_record(alarm: Alarm, *, on_alarm: str | None = None,
                 shared: bool = False) -> AlarmRecord:
    return AlarmRecord(policy_id=alarm.policy_id, kind=alarm.kind, decision=alarm.decision,
                       time=alarm.time, detail=alarm.detail, on_alarm=on_alarm, shared=shared)


def clear_record(policy_id: str, at: float, decision: int, *, shared: bool = False,
                 detail: str = CLEAR_DETAIL) -> AlarmRecord:
    return AlarmRecord(policy_id=policy_id, kind="clear", decision=decision, time=at,
                       detail=detail, shared=shared)


def alarm_of(record: AlarmRecord) -> Alarm | None:
    """The alarm a record raised; None for an operator's clear and a broken cost promise (its
    alarm is the cost check's, ``CostChecks.latch``)."""
    if record.kind == "clear" or record.kind == "cost":
        return None
    return Alarm(record.policy_id, record.kind, record.decision, record.time, record.detail)


# One counter per metrics registry (a second Monitor on the same Metrics shares it).
_RESET_COUNTERS: weakref.WeakKeyDictionary[Any, Counter] = weakref.WeakKeyDictionary()


def watch_resets(metrics: Metrics) -> Counter:
    """``slotgate_policy_watch_resets_total{policy, reason}``: watches rebuilt because a reload
    of the same policy id brought another basis (``reason``: the fields that changed)."""
    registry = metrics.registry
    counter = _RESET_COUNTERS.get(registry)
    if counter is None:
        counter = _RESET_COUNTERS[registry] = Counter(
            "slotgate_policy_watch_resets", "Policy watches started afresh because a reload of "
            "the same policy id changed what they measure against (reason: reference, "
            "alarm_alpha)", ["policy", "reason"], registry=registry)
    return counter
