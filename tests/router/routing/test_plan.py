"""The plan of one decision, as a table: the read, the policy's verdict, the mode (shadow,
``policy.unscoped``, serving unverified on failure), an alarm's gate and the scope in; what is
served, what a failed slow path leads to, and the notes out."""

from __future__ import annotations

from typing import Any

import pytest

from policies.scope import UnscopedMode
from policies.types import OptionScores, Verdict
from router.routing.plan import Mode, Scope, judged_scores, plan, span_plan
from router.routing.ports import NOT_READ, FastRead

SCORES = OptionScores(("yes", "no"), (0.97, 0.03))
READ = FastRead(SCORES, cached=False)
FAILED = FastRead(None, cached=False, failure="fast backend failed (BackendTimeout: slow)")
DOUBTED = FastRead(SCORES, cached=True, failure="no fast read fits: the server diverged")
ACCEPT = Verdict(True, 0, 0.97, 0.9, "p 0.970 >= threshold 0.900")
REJECT = Verdict(False, 0, 0.97, 0.99, "p 0.970 < threshold 0.990")
GATE = "drift alarm: accepted answers escalate (on_alarm: escalate_all)"

# (case, read, verdict, mode, gate, covered) -> expected Plan fields (and note fragments)
CASES: list[tuple[str, FastRead, Verdict | None, dict[str, Any], str | None, bool,
                  dict[str, Any]]] = [
    ("accepted is served fast", READ, ACCEPT, {}, None, True,
     {"action": "fast", "accepted": True, "verdict": ACCEPT, "note": None}),
    ("below the bar escalates; a failed slow path refuses", READ, REJECT, {}, None, True,
     {"action": "escalate", "fallback": "refuse", "accepted": False, "error_note": None}),
    ("below the bar, unverified on failure", READ, REJECT,
     {"serve_unverified_on_failure": True}, None, True,
     {"action": "escalate", "fallback": "unverified", "fallback_note": "below the threshold"}),
    ("an alarm's gate escalates an accepted answer", READ, ACCEPT, {}, GATE, True,
     {"action": "escalate", "accepted": True, "verdict.accept": False, "verdict.reason": GATE}),
    ("the gate leaves an escalation alone", READ, REJECT, {}, GATE, True,
     {"action": "escalate", "accepted": False, "verdict": REJECT}),
    ("shadow asks the slow model and says what the policy would have done", READ, ACCEPT,
     {"shadow": True}, None, True,
     {"action": "shadow", "accepted": True, "note": "would have accepted it",
      "fallback": "refuse"}),
    ("shadow, unverified on failure", READ, REJECT,
     {"shadow": True, "serve_unverified_on_failure": True}, None, True,
     {"action": "shadow", "fallback": "unverified", "note": "would have escalated it",
      "fallback_note": "in shadow mode"}),
    ("no read: the slow path, never unverified", FAILED, None,
     {"serve_unverified_on_failure": True}, None, True,
     {"action": "escalate", "fallback": "refuse", "verdict": None,
      "note": "(BackendTimeout: slow); answered by the slow path"}),
    ("no read in shadow mode", FAILED, None, {"shadow": True}, None, True,
     {"action": "shadow", "fallback": "refuse", "note": "answered by the slow path"}),
    ("unscoped escalate makes no read", NOT_READ, None, {"unscoped": "escalate"}, None, False,
     {"action": "escalate", "fallback": "refuse", "verdict": None,
      "note": "no fast read was made", "error_note": "policy.unscoped: escalate"}),
    ("unscoped escalate, unverified on failure", NOT_READ, None,
     {"unscoped": "escalate", "serve_unverified_on_failure": True}, None, False,
     {"action": "escalate", "fallback": "unverified",
      "fallback_note": "the fast answer was not verified"}),
    ("unscoped shadow logs the read, never serves it", READ, None,
     {"unscoped": "shadow", "serve_unverified_on_failure": True}, None, False,
     {"action": "shadow", "fallback": "refuse", "note": "the fast read answered 'yes'"}),
    ("server-wide shadow shadows an unscoped escalate", READ, None,
     {"unscoped": "escalate", "shadow": True}, None, False,
     {"action": "shadow", "note": "policy.unscoped: shadow"}),
    ("unscoped unverified serves the read marked so", READ, None, {"unscoped": "unverified"},
     None, False, {"action": "unverified", "note": "served unverified"}),
    ("unscoped unverified with a doubted read escalates", DOUBTED, None,
     {"unscoped": "unverified"}, None, False,
     {"action": "escalate", "note": "no fast read fits"}),
]


@pytest.mark.parametrize(("read", "verdict", "mode", "gate", "covered", "expected"),
                         [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_plan(read: FastRead, verdict: Verdict | None, mode: dict[str, Any], gate: str | None,
              covered: bool, expected: dict[str, Any]) -> None:
    unscoped: UnscopedMode = mode.get("unscoped", "escalate")
    planned = plan(read, verdict, Mode(shadow=mode.get("shadow", False), unscoped=unscoped,
                                       serve_unverified_on_failure=mode.get(
                                           "serve_unverified_on_failure", False)),
                   gate, Scope(covered=covered, question="'q' over 2 options (yes, no)"))
    for name, want in expected.items():
        got: Any = planned
        for part in name.split("."):
            got = getattr(got, part)
        if name.endswith("note") and isinstance(want, str):
            assert got is not None and want in got, (name, got)
        else:
            assert got == want, (name, got)
    if not covered:
        assert planned.verdict is None and "unscoped: no loaded policy" in str(planned.note)


def test_a_doubted_read_is_judged_only_in_shadow_mode() -> None:
    assert judged_scores(DOUBTED, shadow=False) is None
    assert judged_scores(DOUBTED, shadow=True) is SCORES
    assert judged_scores(READ, shadow=False) is SCORES


def test_span_plans_follow_policy_unscoped_and_never_promise() -> None:
    def mode(unscoped: Any, shadow: bool = False) -> Mode:
        return Mode(shadow=shadow, unscoped=unscoped, serve_unverified_on_failure=False,
                    fallback_threshold=0.8)

    assert span_plan(0.5, mode("unverified"), "q").action == "unverified"
    assert span_plan(0.9, mode("threshold"), "q").action == "fast"
    low = span_plan(0.5, mode("threshold"), "q")
    assert low.action == "escalate" and "0.500 < threshold 0.800" in (low.note or "")
    assert span_plan(0.9, mode("escalate"), "q").action == "escalate"
    assert span_plan(0.9, mode("threshold", shadow=True), "q").action == "shadow"
    no_read = span_plan(None, mode("unverified"), "q", "the fast tier reads no spans")
    assert no_read.action == "escalate" and no_read.fallback == "refuse"
    assert "the fast tier reads no spans" in (no_read.note or "")
