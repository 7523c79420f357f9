"""The live check of a policy's promise on cost (``policies.file.CostPromiseRecord``), beside
its accuracy alarm: every decision the policy judges bets on whether its own verdict escalated
(``calibration.block_cost.SlowShareTest`` at the promise's ``live_cap``), and its fixed blocks
are counted. The alarm latches; what it does is the file's ``on_cost_alarm`` (the routing plan's
``CostAlarm``). ``CostChecks``: every loaded policy's check, as the monitor holds them: each
one's evidence goes into the watch checkpoint (``state``/``resume``, range-checked), and a
breach is shared between replicas as an ``AlarmRecord`` of kind ``cost``."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from calibration.block_cost import SlowShareTest
from calibration.state import DamagedState, count, field, number
from policies.file import OnCostAlarm
from router.monitoring.watch import CLOCK_SKEW_S
from router.routing.ports import CostAlarm
from router.store.records import AlarmRecord

if TYPE_CHECKING:
    from router.store.metrics import Metrics

logger = logging.getLogger("slotgate.monitoring")
COST_STATE_VERSION = 1  # of ``CostWatch.state()``
_BASIS_NAMES = ("share", "block", "live_cap", "alpha")  # ``CostSettings.basis``, in order


@dataclass(frozen=True, slots=True)
class CostBreach:
    """When and why the live check found a policy's cost promise broken, here or on another
    replica (latched until an operator clears the policy's alarms or it is re-tuned)."""

    policy_id: str
    decision: int  # the policy's decision count when it was found
    time: float
    detail: str


@dataclass(frozen=True, slots=True)
class CostSettings:
    """What a policy file says about its cost promise's live check: the promised share of each
    block of ``block`` decisions, the escalation probability past which the promise fails
    (``live_cap``), the test's false-alarm probability (the file's ``alarm_alpha``) and what an
    alarm does (``on_cost_alarm``)."""

    policy_id: str
    share: float
    block: int
    live_cap: float
    alpha: float
    on_cost_alarm: OnCostAlarm = "alert_only"

    @classmethod
    def of(cls, policy_file: Any) -> CostSettings | None:
        """The file's cost check (None: it was tuned without a cost promise)."""
        promise = policy_file.cost_promise
        if promise is None:
            return None
        return cls(policy_id=policy_file.policy_id, share=promise.share, block=promise.block,
                   live_cap=promise.live_cap, alpha=policy_file.alarm_alpha,
                   on_cost_alarm=policy_file.on_cost_alarm)

    @property
    def basis(self) -> tuple[float, int, float, float]:
        """What the evidence is gathered against; ``on_cost_alarm`` is not part of it."""
        return (self.share, self.block, self.live_cap, self.alpha)


class CostWatch:
    """One policy's cost check. ``take`` one decision (did the policy's own verdict escalate
    it?); the alarm is raised once, when the test's wealth reaches 1 / alpha: with probability at
    most alpha while each decision's escalation probability stays within ``live_cap``, where the
    promise holds. Blocks: decisions 1..block, block+1..2 block, ... each counted once full."""

    def __init__(self, settings: CostSettings) -> None:
        self.settings = settings
        self.test = SlowShareTest(settings.live_cap, alpha=settings.alpha)
        self.n_escalated = 0
        self.blocks = 0
        self.blocks_over = 0
        self._in_block = 0
        self._escalated_in_block = 0
        self.alarm: CostBreach | None = None

    @property
    def n_decisions(self) -> int:
        return self.test.n

    def take(self, escalated: bool, *, now: float | None = None) -> CostBreach | None:
        """One decision the policy judged; the alarm when this one raised it (else None: also
        when a breach latched from another replica or the log stands already)."""
        raised_before = self.test.alarm
        self.test.update(escalated)
        self.n_escalated += escalated
        self._in_block += 1
        self._escalated_in_block += escalated
        if self._in_block == self.settings.block:
            self.blocks += 1
            self.blocks_over += self._escalated_in_block > self.settings.share * self.settings.block
            self._in_block = self._escalated_in_block = 0
        if raised_before or not self.test.alarm or self.alarm is not None:
            return None
        self.alarm = CostBreach(
            self.settings.policy_id, self.test.n, time.time() if now is None else now,
            f"cost promise broken: {self.n_escalated} of {self.test.n} decisions escalated "
            f"({self.n_escalated / self.test.n:.3f}), evidence that the escalation probability "
            f"is above {self.settings.live_cap:.4f}, past which a block of "
            f"{self.settings.block} exceeds a slow share of {self.settings.share:g} too often "
            f"(test at alpha {self.settings.alpha:g}); on_cost_alarm: "
            f"{self.settings.on_cost_alarm}")
        return self.alarm

    def report(self) -> dict[str, Any]:
        """The check's state for the gauges."""
        return {"policy_id": self.settings.policy_id,
                "slow_share": self.n_escalated / self.test.n if self.test.n else None,
                "log_martingale": self.test.log_value, "blocks": self.blocks,
                "blocks_over": self.blocks_over, "alarm": self.alarm is not None}

    def state(self) -> dict[str, Any]:
        """The evidence so far, as plain JSON values, for ``resume`` in another process: the
        promise it is gathered against, the test's wealth, the counts, the block in progress and
        a standing breach."""
        alarm = self.alarm
        return {"version": COST_STATE_VERSION, **dict(zip(_BASIS_NAMES, self.settings.basis,
                                                          strict=True)),
                "test": self.test.state(), "escalated": self.n_escalated, "blocks": self.blocks,
                "blocks_over": self.blocks_over, "in_block": self._in_block,
                "escalated_in_block": self._escalated_in_block,
                "alarm": None if alarm is None else {
                    "decision": alarm.decision, "time": alarm.time, "detail": alarm.detail}}

    def basis_changes(self, state: Mapping[str, Any]) -> list[str]:
        """Why a saved state was gathered against something else: its format, or each setting
        of the cost promise (``CostSettings.basis``) that differs, saved -> now; [] when none."""
        if _differs(state.get("version"), COST_STATE_VERSION):
            return [f"format {state.get('version')!r} -> {COST_STATE_VERSION}"]
        return [f"{name} {state.get(name)!r} -> {value!r}" for name, value
                in zip(_BASIS_NAMES, self.settings.basis, strict=True)
                if _differs(state.get(name), value)]

    def resume(self, state: Mapping[str, Any]) -> None:
        """Continue from a ``state()`` of this check gathered against the same promise
        (``basis_changes`` is []): the wealth goes on compounding, so the alarm's bound holds
        over the whole stream. Raises ``DamagedState`` naming the field, and takes nothing, on
        a state no run of this check could have written (a count out of step with the test's,
        a block past the share without the escalations it needs, a breach in the future)."""
        test = SlowShareTest(self.settings.live_cap, alpha=self.settings.alpha)
        _section("test", test.resume, field(state, "test"))
        block, n = self.settings.block, test.n
        blocks, in_block = count(state, "blocks"), count(state, "in_block")
        if (blocks, in_block) != divmod(n, block):
            raise DamagedState(f"blocks and in_block must be {divmod(n, block)} (test.n {n} in "
                               f"blocks of {block}), got ({blocks}, {in_block})")
        blocks_over = count(state, "blocks_over", high=blocks)
        escalated_in_block = count(state, "escalated_in_block", high=in_block)
        # A block past the share held more than share * block escalations.
        low = escalated_in_block + blocks_over * (math.floor(self.settings.share * block) + 1)
        escalated = count(state, "escalated", low=low, high=escalated_in_block + blocks * block)
        alarm = _section("alarm", self._saved_breach, field(state, "alarm"))
        if alarm is None and test.alarm:
            raise DamagedState(f"alarm is null but test.alarm_at is {test.alarm_at}: the test "
                               "raised it")
        self.test, self.n_escalated, self.blocks, self.blocks_over = (
            test, escalated, blocks, blocks_over)
        self._in_block, self._escalated_in_block, self.alarm = (
            in_block, escalated_in_block, alarm)

    def _saved_breach(self, saved: Any) -> CostBreach | None:
        if saved is None:
            return None
        detail = field(saved, "detail")
        if not isinstance(detail, str) or not detail:
            raise DamagedState(f"detail must be a non-empty string, got {detail!r}")
        return CostBreach(self.settings.policy_id, count(saved, "decision"),
                          number(saved, "time", low=0.0, high=time.time() + CLOCK_SKEW_S),
                          detail)


class CostChecks:
    """The cost check of every loaded policy tuned with a cost promise, per replica: kept
    across a reload of the same basis (taking the file's ``on_cost_alarm``), started afresh on
    another, dropped with the policy. A breach is latched until an operator clears the policy's
    alarms (the check starts afresh: new evidence, its own alpha) or the policy is re-tuned;
    the Monitor logs it, writes it to the decision log and shares it (``record``, ``latch``),
    and checkpoints each check's evidence (``state``, ``resume``), so neither the breach nor
    the evidence ends with the process. Their gauges are read at each scrape of ``metrics``."""

    def __init__(self, metrics: Metrics | None = None) -> None:
        self.checks: dict[str, CostWatch] = {}
        self._metrics = metrics
        if metrics is not None:
            metrics.on_render(self.export)

    def watch(self, policy_file: Any) -> None:
        settings = CostSettings.of(policy_file)
        if settings is None:
            self.checks.pop(policy_file.policy_id, None)
            return
        check = self.checks.get(settings.policy_id)
        if check is not None and check.settings.basis == settings.basis:
            check.settings = settings
            return
        self.checks[settings.policy_id] = CostWatch(settings)

    def clear(self, policy_id: str, at: float) -> bool:
        """An operator's clear at time ``at``: a breach found before it ends and the check
        starts afresh; True when one did (a breach found after the clear stands)."""
        check = self.checks.get(policy_id)
        if check is None or check.alarm is None or check.alarm.time > at:
            return False
        self.checks[policy_id] = CostWatch(check.settings)
        return True

    def retire_others(self, keep: Iterable[str]) -> None:
        kept = set(keep)
        self.checks = {p: check for p, check in self.checks.items() if p in kept}

    def decided(self, policy_id: str, *, accepted: bool) -> CostBreach | None:
        """One decision's own verdict (not the alarm gate's: the promise is on what the tuned
        rule escalates); the breach when it found the promise broken."""
        check = self.checks.get(policy_id)
        return None if check is None else check.take(not accepted)

    def alarm(self, policy_id: str) -> CostAlarm | None:
        check = self.checks.get(policy_id)
        if check is None or check.alarm is None:
            return None
        return CostAlarm(on_cost_alarm=check.settings.on_cost_alarm, detail=check.alarm.detail)

    # -- shared and logged as alarm records (kind "cost") ---------------------------------

    def record(self, breach: CostBreach, *, shared: bool = False) -> AlarmRecord:
        """The breach as the decision log and the alarm board keep it (``on_alarm``: the
        file's ``on_cost_alarm``)."""
        check = self.checks.get(breach.policy_id)
        return AlarmRecord(policy_id=breach.policy_id, kind="cost", decision=breach.decision,
                           time=breach.time, detail=breach.detail, shared=shared,
                           on_alarm=None if check is None else check.settings.on_cost_alarm)

    def standing(self) -> Iterator[AlarmRecord]:
        """The record of every breach standing here (posted again where the board lost it)."""
        return (self.record(check.alarm) for check in self.checks.values()
                if check.alarm is not None)

    def latch(self, record: AlarmRecord, cleared_at: float) -> CostBreach | None:
        """Take a cost record read back from the log or the board: the breach, when it is now
        latched (None: no check of that policy, one stands already, or an operator cleared the
        policy at ``cleared_at`` or later). The check's evidence goes on."""
        check = self.checks.get(record.policy_id)
        if (record.kind != "cost" or check is None or check.alarm is not None
                or record.time <= cleared_at):
            return None
        check.alarm = CostBreach(record.policy_id, record.decision, record.time, record.detail)
        return check.alarm

    def restore(self, records: Sequence[AlarmRecord], cleared_at: Mapping[str, float]) -> int:
        """Re-arm the breaches a decision log holds (``records``, in log order), once the
        watches took its clears (``cleared_at``: each policy's latest clear). A checkpointed
        breach found before the latest clear ends; a logged one after it is latched. Returns
        how many were latched."""
        latest = dict(cleared_at)
        for record in records:
            if record.kind == "clear":
                latest[record.policy_id] = max(latest.get(record.policy_id, -math.inf),
                                               record.time)
        for policy_id, at in latest.items():
            self.clear(policy_id, at)
        return sum(self.latch(record, latest.get(record.policy_id, -math.inf)) is not None
                   for record in records)

    # -- evidence that outlives the process ------------------------------------------------

    def state(self) -> dict[str, dict[str, Any]]:
        """Every check's ``CostWatch.state``, by policy id (the checkpoint's ``cost`` entry)."""
        return {policy_id: check.state() for policy_id, check in self.checks.items()}

    def resume(self, saved: Any, path: Path) -> int:
        """Resume each check from its entry in ``saved`` (the checkpoint at ``path``'s ``cost``
        entry; None: a checkpoint written without it, and every check starts afresh). An entry
        gathered against another cost promise, or damaged, is not taken: one warning naming
        the file, the policy and why (the field, for damage), and that check starts afresh.
        Returns how many resumed."""
        if saved is None:
            return 0
        if not isinstance(saved, dict):
            logger.warning("watch checkpoint %s: cost must be a JSON object, got %s; the cost "
                           "checks start afresh", path, type(saved).__name__)
            return 0
        resumed = 0
        for policy_id, check in self.checks.items():
            state = saved.get(policy_id)
            if state is None:
                continue
            try:
                if not isinstance(state, dict):
                    raise DamagedState(f"the entry must be a JSON object, got "
                                       f"{type(state).__name__}")
                changes = check.basis_changes(state)
                if changes:
                    logger.warning("watch checkpoint %s: policy %s: its cost check was saved "
                                   "against another cost promise (%s); it starts afresh", path,
                                   policy_id, ", ".join(changes))
                    continue
                check.resume(state)
                resumed += 1
            except DamagedState as exc:
                logger.warning("watch checkpoint %s: policy %s: cost.%s; that cost check starts "
                               "afresh", path, policy_id, exc)
        return resumed

    def export(self) -> None:
        if self._metrics is not None:
            for check in self.checks.values():
                self._metrics.cost_state(check.report())


def _differs(saved: Any, value: object) -> bool:
    """A saved setting is not ``value`` (JSON's true is no 1)."""
    return isinstance(saved, bool) or saved != value


def _section(name: str, take: Callable[[Any], Any], saved: Any) -> Any:
    """``take(saved)``, its damage reported under ``name.``."""
    try:
        return take(saved)
    except DamagedState as exc:
        raise DamagedState(f"{name}.{exc}") from exc
