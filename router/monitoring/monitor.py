"""The router's view of its policies in production, behind routing's one observer port
(``router.routing.ports.DecisionObserver``): one PolicyWatch per loaded policy, fed by every
decision (label-free drift), by audits and by trusted labels (accuracy); alarms are logged,
exported as gauges, written to the decision log and acted on per policy (``on_alarm``, through
``gate``); a retired policy's watch and gauges go. With a shared alarm board (Redis:
``router/store/alarm_board.py``) an alarm one replica raises is latched by every replica serving
that policy within ``monitoring.alarm_sync_s`` (a broken cost promise too: records of kind
``cost``), and an operator's clear (``slotgate alarms clear``) reaches them all the same way.
Each watch's and cost check's evidence is checkpointed beside the decision log and resumed at a
restart (``keep_checkpoints``)."""

from __future__ import annotations

import asyncio
import logging
import math
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from policies.types import DecisionRequest
from router.monitoring.audits import AuditJob, AuditQueue
from router.monitoring.board import (
    CLEAR_DETAIL,
    AlarmBoard,
    alarm_of,
    alarm_record,
    clear_record,
    watch_resets,
)
from router.monitoring.checkpoint import CHECKPOINT_EVERY_S, Checkpoints
from router.monitoring.cost import CostBreach, CostChecks
from router.monitoring.fingerprint import input_key
from router.monitoring.ladder import WatchSnapshot, action_words, ladder, state_word
from router.monitoring.watch import DEDUPE_WINDOW_S, Alarm, PolicyWatch, WatchSettings
from router.routing.ports import CostAlarm, Label, Observation
from router.store.records import AlarmRecord

if TYPE_CHECKING:
    from router.store.metrics import Metrics

logger = logging.getLogger("slotgate.monitoring")
EventSink = Callable[[AlarmRecord | dict[str, Any]], Awaitable[None]]
SlowAnswer = Callable[[DecisionRequest], Awaitable[str]]
_LABELLED_MEMORY = 100_000  # decision ids already counted once (a later label is logged only)
# Served fast answers whose input key is remembered, so a label of one counts once per input.
_INPUT_MEMORY = 20_000  # about 4.5 MiB at most (tracemalloc, 42-character decision ids)


class Monitor:
    """``answer`` asks the slow model for an audit (None: no audits); ``events`` stores alarm
    and audit records (the decision log's ``add_event``)."""

    def __init__(self, *, metrics: Metrics | None = None, events: EventSink | None = None,
                 answer: SlowAnswer | None = None, audit_capacity: int = 1000,
                 audit_workers: int = 2, dedupe_window_s: float = DEDUPE_WINDOW_S) -> None:
        self.metrics = metrics
        self.watches: dict[str, PolicyWatch] = {}
        self.costs = CostChecks(metrics)
        self._events = events
        self._answer = answer
        self._dedupe_window_s = dedupe_window_s
        self.audits = AuditQueue(self._audit_answer, self._audit_label, capacity=audit_capacity,
                                 workers=audit_workers, on_count=self._audit_counted,
                                 on_lost=self._audit_lost)
        self._labelled: OrderedDict[str, str] = OrderedDict()
        self._inputs: OrderedDict[str, str] = OrderedDict()  # served fast: decision id -> key
        self._checkpoints: Checkpoints | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._board: AlarmBoard | None = None
        self._sync: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._resets = None if metrics is None else watch_resets(metrics)
        if metrics is not None:
            metrics.on_render(self.export)

    # -- the observer port (router.routing.ports.DecisionObserver) --------------------------

    def watch(self, policy_file: Any) -> None:
        """A policy file the registry loaded. A re-tuned file has a new policy id, so a fresh
        watch. The same policy id reloaded keeps its watch when what the watch measures against
        (``WatchSettings.basis``: the drift reference, ``alarm_alpha``) is unchanged, and takes
        the file's ``on_alarm``, ``audit_rate`` and ``audit_boost`` at once; with another basis
        the watch is rebuilt on the file's own reference (logged and counted, with why). No
        tuning summary: no drift test (warned)."""
        self.costs.watch(policy_file)
        settings = WatchSettings.of(policy_file)
        watch = self.watches.get(settings.policy_id)
        if watch is not None and watch.settings.basis == settings.basis:
            if watch.settings != settings:
                logger.info("policy %s: monitoring settings reloaded (on_alarm %s, audit rate "
                            "%g)", settings.policy_id, settings.on_alarm, settings.audit_rate)
            watch.update_settings(settings)
            self.export()
            return
        if settings.reference is None:
            logger.warning("policy %s has no tuning-rows summary (tuned by an older slotgate): "
                           "no drift alarm; re-tune it to get one", settings.policy_id)
        if watch is None:
            self.watches[settings.policy_id] = PolicyWatch(
                settings, dedupe_window_s=self._dedupe_window_s)
            return
        self._rebuild(watch, settings)

    def retire_others(self, policy_ids: Iterable[str]) -> None:
        """The registry now serves exactly ``policy_ids``: the watch of every other policy (a
        re-tuned one's old id, a removed file) goes, with its gauges, its checkpoint and its
        queued audits' labels (they are logged, counted nowhere)."""
        self.costs.retire_others(keep := set(policy_ids))
        for policy_id in [p for p in self.watches if p not in keep]:
            watch = self.watches.pop(policy_id)
            logger.info("policy %s retired: its watch (%d decisions) and its gauges are dropped",
                        policy_id, watch.n_decisions)
            if self.metrics is not None:
                self.metrics.forget_policy(policy_id)

    def _rebuild(self, watch: PolicyWatch, settings: WatchSettings) -> None:
        """The same policy id reloaded with another watch basis: the evidence gathered against
        the old one is dropped and the watch starts afresh on the file's own (docs/monitoring.md,
        "The policy file")."""
        changed = settings.basis_changes(watch.settings)
        old = watch.settings
        fresh = watch.rebuilt(settings)
        self.watches[settings.policy_id] = fresh
        logger.warning(
            "policy %s: reloaded with another %s (drift reference %s -> %s, alarm_alpha %g -> "
            "%g): its watch starts afresh on the new reference, dropping the evidence of %d "
            "decisions (%d distinct inputs, %d labels, drift log-martingale %s) gathered "
            "against the old one%s", settings.policy_id, " and ".join(changed),
            old.reference_id, settings.reference_id, old.alarm_alpha, settings.alarm_alpha,
            watch.n_decisions, watch.n_counted, watch.accuracy().n,
            "none" if watch.drift is None else f"{watch.drift.log_value:.2f}",
            "" if not fresh.alarms else (
                f"; standing alarms stay until cleared ({', '.join(sorted(fresh.alarms))}: "
                f"`slotgate alarms clear --policy {settings.policy_id}`)"))
        if self._resets is not None:
            self._resets.labels(policy=settings.policy_id, reason="+".join(changed)).inc()
        self.export()

    def gate(self, policy_id: str) -> str | None:
        """Why every decision ``policy_id`` would accept escalates now (``on_alarm``,
        ``router.monitoring.ladder``); None while its verdicts stand or it is not watched.
        Changes nothing: it only reads the watch."""
        snapshot = self.snapshot(policy_id)
        return None if snapshot is None else ladder(snapshot).reason

    def cost_alarm(self, policy_id: str) -> CostAlarm | None:  # a cost promise's (``.cost``)
        return self.costs.alarm(policy_id)

    def watch_state(self, policy_id: str) -> str | None:
        """The watch in one word for receipts (``ladder.state_word``); None: not watched."""
        snapshot = self.snapshot(policy_id)
        return None if snapshot is None else state_word(snapshot)

    def snapshot(self, policy_id: str) -> WatchSnapshot | None:
        """The facts the ladder acts on for ``policy_id`` (None when it is not watched)."""
        watch = self.watches.get(policy_id)
        return None if watch is None else watch.snapshot()

    def decided(self, observation: Observation) -> None:
        """One decision with a fast read: the watch takes it (identical inputs once per window)
        and an accepted, served, new input may be drawn for an audit (queued, never waited on)
        with a probability by its risk (``PolicyWatch.draw``), its ticket carried with it."""
        breach = self.costs.decided(observation.policy_id, accepted=observation.accepted)
        if breach is not None:
            self.cost_alarmed(breach)
        watch = self.watches.get(observation.policy_id)
        if watch is None:
            return
        key = input_key(observation.request)
        tripped = watch.traffic_tripped
        counted, alarm = watch.take(observation.confidence, accepted=observation.accepted,
                                    key=key, caller=observation.caller)
        if alarm is not None:
            self.alarmed(alarm)
        if watch.traffic_tripped and not tripped:
            logger.warning("policy %s: its traffic is less sure than its tuning rows at decision "
                           "%d (not an alarm: unsure traffic puts no wrong answer in front of "
                           "anyone); %s; accuracy is tested on the labels from here on too",
                           watch.policy_id, watch.n_decisions,
                           action_words(watch.gate, watch.settings.on_alarm) if watch.gate.escalate else
                           f"audit rate raised to {watch.audit_rate:g}"
                           if watch.audit_rate > watch.settings.audit_rate else "no action")
            self.export()
        if observation.served_fast:
            _remember(self._inputs, observation.decision_id, key, _INPUT_MEMORY)
        if not (counted and observation.accepted and observation.served_fast
                and observation.answer is not None and self._answer is not None):
            return
        draw, alarm = watch.draw(observation.confidence)
        if alarm is not None:
            self.alarmed(alarm)
        if draw is not None:
            self.audits.submit(AuditJob(observation.policy_id, observation.decision_id,
                                        observation.answer, observation.request,
                                        caller=observation.caller, ticket=draw.ticket,
                                        probability=draw.probability))

    async def labelled(self, label: Label) -> None:
        """A trusted label of a served fast answer, counted once per decision (the first label
        wins) and once per input (a label of an input labelled before is logged only)."""
        watch = self.watches.get(label.policy_id or "")
        if (watch is None or not label.served_fast
                or not self._first_label(label.decision_id, label.source)):
            return
        self._label(watch, label.correct, self._inputs.get(label.decision_id))

    # -- alarms: raised, restored, shared, cleared ------------------------------------------

    def restore(self, records: Iterable[AlarmRecord]) -> int:
        """Re-arm the alarms a decision log holds for policies loaded now, in log order: a clear
        record wins over the alarms before it. A broken cost promise is re-armed the same way
        (``CostChecks.restore``). Returns how many alarms were re-armed."""
        records = list(records)
        before = sum(len(w.alarms) for w in self.watches.values())
        for record in records:
            watch = self.watches.get(record.policy_id)
            if watch is None or record.kind == "cost":
                continue
            alarm = alarm_of(record)
            if alarm is None:
                watch.clear(record.time)
            else:
                watch.restore(alarm)
        costs = self.costs.restore(records, {p: w.cleared_at for p, w in self.watches.items()})
        self.export()
        return sum(len(w.alarms) for w in self.watches.values()) - before + costs

    def alarmed(self, alarm: Alarm, *, shared: bool = False) -> None:
        """An alarm raised here (posted to the board, if any) or latched from the board."""
        watch = self.watches[alarm.policy_id]
        logger.warning("ALARM %s on policy %s%s: %s; %s", alarm.kind, alarm.policy_id,
                       " (raised on another replica)" if shared else "", alarm.detail,
                       action_words(watch.gate, watch.settings.on_alarm))
        record = alarm_record(alarm, on_alarm=watch.settings.on_alarm, shared=shared)
        self._emit(record)
        if self._board is not None and not shared:
            self._spawn(self._board.post(record))
        self.export()

    def cost_alarmed(self, breach: CostBreach, *, shared: bool = False) -> None:
        """A broken cost promise found here (posted to the board, if any) or latched from the
        board: logged, and written to the decision log so a restart re-arms it."""
        record = self.costs.record(breach, shared=shared)
        logger.warning("COST ALARM on policy %s%s: %s (decision %d)", breach.policy_id,
                       " (raised on another replica)" if shared else "", breach.detail,
                       breach.decision)
        self._emit(record)
        if self._board is not None and not shared:
            self._spawn(self._board.post(record))

    def clear(self, policy_id: str, at: float, *, shared: bool = False,
              detail: str = CLEAR_DETAIL) -> bool:
        """An operator's clear of a policy's alarms raised before ``at`` (``slotgate alarms
        clear``, read from the board, or the operator page's ``detail``), a broken cost promise's
        included: logged, so a restart does not re-arm them."""
        watch = self.watches.get(policy_id)
        if watch is None or at <= watch.cleared_at:
            return False
        had = sorted(watch.alarms) + (["cost"] if self.costs.clear(policy_id, at) else [])
        watch.clear(at)
        logger.warning("policy %s: alarms cleared by an operator%s (%s); its decisions are "
                       "routed by the policy again", policy_id, " on another replica" if shared
                       else "", ", ".join(had) or "none standing here")
        self._emit(clear_record(policy_id, at, watch.n_decisions, shared=shared, detail=detail))
        self.export()
        return True

    def share(self, board: AlarmBoard, *, interval_s: float) -> None:
        """Post this replica's alarms to ``board`` and latch the others' every ``interval_s``
        (a task of the running loop, stopped by ``aclose``)."""
        self._board = board
        self._sync = asyncio.get_running_loop().create_task(self._sync_every(interval_s))

    async def sync_alarms(self) -> int:
        """One round with the board: clears first, then alarms of watched policies not standing
        here are latched, then alarms standing here that the board lost (Redis restarted empty,
        the key expired) are posted again, and so is the latest clear seen here: a replica that
        re-arms an alarm from its log and re-posts it must meet the clear that supersedes it.
        Broken cost promises (records of kind ``cost``) are latched and posted again alike.
        Returns how many alarms were latched."""
        if self._board is None:
            return 0
        records = await self._board.read(sorted(self.watches))
        if records is None:  # the board is failing: take nothing for lost
            return 0
        for record in records:
            if record.kind == "clear":
                self.clear(record.policy_id, record.time, shared=True)
        latched = 0
        present = set()
        for record in records:
            watch = self.watches.get(record.policy_id)
            alarm = alarm_of(record)
            if watch is None or alarm is None:
                continue
            present.add((watch.policy_id, alarm.kind))
            if watch.restore(alarm):
                self.alarmed(alarm, shared=True)
                latched += 1
        shared_clears = {r.policy_id: r.time for r in records if r.kind == "clear"}
        for watch in self.watches.values():
            for kind, alarm in watch.alarms.items():
                if (watch.policy_id, kind) not in present:
                    await self._board.post(alarm_record(alarm, on_alarm=watch.settings.on_alarm))
            if watch.cleared_at > shared_clears.get(watch.policy_id, -math.inf):
                await self._board.post(clear_record(watch.policy_id, watch.cleared_at,
                                                     watch.n_decisions))
        return latched + await self._sync_costs(records)

    async def _sync_costs(self, records: Sequence[AlarmRecord]) -> int:
        """``sync_alarms``' round for broken cost promises, after the clears: latch those not
        standing here, post again those standing here that the board lost."""
        assert self._board is not None
        latched = 0
        for record in records:
            watch = self.watches.get(record.policy_id)
            breach = None if watch is None else self.costs.latch(record, watch.cleared_at)
            if breach is not None:
                self.cost_alarmed(breach, shared=True)
                latched += 1
        on_board = {record.policy_id for record in records if record.kind == "cost"}
        for record in self.costs.standing():
            if record.policy_id not in on_board:
                await self._board.post(record)
        return latched

    async def _sync_every(self, interval_s: float) -> None:
        # Stopped by an event between rounds, never cancelled inside one: redis-py's asyncio
        # client can hang when a command is cancelled half-way (seen in the shared-alarm tests).
        while True:
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=interval_s)
                return
            except TimeoutError:
                await self.sync_alarms()

    # -- state, export, shutdown ------------------------------------------------------------

    def reports(self) -> list[dict[str, Any]]:
        """Every watch's ``PolicyWatch.report``, for the gauges."""
        return [watch.report() for watch in self.watches.values()]

    def export(self) -> None:
        if self.metrics is not None:
            for state in self.reports():
                self.metrics.policy_state(state)

    async def aclose(self) -> None:
        if self._checkpoints is not None:
            await self._checkpoints.stop()
        if self._sync is not None:
            self._stop.set()
            try:  # a round in flight ends within the board's timeouts
                await asyncio.wait_for(asyncio.shield(self._sync), timeout=5.0)
            except TimeoutError:
                self._sync.cancel()
                await asyncio.gather(self._sync, return_exceptions=True)
        await self.audits.aclose()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._checkpoints is not None:  # after the last audits' labels
            self._checkpoints.close()
            self._checkpoints = None

    # -- evidence that outlives the process ------------------------------------------------

    def keep_checkpoints(self, path: Path, *, every_s: float = CHECKPOINT_EVERY_S) -> int:
        """Claim the checkpoint at ``path`` (``CheckpointInUse`` when another process holds
        it), resume each watch and cost check from it, then write one there every ``every_s``
        seconds and at shutdown (a task of the running loop). Returns how many watches
        resumed."""
        self._checkpoints = Checkpoints.open(path, self.watches, self.costs)
        resumed = self._checkpoints.resume()
        self.export()
        self._checkpoints.start(every_s)
        return resumed

    async def _audit_answer(self, job: AuditJob) -> str:
        assert self._answer is not None
        return await self._answer(job.request)

    async def _audit_label(self, job: AuditJob, label: str) -> None:
        correct = label == job.answer
        watch = self.watches.get(job.policy_id)  # None: the policy was retired meanwhile
        if watch is not None:  # a decision a trusted label judged already: its audit counts none
            first = self._first_label(job.decision_id, "audit")
            alarm = watch.audited(job.ticket, correct if first else None,
                                  key=input_key(job.request))
            if alarm is not None:
                self.alarmed(alarm)
        if self._events is not None:
            await self._events({"type": "audit", "decision_id": job.decision_id,
                                "policy_id": job.policy_id, "label": label,
                                "answer": job.answer, "correct": correct,
                                "probability": job.probability})

    def _audit_lost(self, job: AuditJob) -> None:
        """An audit capped, dropped or failed: its decision is bet on as one whose label never
        came (counted right: the weighted test stays valid)."""
        watch = self.watches.get(job.policy_id)
        if watch is not None:
            alarm = watch.audited(job.ticket, None)
            if alarm is not None:
                self.alarmed(alarm)

    def _label(self, watch: PolicyWatch, correct: bool, key: str | None) -> None:
        alarm = watch.label(correct, key=key)
        if alarm is not None:
            self.alarmed(alarm)

    def _audit_counted(self, policy_id: str, result: str) -> None:
        """An audit done, dropped or failed: the events that start and end a shortage of
        audits. Under ``audit_then_escalate`` while traffic is suspect (a drift alarm stands or
        the traffic detector tripped), audits are the evidence: one dropped or failed while the
        queue is more than a quarter full switches the policy to escalating (logged, in the
        gate's reason), and an audit leaving a queue at most a quarter full switches it back,
        so no accepted answer goes unaudited and unescalated while the promise is in doubt. A
        failure with the queue at most a quarter full changes nothing: the next accepted
        decision is drawn for an audit again, and escalating to a slow model that is failing
        would buy no evidence."""
        if self.metrics is not None:
            self.metrics.audit(policy_id, result)
        watch = self.watches.get(policy_id)
        if watch is None:
            return
        backlog = self.audits.pending > self.audits.capacity // 4
        if (result in ("dropped", "failed") and backlog and not watch.audits_short and watch.suspect
                and watch.settings.on_alarm == "audit_then_escalate"):
            watch.audits_short = True
            logger.warning("policy %s: an audit was %s while %s: its accepted decisions "
                           "escalate until audits keep up again", policy_id, result,
                           "its drift alarm stands" if "drift" in watch.alarms
                           else "its traffic detector has tripped")
            self.export()
        elif watch.audits_short and not backlog:
            watch.audits_short = False  # the ladder gets its labels again
            logger.warning("policy %s: audits keep up again; its accepted decisions are served "
                           "and audited", policy_id)
            self.export()

    def _first_label(self, decision_id: str, source: str) -> bool:
        """The first label of a decision counts; a human label that comes later is only logged
        (it still wins in exports: ``router.store.log_join``)."""
        if decision_id in self._labelled:
            return False
        self._labelled[decision_id] = source
        while len(self._labelled) > _LABELLED_MEMORY:
            self._labelled.popitem(last=False)
        return True

    def _emit(self, record: AlarmRecord | dict[str, Any]) -> None:
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

    async def _write(self, record: AlarmRecord | dict[str, Any]) -> None:
        assert self._events is not None
        try:
            await self._events(record)
        except OSError as exc:
            logger.warning("monitoring record not written to the decision log: %s", exc)


def _remember(memory: OrderedDict[str, str], key: str, value: str, limit: int) -> None:
    memory[key] = value
    memory.move_to_end(key)
    while len(memory) > limit:
        memory.popitem(last=False)
