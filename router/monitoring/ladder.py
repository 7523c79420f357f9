"""What a policy's alarms do (``on_alarm``), decided in one pure function: ``ladder`` maps the
facts a watch holds (``WatchSnapshot``) to a ``Gate``: whether every decision the policy would
accept escalates, why, and the audit rate to draw at. No state, no I/O: the watch and the
monitor ask it, the monitor logs and exports what it says."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

AlarmKind = Literal["drift", "accuracy"]
OnAlarm = Literal["audit_then_escalate", "escalate_all", "alert_only"]
_ON_ALARMS, _KINDS = get_args(OnAlarm), frozenset(get_args(AlarmKind))

# The gate's reasons, as a reply, a log line and a test read them.
_UNTIL_AUDITS = ("every decision escalates until audits keep up again, an operator clears the "
                 "policy (`slotgate alarms clear`) or a re-tuned policy is loaded")
_TOO_FEW_AUDITS = "and too few audits (queue full or slow model failing): " + _UNTIL_AUDITS
_TRAFFIC = "traffic less sure than the tuning rows"


@dataclass(frozen=True, slots=True)
class WatchSnapshot:
    """The facts about one watched policy that decide its action: the policy file's
    ``on_alarm``, ``audit_rate`` and ``audit_boost``, the alarms standing (``drift``,
    ``accuracy``), whether the traffic detector has tripped, and whether audits could not be
    had while traffic was suspect (``audits_short``: set by a dropped or failed audit, cleared
    when the audit queue drains)."""

    policy_id: str
    on_alarm: OnAlarm
    alarms: frozenset[AlarmKind] = frozenset()
    traffic_tripped: bool = False
    audits_short: bool = False
    audit_rate: float = 0.0  # the policy file's
    audit_boost: float = 0.0  # the rate while traffic is suspect (see ``ladder``)

    def __post_init__(self) -> None:
        if self.on_alarm not in _ON_ALARMS:
            raise ValueError(f"on_alarm must be one of {', '.join(_ON_ALARMS)}, "
                             f"got {self.on_alarm!r}")
        if not (isinstance(self.alarms, frozenset) and self.alarms <= _KINDS):
            raise ValueError(f"alarms must be a frozenset of drift and accuracy, got "
                             f"{self.alarms!r}")
        _check_rate("audit_rate", self.audit_rate)
        _check_rate("audit_boost", self.audit_boost)

    @property
    def suspect(self) -> bool:
        """Traffic is suspect: a drift alarm stands or the traffic detector tripped. Under
        ``audit_then_escalate`` its audits are then the evidence the ladder waits for."""
        return "drift" in self.alarms or self.traffic_tripped

    @property
    def gravest(self) -> AlarmKind | None:
        """The gravest standing alarm (accuracy before drift), None when there is none."""
        return ("accuracy" if "accuracy" in self.alarms
                else "drift" if "drift" in self.alarms else None)


@dataclass(frozen=True, slots=True)
class Gate:
    """What a policy's decisions get now: ``escalate`` every one it would accept (``reason``
    says why, for the reply and the log; None while its verdicts stand), and the share of its
    accepted decisions to audit."""

    escalate: bool
    reason: str | None
    audit_rate: float

    def __post_init__(self) -> None:
        if self.escalate != (self.reason is not None):
            raise ValueError(f"reason must be given exactly when escalate is true, got "
                             f"escalate={self.escalate!r} and reason={self.reason!r}")
        _check_rate("audit_rate", self.audit_rate)


def _check_rate(name: str, value: object) -> None:
    if not (isinstance(value, int | float) and 0.0 <= value <= 1.0):  # NaN fails the range
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")


def ladder(snapshot: WatchSnapshot) -> Gate:
    """The action of ``snapshot.on_alarm`` on the facts in ``snapshot``:

    - ``audit_then_escalate`` (default): a drift alarm or the traffic detector's trip raises
      the audit rate to ``audit_boost``; the accuracy alarm escalates, and so does suspect
      traffic while audits cannot be had (``audits_short``);
    - ``escalate_all``: either alarm or the trip escalates; the trip raises the audit rate too;
    - ``alert_only``: never acts (the file's audit rate, no escalation)."""
    return Gate(*_escalation(snapshot), audit_rate=_audit_rate(snapshot))


def _escalation(snapshot: WatchSnapshot) -> tuple[bool, str | None]:
    gravest = snapshot.gravest
    if snapshot.on_alarm == "escalate_all":
        if gravest is not None:
            return True, _alarm_reason(gravest)
        if snapshot.traffic_tripped:
            return True, (f"{_TRAFFIC} (on_alarm: escalate_all): every decision escalates until "
                          "an operator clears the policy (`slotgate alarms clear`) or a "
                          "re-tuned policy is loaded")
        return False, None
    if snapshot.on_alarm == "audit_then_escalate":
        if gravest == "accuracy":
            return True, _alarm_reason(gravest)
        if snapshot.audits_short and snapshot.suspect:
            why = "drift alarm" if gravest == "drift" else _TRAFFIC
            return True, f"{why} {_TOO_FEW_AUDITS}"
    return False, None


def _alarm_reason(kind: AlarmKind) -> str:
    return (f"{kind} alarm: every decision escalates until the alarm is cleared "
            "(`slotgate alarms clear`) or a re-tuned policy is loaded")


def _audit_rate(snapshot: WatchSnapshot) -> float:
    on_alarm = snapshot.on_alarm
    if (on_alarm != "alert_only" and snapshot.traffic_tripped) or (
            on_alarm == "audit_then_escalate" and "drift" in snapshot.alarms):
        return max(snapshot.audit_rate, snapshot.audit_boost)
    return snapshot.audit_rate


def state_word(snapshot: WatchSnapshot) -> str:
    """The watch in one word, as each decision's receipt states it: "alarmed" (an accuracy alarm
    stands), "suspect" (a drift alarm, or traffic less sure than the tuning rows), "clear"."""
    return ("alarmed" if "accuracy" in snapshot.alarms
            else "suspect" if snapshot.suspect else "clear")


def action_words(gate: Gate, on_alarm: str) -> str:
    """What an alarm makes the policy do, as its warning says it."""
    if gate.escalate:
        return "escalating every decision it would accept until cleared or re-tuned"
    if on_alarm == "audit_then_escalate":
        return (f"audit rate raised to {gate.audit_rate:g}; its accepted decisions escalate "
                "once the audits show accuracy below the target")
    return "alert only (on_alarm: alert_only)"
