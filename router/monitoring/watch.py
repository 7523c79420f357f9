"""One tuned policy watched in production: its one-sided drift martingale on accepted decisions'
confidences (label-free), its traffic detector on every decision's (buys audits), its accuracy
tests (audits drawn by risk and weighted back, ``router.monitoring.weighted``; trusted labels),
the live accept share, the alarms they raise and the action those alarms call for
(``on_alarm``). No I/O: the Monitor feeds it, checkpoints its evidence (``state``/``resume``)
and decides what to log, share and export. Alarm and WatchSettings (``watch_settings``), a
watch's vocabulary, are imported from here too."""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque
from typing import Any

from calibration.monitoring import (
    TRAFFIC_BETS,
    AccuracySequence,
    AccuracyShortfallTest,
    Bounds,
    ConfidenceDropDetector,
    ConfidenceDropTest,
)
from calibration.state import DamagedState, count, field, number_value, optional_count
from router.monitoring.caller_evidence import CALLER_EVIDENCE_SHARE, CallerEvidence
from router.monitoring.ladder import AlarmKind, Gate, WatchSnapshot, ladder
from router.monitoring.sections import at_most, section
from router.monitoring.watch_settings import Alarm, WatchSettings
from router.monitoring.weighted import TRUSTED_SHARE, Draw, WeightedWatch

__all__ = ["ACCEPT_WINDOW", "CLOCK_SKEW_S", "DEDUPE_MAX_KEYS", "DEDUPE_WINDOW_S",
           "FALSE_ALARM_HORIZON", "STATE_VERSION", "Alarm", "PolicyWatch", "WatchSettings"]

ACCEPT_WINDOW = 1000  # decisions behind the live accept share
# Identical inputs (``router.monitoring.fingerprint``: templated ids and names folded) count once
# per window: one day, or the last 65,536 distinct inputs per policy (a few MiB), whichever
# forgets first. A repeat inside it is the same read of the same question (the read cache serves
# it), so it is no new evidence about the traffic; a second label of it is no new evidence
# about accuracy either.
DEDUPE_WINDOW_S = 86_400.0
DEDUPE_MAX_KEYS = 65_536
STATE_VERSION = 4  # of ``PolicyWatch.state()``
# An operator's clear saved with a time this far ahead of the clock is damage, not skew: a
# clear in the future would silence every alarm raised until then.
CLOCK_SKEW_S = 3600.0
# The traffic detector trips at an average run length to a false trip of
# FALSE_ALARM_HORIZON / (alarm_alpha / 2) ranked inputs: a false trip within the first
# FALSE_ALARM_HORIZON inputs it ranks has probability at most alarm_alpha / 2 (100,000 and
# 0.025 at alpha 0.05). It bets ``calibration.monitoring.TRAFFIC_BETS`` under every action.
# The alarms (drift, accuracy) stay test martingales: as detectors, bursts of one intent
# raised them (bench.watch, docs/monitoring.md).
FALSE_ALARM_HORIZON = 2_500


class PolicyWatch:
    """The drift and accuracy alarms share ``alarm_alpha`` equally, so together they raise a
    false alarm with probability at most ``alarm_alpha`` while traffic looks like the tuning
    rows (or is surer than them) and the policy keeps its promise.

    The accuracy alarm's half is split between three betting tests (a union bound):
    ``weighted.whole`` (``3 alarm_alpha / 8``), on every auditable accepted decision since the
    watch started, its audits drawn by risk and weighted back (``router.monitoring.weighted``);
    ``weighted.suspect`` (``alarm_alpha / 16``), the same started afresh, with stakes for larger
    breaks, when the traffic detector first trips or the drift alarm is raised (a stopping
    time, so a test martingale from there), owing nothing to the right answers audited before;
    ``shortfall`` (``alarm_alpha / 16``), a per-label test on trusted labels only (clients' with
    the trusted role): a label the watch did not draw has no known draw probability, so it
    cannot be weighted, and audit labels drawn by risk are no uniform sample for a per-label
    test. The label-free tests say when to start counting, the labels decide. The gauge
    (``accuracy``) is the weighted estimate of accepted accuracy; ``trusted`` the trusted
    labels' own.

    The drift test ranks only accepted decisions, against the tuning rows the policy accepted:
    what the promise covers. Decisions under the bar escalate and put no wrong fast answer in
    front of anyone, so unsure traffic (a burst of one hard question, a campaign of distinct
    unsure messages) is no evidence against the promise and cannot raise it; a novel class
    still does, through its answers that clear the bar less surely than the tuning rows did.

    The traffic test ranks every decision against every tuning row, bet by a change detector
    (average run length to a false trip ``detector_arl``, ``TRAFFIC_BETS``); it is no alarm
    (unsure traffic, a client's included, trips it): it buys audits and starts
    ``suspect_shortfall``.

    What the alarms do (``on_alarm``) is ``router.monitoring.ladder.ladder`` of ``snapshot()``
    (``gate``)."""

    def __init__(self, settings: WatchSettings, *, dedupe_window_s: float = DEDUPE_WINDOW_S,
                 dedupe_max_keys: int = DEDUPE_MAX_KEYS) -> None:
        self.settings = settings
        self.alarms: dict[AlarmKind, Alarm] = {}
        self.cleared_at = -math.inf  # alarms raised before an operator's clear stay cleared
        self.n_decisions = 0
        self.n_counted = 0  # distinct inputs (identical inputs once per window)
        self.n_accepted = 0
        # Audits could not be had (queue full, slow model failing) while traffic is suspect (a
        # drift alarm stands or the traffic detector tripped): under audit_then_escalate the
        # policy's accepted decisions escalate until the audit queue drains (the Monitor sets
        # and clears it as audits leave the queue).
        self.audits_short = False
        self.suspect_from: int | None = None  # the decision count when traffic turned suspect
        self._recent: deque[bool] = deque(maxlen=ACCEPT_WINDOW)
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._labelled: OrderedDict[str, float] = OrderedDict()  # inputs already labelled
        self._dedupe_window_s = dedupe_window_s
        self._dedupe_max_keys = dedupe_max_keys
        self.weighted = self._new_weighted()
        self._start_tests()

    def _new_weighted(self, first_ticket: int = 0) -> WeightedWatch:
        settings = self.settings
        return WeightedWatch(target=settings.target_accuracy, alpha=settings.alarm_alpha,
                             reference=settings.accepted_reference,
                             seed=f"{settings.seed}:{settings.policy_id}",
                             first_ticket=first_ticket)

    def _start_tests(self) -> None:
        half = self.settings.alarm_alpha / 2.0
        reference = self.settings.accepted_reference
        self.drift = (None if reference is None else
                      ConfidenceDropTest(reference, alpha=half, seed=self.settings.seed))
        self.trusted = AccuracySequence(alpha=half)  # the trusted labels' interval
        self.shortfall = AccuracyShortfallTest(self.settings.target_accuracy,
                                               alpha=TRUSTED_SHARE * self.settings.alarm_alpha)
        self.weighted.restart()
        self.suspect_from = None
        # Every decision against every tuning row: unsure traffic, accepted or not. Not an
        # alarm (a client's unsure messages can trip it): it buys audits (escalate_all:
        # escalates), which is how a novel class mostly under the bar reaches the accuracy alarm.
        self.traffic = (None if self.settings.reference is None else ConfidenceDropDetector(
            self.settings.reference, arl=self.detector_arl, seed=self.settings.seed + 1,
            bets=TRAFFIC_BETS))
        self.traffic_tripped_at: int | None = None  # the decision count when it tripped
        # No caller supplies more than CALLER_EVIDENCE_SHARE of the trip level's log a day.
        self.callers = (None if self.traffic is None else CallerEvidence(
            len(self.traffic.bets), cap=CALLER_EVIDENCE_SHARE * self.traffic.threshold))

    def _suspect(self) -> None:
        """The traffic detector tripped or the drift alarm was raised: start the weighted test
        that counts decisions from now on (once; an operator's clear restarts every test)."""
        if self.weighted.suspect is None:
            self.weighted.start_suspect()
            self.suspect_from = self.n_decisions

    @property
    def detector_arl(self) -> float:
        """The traffic detector's trip level: its average run length to a false trip, in ranked
        inputs (``FALSE_ALARM_HORIZON``)."""
        return FALSE_ALARM_HORIZON / (self.settings.alarm_alpha / 2.0)

    @property
    def policy_id(self) -> str:
        return self.settings.policy_id

    @property
    def alarm(self) -> Alarm | None:
        """The gravest standing alarm (accuracy before drift), None when there is none."""
        return self.alarms.get("accuracy") or self.alarms.get("drift")

    def snapshot(self) -> WatchSnapshot:
        """The facts the ladder acts on (``router.monitoring.ladder``)."""
        settings = self.settings
        return WatchSnapshot(
            policy_id=self.policy_id, on_alarm=settings.on_alarm, alarms=frozenset(self.alarms),
            traffic_tripped=self.traffic_tripped, audits_short=self.audits_short,
            audit_rate=settings.audit_rate, audit_boost=settings.audit_boost)

    @property
    def gate(self) -> Gate:
        """What the ladder does with this policy's decisions now."""
        return ladder(self.snapshot())

    @property
    def suspect(self) -> bool:
        """Traffic is suspect: a drift alarm stands or the traffic detector tripped. Under
        ``audit_then_escalate`` its audits are then the evidence the ladder waits for."""
        return "drift" in self.alarms or self.traffic_tripped

    @property
    def traffic_tripped(self) -> bool:
        """Traffic as a whole is less sure than the tuning rows (the traffic detector reached
        ``detector_arl``; latched until an operator's clear)."""
        return self.traffic is not None and self.traffic.alarm

    @property
    def audit_rate(self) -> float:
        """The audit rate now, as the ladder sets it (``ladder``)."""
        return self.gate.audit_rate

    @property
    def accept_share(self) -> float | None:
        """Accepted share of the last ``ACCEPT_WINDOW`` decisions (None before the first)."""
        return sum(self._recent) / len(self._recent) if self._recent else None

    def update_settings(self, settings: WatchSettings) -> None:
        """A reloaded file of the same policy (same id) and the same ``basis``: ``on_alarm``,
        ``audit_rate`` and ``audit_boost`` act from the next decision. The statistics keep
        running (another basis needs ``rebuilt``)."""
        if settings.basis != self.settings.basis:
            raise ValueError(f"policy {self.policy_id}: another watch basis "
                             f"({', '.join(settings.basis_changes(self.settings))}): rebuild it")
        self.settings = settings

    def rebuilt(self, settings: WatchSettings) -> PolicyWatch:
        """A fresh watch of the same policy on another ``basis`` (a reloaded file whose drift
        reference or alarm alpha changed, same policy id): both tests, the counts and the accept
        share start afresh on the new settings. Standing alarms stay latched (an operator clears
        them, ``slotgate alarms clear``; the decision log would re-arm them at a restart anyway),
        and so does the operator's last clear."""
        fresh = PolicyWatch(settings, dedupe_window_s=self._dedupe_window_s,
                            dedupe_max_keys=self._dedupe_max_keys)
        fresh.alarms = dict(self.alarms)
        fresh.cleared_at = self.cleared_at
        # Its tickets go on from this one's, so the labels of audits drawn here match nothing.
        fresh.weighted = fresh._new_weighted(self.weighted.next_ticket)
        return fresh

    def observe(self, confidence: float, *, accepted: bool, key: str | None = None,
                caller: str = "", now: float | None = None) -> Alarm | None:
        """``take``, returning only the alarm this decision raised (replays)."""
        return self.take(confidence, accepted=accepted, key=key, caller=caller, now=now)[1]

    def take(self, confidence: float, *, accepted: bool, key: str | None = None,
             caller: str = "", now: float | None = None) -> tuple[bool, Alarm | None]:
        """One decision with a fast read: its confidence (calibrated probability of the fast
        answer), whether the policy accepted it, its input's key (None: always new) and its
        caller (the API key's namespace; its share of the traffic detector's evidence is
        capped, ``CallerEvidence``). Returns whether it counted (a new input in the window)
        and the alarm it raised."""
        self.n_decisions += 1
        self.n_accepted += int(accepted)
        self._recent.append(accepted)
        if key is not None and not _first_sight(self._seen, key, self._window(now),
                                                self._dedupe_max_keys):
            return False, None
        self.n_counted += 1
        self._rank_traffic(min(1.0, max(0.0, confidence)), caller, now)
        if self.drift is None or not accepted:
            return True, None
        # Kept up to date after an alarm too, so the gauge and plots still show the evidence.
        if self.drift.update(min(1.0, max(0.0, confidence))) and "drift" not in self.alarms:
            self._suspect()
            return True, self._raise("drift", (
                f"the confidence-drop martingale reached {self.drift.log_value:.2f} (log) >= "
                f"log(1/{self.drift.alpha:g}) after {self.drift.n} distinct accepted inputs"))
        return True, None

    def _rank_traffic(self, confidence: float, caller: str, now: float | None) -> None:
        """The traffic detector takes the decision at the stakes its caller has left."""
        if self.traffic is None or self.callers is None:
            return
        most = self.callers.most(caller, self.traffic.n, now)
        if most is None:  # the caller's evidence is spent
            return
        self.callers.took(caller, self.traffic.take(confidence, most))
        if self.traffic.alarm and self.traffic_tripped_at is None:
            self.traffic_tripped_at = self.n_decisions
            self._suspect()

    def accuracy(self) -> Bounds:
        """The gauges' accepted accuracy, the weighted estimate (``WeightedAccuracy``)."""
        gauge = self.weighted.gauge
        return Bounds(0.0, 1.0, 0, None) if gauge is None else gauge.bounds()

    def draw(self, confidence: float, *, ticket: tuple[bool, float | None] | None = None
             ) -> tuple[Draw | None, Alarm | None]:
        """One counted accepted decision the monitor can audit, at the audit rate now (none
        while it is 0): whether to audit it (``ticket``: a replayed log's draw and probability),
        and an alarm its bet, or those of earlier ones it let through, raised."""
        rate = self.audit_rate
        if rate <= 0.0:
            return None, None
        drawn, probability = (None, None) if ticket is None else ticket
        taken = self.weighted.enter(confidence, rate, drawn=drawn, probability=probability)
        return taken, self._weighed()

    def audited(self, ticket: int, correct: bool | None, *, key: str | None = None,
                now: float | None = None) -> Alarm | None:
        """An audit's verdict on the drawn decision ``ticket`` of the input ``key`` (None:
        unknown), or None when it never came (dropped, capped, failed). A label of an input
        labelled before inside the dedupe window counts as none (one wrong answer repeated is
        one piece of evidence). Returns an alarm it raised."""
        if (correct is not None and key is not None
                and not _first_sight(self._labelled, key, self._window(now),
                                     self._dedupe_max_keys)):
            correct = None
        self.weighted.labelled(ticket, correct)
        return self._weighed()

    def _weighed(self) -> Alarm | None:
        test = self.weighted.tripped
        if test is None or "accuracy" in self.alarms:
            return None
        scope = ("" if test is self.weighted.whole else
                 f" since the traffic turned suspect at decision {self.suspect_from}")
        return self._raise("accuracy", (
            f"accepted accuracy is below the target {self.settings.target_accuracy}: the "
            f"weighted audits' betting test reached {test.log_value:.2f} (log) >= "
            f"log(1/{test.alpha:g}) after {test.n} audited decisions ({test.labels} "
            f"labels){scope}; weighted estimate {_fmt(self.accuracy().mean)}"))

    def label(self, correct: bool, *, key: str | None = None,
              now: float | None = None) -> Alarm | None:
        """One trusted label of an accepted decision of the input ``key`` (None: unknown,
        counted). A label of an input labelled before inside the dedupe window is not counted.
        Returns an alarm it raised."""
        if key is not None and not _first_sight(self._labelled, key, self._window(now),
                                                self._dedupe_max_keys):
            return None
        self.trusted.update(correct)
        if self.shortfall.update(correct) and "accuracy" not in self.alarms:
            test = self.shortfall
            return self._raise("accuracy", (
                f"accepted accuracy is below the target {self.settings.target_accuracy}: the "
                f"trusted labels' betting test reached {test.log_value:.2f} (log) >= "
                f"log(1/{test.alpha:g}) after {test.n} labels "
                f"({_fmt(self.trusted.bounds().mean)} of them right)"))
        return None

    def restore(self, alarm: Alarm) -> bool:
        """Re-arm an alarm read back from the log or latched from another replica; False when
        this kind already stands or an operator cleared the policy after it was raised."""
        if alarm.kind in self.alarms or alarm.time <= self.cleared_at:
            return False
        self.alarms[alarm.kind] = alarm
        if alarm.kind == "drift":
            self._suspect()
        return True

    def clear(self, at: float) -> bool:
        """An operator's clear at time ``at``: alarms raised before it go, and both tests start
        afresh (their bound holds again from here). False when it changed nothing."""
        if at <= self.cleared_at:
            return False
        self.cleared_at = at
        stale = [kind for kind, alarm in self.alarms.items() if alarm.time <= at]
        for kind in stale:
            del self.alarms[kind]
        if stale or self._tripped():
            self._start_tests()
        if not self.suspect:
            self.audits_short = False
        return bool(stale)

    def report(self) -> dict[str, Any]:
        """The watch's state for the gauges, the replay's series and ``slotgate monitor``."""
        bounds, trusted, weighted = self.accuracy(), self.trusted.bounds(), self.weighted
        alarm = self.alarm
        gate = self.gate
        return {
            "policy_id": self.policy_id,
            "decisions": self.n_decisions,
            "distinct_inputs": self.n_counted,
            "accepted": self.n_accepted,
            "accept_share": self.accept_share,
            "reference_accept_share": self.settings.reference_accept_share,
            "drift_test": self.drift is not None,
            "drift_log_martingale": None if self.drift is None else self.drift.log_value,
            # the traffic detector's log statistic (None before it ranked a decision)
            "traffic_log_martingale": (None if self.traffic is None or self.traffic.n == 0
                                       else self.traffic.log_value),
            "traffic_tripped_at": self.traffic_tripped_at,
            # decisions the traffic detector did not rank: their caller's evidence was spent
            "traffic_capped": None if self.callers is None else self.callers.capped,
            "traffic_spent_callers": None if self.callers is None else self.callers.spent(),
            "suspect_from": self.suspect_from,
            "suspect_labels": None if weighted.suspect is None else weighted.suspect.labels,
            # the weighted estimate's audit labels; lost: drawn decisions whose label never came
            "labels": bounds.n,
            "audits_lost": weighted.lost,
            "audits_overflowed": weighted.overflowed,
            "accuracy": bounds.mean,
            "accuracy_lower": bounds.lower,
            "accuracy_upper": bounds.upper,
            "trusted_labels": trusted.n,
            "trusted_accuracy": trusted.mean,
            "target_accuracy": self.settings.target_accuracy,
            "alarm": None if alarm is None else alarm.kind,
            "alarms": sorted(self.alarms),
            "alarm_detail": None if alarm is None else alarm.detail,
            "on_alarm": self.settings.on_alarm,
            "audit_rate": gate.audit_rate,
            "escalating": gate.escalate,
        }

    def state(self) -> dict[str, Any]:
        """The evidence so far, as plain JSON values, for ``resume`` in another process: every
        test's wealth, the ranked confidences, the counts, the accuracy sums and the audit
        design (``WeightedWatch.state``: audits still out count as labels lost). The dedupe
        windows are not kept: after a restart an input seen before counts once more."""
        return {"version": STATE_VERSION, "basis": self.settings.reference_id,
                "alpha": self.settings.alarm_alpha, "target": self.settings.target_accuracy,
                "decisions": self.n_decisions, "counted": self.n_counted,
                "accepted": self.n_accepted,
                "cleared_at": None if math.isinf(self.cleared_at) else self.cleared_at,
                "drift": None if self.drift is None else self.drift.state(),
                "traffic": None if self.traffic is None else self.traffic.state(),
                "traffic_tripped_at": self.traffic_tripped_at,
                "traffic_callers": None if self.callers is None else self.callers.state(),
                "suspect_from": self.suspect_from,
                "weighted": self.weighted.state(),
                "shortfall": self.shortfall.state(), "trusted": self.trusted.state()}

    def resume(self, state: dict[str, Any]) -> bool:
        """Continue from a ``state()`` of this policy's watch in an earlier process. False (and
        nothing taken) when it was gathered on another basis or format; raises
        ``DamagedState`` naming the field, and takes nothing, on one no run of this watch could
        have written (a count out of range or out of step with another, a NaN, a wealth past
        what its bets can reach)."""
        if (state.get("version") != STATE_VERSION
                or state.get("basis") != self.settings.reference_id
                or state.get("alpha") != self.settings.alarm_alpha
                or state.get("target") != self.settings.target_accuracy
                or (state.get("drift") is None) != (self.drift is None)
                or (state.get("traffic") is None) != (self.traffic is None)):
            return False
        counts = _resumed_counts(state)
        cleared_at = field(state, "cleared_at")
        if cleared_at is not None:
            cleared_at = number_value(cleared_at, "cleared_at", high=time.time() + CLOCK_SKEW_S)
        try:
            self._resume_tests(state, counts)
        except DamagedState:  # nothing half-taken
            self.weighted = self._new_weighted(self.weighted.next_ticket)
            self._start_tests()
            raise
        self.n_decisions, self.n_counted, self.n_accepted = counts
        if cleared_at is not None:
            self.cleared_at = max(self.cleared_at, cleared_at)
        return True

    def _resume_tests(self, state: dict[str, Any], counts: tuple[int, int, int]) -> None:
        decisions, counted, accepted = counts
        if self.drift is not None:
            section("drift", self.drift.resume, state)
            at_most("drift.n", self.drift.n, min(counted, accepted))
        if self.traffic is not None:
            section("traffic", self.traffic.resume, state)
            at_most("traffic.n", self.traffic.n, counted)
            tripped_at = optional_count(state, "traffic_tripped_at", low=1, high=decisions)
            if (tripped_at is not None) != self.traffic.alarm:
                raise DamagedState("traffic_tripped_at must be given exactly when the traffic "
                                   f"detector has tripped, got {tripped_at!r}")
            self.traffic_tripped_at = tripped_at
            callers = state.get("traffic_callers")  # absent in a checkpoint of an older version
            callers_of = self.callers
            if callers is not None and callers_of is not None:
                traffic = self.traffic
                section("traffic_callers",
                         lambda saved: callers_of.resume(saved, ranked=traffic.n), state)
        section("shortfall", self.shortfall.resume, state)
        section("trusted", self.trusted.resume, state)
        if self.trusted.n != self.shortfall.n:
            raise DamagedState(f"trusted.n must equal shortfall.n (every trusted label counts "
                               f"in both), got {self.trusted.n} and {self.shortfall.n}")
        suspect_from = optional_count(state, "suspect_from", high=decisions)
        section("weighted", self.weighted.resume, state)  # last: it takes all or nothing
        at_most("weighted.whole.n", self.weighted.whole.n, min(counted, accepted))
        if (suspect_from is None) != (self.weighted.suspect is None):
            raise DamagedState("suspect_from must be given exactly when weighted.suspect is, "
                               f"got {suspect_from!r}")
        self.suspect_from = suspect_from

    def _tripped(self) -> bool:
        return ((self.drift is not None and self.drift.alarm) or self.traffic_tripped
                or self.shortfall.alarm or self.weighted.tripped is not None
                or self.weighted.suspect is not None)

    def _window(self, now: float | None) -> tuple[float, float]:
        return (time.time() if now is None else now), self._dedupe_window_s

    def _raise(self, kind: AlarmKind, detail: str) -> Alarm:
        alarm = self.alarms[kind] = Alarm(self.policy_id, kind, self.n_decisions, time.time(),
                                          detail)
        return alarm


def _fmt(value: float | None) -> str:
    return "none" if value is None else f"{value:.3f}"


def _resumed_counts(state: dict[str, Any]) -> tuple[int, int, int]:
    """The decision counts of a saved watch: decisions, distinct inputs, accepted."""
    decisions = count(state, "decisions")
    return decisions, count(state, "counted", high=decisions), count(
        state, "accepted", high=decisions)


def _first_sight(seen: OrderedDict[str, float], key: str, window: tuple[float, float],
                 max_keys: int) -> bool:
    """Whether ``key`` is new in ``seen`` within the window (``now``, length in seconds); it
    is recorded either way, the oldest keys forgotten past ``max_keys``."""
    now, length_s = window
    last = seen.get(key)
    if last is not None and now - last < length_s:
        return False
    seen[key] = now
    seen.move_to_end(key)
    while len(seen) > max_keys:
        seen.popitem(last=False)
    return True
