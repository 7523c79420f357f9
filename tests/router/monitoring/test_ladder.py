"""The ladder as a table: every on_alarm x traffic trip x drift alarm x accuracy alarm x audits
short case, with the gate's escalation, its reason and the audit rate; asking changes nothing;
a bad snapshot is refused naming its field."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from router.monitoring.ladder import AlarmKind, Gate, OnAlarm, WatchSnapshot, ladder

BASE, BOOST = 0.05, 0.75  # the file's audit rate and audit_boost in every row
ACCURACY = ("accuracy alarm: every decision escalates until the alarm is cleared (`slotgate "
            "alarms clear`) or a re-tuned policy is loaded")
DRIFT = ("drift alarm: every decision escalates until the alarm is cleared (`slotgate alarms "
         "clear`) or a re-tuned policy is loaded")
TRAFFIC = ("traffic less sure than the tuning rows (on_alarm: escalate_all): every decision "
           "escalates until an operator clears the policy (`slotgate alarms clear`) or a "
           "re-tuned policy is loaded")
SHORT = (" and too few audits (queue full or slow model failing): every decision escalates "
         "until audits keep up again, an operator clears the policy (`slotgate alarms clear`) "
         "or a re-tuned policy is loaded")
DRIFT_SHORT = "drift alarm" + SHORT
TRAFFIC_SHORT = "traffic less sure than the tuning rows" + SHORT

# on_alarm, tripped, drift, accuracy, audits short -> reason (None: served), audit rate
Row = tuple[OnAlarm, int, int, int, int, str | None, float]
ALERT_ONLY: list[Row] = [("alert_only", tripped, drift, accuracy, short, None, BASE)
                         for tripped, drift, accuracy, short
                         in itertools.product((0, 1), repeat=4)]
LADDER: list[Row] = [
    ("audit_then_escalate", 0, 0, 0, 0, None, BASE),
    ("audit_then_escalate", 0, 0, 0, 1, None, BASE),  # short but not suspect: nothing to wait for
    ("audit_then_escalate", 0, 0, 1, 0, ACCURACY, BASE),
    ("audit_then_escalate", 0, 0, 1, 1, ACCURACY, BASE),
    ("audit_then_escalate", 0, 1, 0, 0, None, BOOST),
    ("audit_then_escalate", 0, 1, 0, 1, DRIFT_SHORT, BOOST),
    ("audit_then_escalate", 0, 1, 1, 0, ACCURACY, BOOST),
    ("audit_then_escalate", 0, 1, 1, 1, ACCURACY, BOOST),
    ("audit_then_escalate", 1, 0, 0, 0, None, BOOST),
    ("audit_then_escalate", 1, 0, 0, 1, TRAFFIC_SHORT, BOOST),
    ("audit_then_escalate", 1, 0, 1, 0, ACCURACY, BOOST),
    ("audit_then_escalate", 1, 0, 1, 1, ACCURACY, BOOST),
    ("audit_then_escalate", 1, 1, 0, 0, None, BOOST),
    ("audit_then_escalate", 1, 1, 0, 1, DRIFT_SHORT, BOOST),
    ("audit_then_escalate", 1, 1, 1, 0, ACCURACY, BOOST),
    ("audit_then_escalate", 1, 1, 1, 1, ACCURACY, BOOST),
    ("escalate_all", 0, 0, 0, 0, None, BASE),
    ("escalate_all", 0, 0, 0, 1, None, BASE),
    ("escalate_all", 0, 0, 1, 0, ACCURACY, BASE),
    ("escalate_all", 0, 0, 1, 1, ACCURACY, BASE),
    ("escalate_all", 0, 1, 0, 0, DRIFT, BASE),
    ("escalate_all", 0, 1, 0, 1, DRIFT, BASE),
    ("escalate_all", 0, 1, 1, 0, ACCURACY, BASE),
    ("escalate_all", 0, 1, 1, 1, ACCURACY, BASE),
    ("escalate_all", 1, 0, 0, 0, TRAFFIC, BOOST),
    ("escalate_all", 1, 0, 0, 1, TRAFFIC, BOOST),
    ("escalate_all", 1, 0, 1, 0, ACCURACY, BOOST),
    ("escalate_all", 1, 0, 1, 1, ACCURACY, BOOST),
    ("escalate_all", 1, 1, 0, 0, DRIFT, BOOST),
    ("escalate_all", 1, 1, 0, 1, DRIFT, BOOST),
    ("escalate_all", 1, 1, 1, 0, ACCURACY, BOOST),
    ("escalate_all", 1, 1, 1, 1, ACCURACY, BOOST),
    *ALERT_ONLY,
]


def snapshot(on_alarm: OnAlarm, tripped: int = 0, drift: int = 0, accuracy: int = 0,
             short: int = 0, **overrides: Any) -> WatchSnapshot:
    kinds: set[AlarmKind] = {"drift"} if drift else set()
    if accuracy:
        kinds.add("accuracy")
    fields: dict[str, Any] = {
        "policy_id": "p", "on_alarm": on_alarm, "alarms": frozenset(kinds),
        "traffic_tripped": bool(tripped), "audits_short": bool(short), "audit_rate": BASE,
        "audit_boost": BOOST}
    return WatchSnapshot(**(fields | overrides))


def test_the_table_covers_every_case_once() -> None:
    cases = [row[:5] for row in LADDER]
    assert len(cases) == len(set(cases)) == 3 * 2 ** 4


@pytest.mark.parametrize(("on_alarm", "tripped", "drift", "accuracy", "short", "reason", "rate"),
                         LADDER)
def test_the_ladder(on_alarm: OnAlarm, tripped: int, drift: int, accuracy: int, short: int,
                    reason: str | None, rate: float) -> None:
    facts = snapshot(on_alarm, tripped, drift, accuracy, short)
    gate = ladder(facts)
    assert gate == Gate(escalate=reason is not None, reason=reason, audit_rate=rate)
    assert ladder(facts) == gate  # pure: asking again gives the same answer


def test_the_boost_never_lowers_the_files_audit_rate() -> None:
    facts = snapshot("audit_then_escalate", 1, 1, 0, 0, audit_rate=0.9, audit_boost=0.5)
    assert ladder(facts).audit_rate == 0.9


@pytest.mark.parametrize(("field", "value"), [
    ("on_alarm", "escalate"), ("alarms", frozenset({"clear"})), ("alarms", ["drift"]),
    ("audit_rate", 1.5),
    ("audit_boost", -0.1), ("audit_rate", float("nan")), ("audit_boost", "0.5")])
def test_a_bad_snapshot_is_refused_naming_the_field(field: str, value: Any) -> None:
    fields = {"on_alarm": "audit_then_escalate", field: value}
    with pytest.raises(ValueError, match=field):
        snapshot(**fields)


def test_a_gate_escalates_exactly_when_it_gives_a_reason() -> None:
    with pytest.raises(ValueError, match="reason"):
        Gate(escalate=True, reason=None, audit_rate=0.0)
    with pytest.raises(ValueError, match="reason"):
        Gate(escalate=False, reason="why", audit_rate=0.0)
    with pytest.raises(ValueError, match="audit_rate"):
        Gate(escalate=False, reason=None, audit_rate=2.0)
