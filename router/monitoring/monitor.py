"""The router's view of its policies in production: one PolicyWatch per tuned policy, fed by every
decision (label-free drift), by audits and by feedback (accuracy); alarms are logged, exported as
gauges, written to the decision log and acted on per policy (``on_alarm``). With a shared alarm
board (Redis: ``router/store/alarm_board.py``) an alarm one replica raises is posted there and
latched by every other replica serving that policy within ``monitoring.alarm_sync_s``."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from policies.types import Decision, DecisionRequest, OptionScores, Verdict
from router.monitoring.audits import AuditJob, AuditQueue
from router.monitoring.watch import Alarm, PolicyWatch, WatchSettings

if TYPE_CHECKING:
    from router.routing.registry import RuntimePolicy
    from router.settings import Settings
    from router.store.metrics import Metrics

logger = logging.getLogger("slotgate.monitoring")
EventSink = Callable[[dict[str, Any]], Awaitable[None]]


class AlarmBoard(Protocol):
    """Where replicas share alarm records; never raises (a failing store shares nothing)."""

    async def post(self, record: dict[str, Any]) -> None: ...

    async def read(self, policy_ids: Sequence[str]) -> list[dict[str, Any]]: ...

SlowAnswer = Callable[[DecisionRequest], Awaitable[str]]
_LABELLED_MEMORY = 100_000  # decision ids already counted once (a later label is logged only)


class WatchedPolicy:
    """A runtime policy that reports each verdict to its watch and, while the watch is in alarm
    with ``on_alarm: escalate_all``, escalates what it would have accepted."""

    def __init__(self, inner: RuntimePolicy, watch: PolicyWatch, monitor: Monitor) -> None:
        self.inner = inner
        self.watch = watch
        self.policy_id = inner.policy_id
        self._monitor = monitor

    def decide(self, scores: OptionScores) -> tuple[Verdict, list[float]]:
        verdict, calibrated = self.inner.decide(scores)
        # The drift reference holds the calibrated probability of the raw argmax (tuning's
        # confidence), whatever option the rule's verdict names.
        alarm = self.watch.observe(calibrated[scores.top_index], accepted=verdict.accept)
        if alarm is not None:
            self._monitor.alarmed(alarm)
        if verdict.accept and self.watch.escalate_all:
            assert self.watch.alarm is not None
            verdict = replace(verdict, accept=False, reason=(
                f"{self.watch.alarm.kind} alarm: every decision escalates until a re-tuned "
                "policy is loaded"))
        return verdict, calibrated


class Monitor:
    """``answer`` asks the slow model for an audit (None: no audits); ``events`` stores alarm
    and audit records (the decision log's ``add_event``)."""

    def __init__(self, *, metrics: Metrics | None = None, events: EventSink | None = None,
                 answer: SlowAnswer | None = None, audit_capacity: int = 1000,
                 audit_workers: int = 2) -> None:
        self.metrics = metrics
        self.watches: dict[str, PolicyWatch] = {}
        self._events = events
        self._answer = answer
        self.audits = AuditQueue(self._audit_answer, self._audit_label, capacity=audit_capacity,
                                 workers=audit_workers,
                                 on_count=None if metrics is None else metrics.audit)
        self._labelled: OrderedDict[str, str] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()
        self._board: AlarmBoard | None = None
        self._sync: asyncio.Task[None] | None = None
        if metrics is not None:
            metrics.on_render(self.export)

    def wrap(self, runtime: RuntimePolicy, policy_file: Any) -> WatchedPolicy:
        """Watch a loaded policy. A re-tuned file has a new policy id, so a fresh watch: that is
        what clears an alarm. A file without a tuning summary gets no drift test (warned)."""
        settings = WatchSettings.of(policy_file)
        if settings.reference is None:
            logger.warning("policy %s has no tuning-rows summary (tuned by an older slotgate): "
                           "no drift alarm; re-tune it to get one", settings.policy_id)
        watch = self.watches.get(settings.policy_id)
        if watch is None:
            watch = self.watches[settings.policy_id] = PolicyWatch(settings)
        return WatchedPolicy(runtime, watch, self)

    def after(self, requests: Sequence[DecisionRequest], decisions: Sequence[Decision]) -> None:
        """Queue audits of the accepted decisions the draw picks; never waits."""
        if self._answer is None:
            return
        for request, decision in zip(requests, decisions, strict=True):
            watch = self.watches.get(decision.policy_id)
            if (watch is None or decision.escalated or decision.answer is None
                    or decision.route not in ("fast", "cache") or not watch.wants_audit()):
                continue
            self.audits.submit(AuditJob(decision.policy_id, decision.decision_id,
                                        decision.answer, request))

    async def feedback(self, record: dict[str, Any], label: str) -> None:
        """A human label for a logged decision: counted for an accepted one not labelled yet."""
        watch = self.watches.get(str(record.get("policy_id")))
        if (watch is None or record.get("escalated") or record.get("route") not in
                ("fast", "cache") or not self._first_label(str(record["decision_id"]), "feedback")):
            return
        self._label(watch, label == record.get("answer"))

    def restore(self, records: Iterable[dict[str, Any]]) -> int:
        """Re-arm alarms recorded in the decision log for policies loaded now; returns how many."""
        restored = 0
        for record in records:
            watch = self.watches.get(str(record.get("policy_id")))
            if record.get("type") == "alarm" and watch is not None and watch.alarm is None:
                watch.restore(Alarm(watch.policy_id, record["kind"], int(record["decision"]),
                                    float(record["time"]), str(record["detail"])))
                restored += 1
        return restored

    def alarmed(self, alarm: Alarm, *, shared: bool = False) -> None:
        """An alarm raised here (posted to the board, if any) or latched from the board."""
        watch = self.watches[alarm.policy_id]
        logger.warning("ALARM %s on policy %s%s: %s; %s", alarm.kind, alarm.policy_id,
                       " (raised on another replica)" if shared else "", alarm.detail,
                       "escalating every decision until a re-tuned policy is loaded"
                       if watch.escalate_all else "alert only (on_alarm: alert_only)")
        record = {"type": "alarm", "policy_id": alarm.policy_id, "kind": alarm.kind,
                  "decision": alarm.decision, "time": alarm.time, "detail": alarm.detail,
                  "on_alarm": watch.settings.on_alarm}
        self._emit(record | {"shared": True} if shared else record)
        if self._board is not None and not shared:
            self._spawn(self._board.post(record))
        self.export()

    def share(self, board: AlarmBoard, *, interval_s: float) -> None:
        """Post this replica's alarms to ``board`` and latch the others' every ``interval_s``
        (a task of the running loop, stopped by ``aclose``)."""
        self._board = board
        self._sync = asyncio.get_running_loop().create_task(self._sync_every(interval_s))

    async def sync_alarms(self) -> int:
        """Latch the board's alarms of watched policies not in alarm here; how many."""
        if self._board is None:
            return 0
        latched = 0
        for record in await self._board.read(sorted(self.watches)):
            watch = self.watches.get(str(record["policy_id"]))
            if watch is None or watch.alarm is not None:
                continue
            alarm = Alarm(watch.policy_id, record["kind"], int(record["decision"]),
                          float(record["time"]), str(record["detail"]))
            watch.restore(alarm)
            self.alarmed(alarm, shared=True)
            latched += 1
        return latched

    async def _sync_every(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.sync_alarms()
            except (KeyError, TypeError, ValueError) as exc:  # a record of another version
                logger.warning("shared policy alarms: unreadable record skipped (%s)", exc)

    def snapshot(self) -> list[dict[str, Any]]:
        return [watch.snapshot() for watch in self.watches.values()]

    def export(self) -> None:
        if self.metrics is not None:
            for state in self.snapshot():
                self.metrics.policy_state(state)

    async def aclose(self) -> None:
        if self._sync is not None:
            self._sync.cancel()
            await asyncio.gather(self._sync, return_exceptions=True)
        await self.audits.aclose()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _audit_answer(self, job: AuditJob) -> str:
        assert self._answer is not None
        return await self._answer(job.request)

    async def _audit_label(self, job: AuditJob, label: str) -> None:
        correct = label == job.answer
        if self._first_label(job.decision_id, "audit"):
            self._label(self.watches[job.policy_id], correct)
        if self._events is not None:
            await self._events({"type": "audit", "decision_id": job.decision_id,
                                "policy_id": job.policy_id, "label": label,
                                "answer": job.answer, "correct": correct})

    def _label(self, watch: PolicyWatch, correct: bool) -> None:
        alarm = watch.label(correct)
        if alarm is not None:
            self.alarmed(alarm)

    def _first_label(self, decision_id: str, source: str) -> bool:
        """The first label of a decision counts; a human label that comes later is only logged
        (it still wins in exports: ``export_predictions``)."""
        if decision_id in self._labelled:
            return False
        self._labelled[decision_id] = source
        while len(self._labelled) > _LABELLED_MEMORY:
            self._labelled.popitem(last=False)
        return True

    def _emit(self, record: dict[str, Any]) -> None:
        if self._events is not None:
            self._spawn(self._write(record))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        try:
            task = asyncio.get_running_loop().create_task(work)
        except RuntimeError:  # no event loop (offline replay): the caller keeps the record
            work.close()
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _write(self, record: dict[str, Any]) -> None:
        assert self._events is not None
        try:
            await self._events(record)
        except OSError as exc:
            logger.warning("monitoring record not written to the decision log: %s", exc)


def make_monitor(settings: Settings, *, metrics: Metrics, decision_log: Any,
                 slow: Any) -> Monitor:
    """The app's monitor: alarms and audit labels go to the decision log, audits to the slow
    path (when one is configured), alarms recorded in the log before a restart are re-armed
    once the policies are wrapped (``restore_from_log``)."""

    async def answer(request: DecisionRequest) -> str:
        if slow is None or not slow.available:
            from router.errors import NoSlowModel

            raise NoSlowModel("audit")
        return str((await slow.decide(request)).answer)

    return Monitor(metrics=metrics, events=getattr(decision_log, "add_event", None),
                   answer=answer, audit_capacity=settings.monitoring.audit_queue,
                   audit_workers=settings.monitoring.audit_workers)


def restore_from_log(monitor: Monitor, path: Path) -> int:
    """Re-arm the alarms a decision log holds for the policies ``monitor`` watches."""
    from router.store.decision_log import read_records

    if not monitor.watches:
        return 0
    restored = monitor.restore(r for r in read_records(path, events=True)
                               if r.get("type") == "alarm")
    if restored:
        logger.warning("%d policy alarm(s) restored from %s: those policies stay in alarm "
                       "until re-tuned", restored, path)
    return restored
