"""The live check of a policy's promise on cost (``policies.file.CostPromiseRecord``), beside
its accuracy alarm: every decision the policy judges bets on whether its own verdict escalated
(``calibration.block_cost.SlowShareTest`` at the promise's ``live_cap``), and its fixed blocks
are counted. The alarm latches; what it does is the file's ``on_cost_alarm`` (the routing plan's
``CostAlarm``). ``CostChecks``: every loaded policy's check, as the monitor holds them."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from calibration.block_cost import SlowShareTest
from policies.file import OnCostAlarm
from router.routing.ports import CostAlarm

if TYPE_CHECKING:
    from router.store.metrics import Metrics

logger = logging.getLogger("slotgate.monitoring")


@dataclass(frozen=True, slots=True)
class CostBreach:
    """When and why the live check found a policy's cost promise broken (latched until the
    policy is re-tuned or the router restarts)."""

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
        """One decision the policy judged; the alarm when this one raised it (else None)."""
        raised_before = self.test.alarm
        self.test.update(escalated)
        self.n_escalated += escalated
        self._in_block += 1
        self._escalated_in_block += escalated
        if self._in_block == self.settings.block:
            self.blocks += 1
            self.blocks_over += self._escalated_in_block > self.settings.share * self.settings.block
            self._in_block = self._escalated_in_block = 0
        if raised_before or not self.test.alarm:
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


class CostChecks:
    """The cost check of every loaded policy tuned with a cost promise, per replica: kept
    across a reload of the same basis (taking the file's ``on_cost_alarm``), started afresh on
    another, dropped with the policy. A breach is logged and latched until an operator clears
    the policy's alarms (the check starts afresh: new evidence, its own alpha), the policy is
    re-tuned or the router restarts. Their gauges are read at each scrape of ``metrics``."""

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

    def clear(self, policy_id: str) -> bool:
        """An operator's clear: a broken promise's check starts afresh; True when one was."""
        check = self.checks.get(policy_id)
        if check is None or check.alarm is None:
            return False
        self.checks[policy_id] = CostWatch(check.settings)
        return True

    def retire_others(self, keep: Iterable[str]) -> None:
        kept = set(keep)
        self.checks = {p: check for p, check in self.checks.items() if p in kept}

    def decided(self, policy_id: str, *, accepted: bool) -> bool:
        """One decision's own verdict (not the alarm gate's: the promise is on what the tuned
        rule escalates); True when it found the promise broken."""
        check = self.checks.get(policy_id)
        if check is None:
            return False
        breach = check.take(not accepted)
        if breach is not None:
            logger.warning("policy %s: %s (decision %d)", breach.policy_id, breach.detail,
                           breach.decision)
        return breach is not None

    def alarm(self, policy_id: str) -> CostAlarm | None:
        check = self.checks.get(policy_id)
        if check is None or check.alarm is None:
            return None
        return CostAlarm(on_cost_alarm=check.settings.on_cost_alarm, detail=check.alarm.detail)

    def export(self) -> None:
        if self._metrics is not None:
            for check in self.checks.values():
                self._metrics.cost_state(check.report())
