"""A broken cost promise in the routing plan: under serve_unverified the policy's own
escalations serve the fast answer marked unverified; alert_only changes nothing; an alarm's
gate, shadow mode, a missing read and an accepted answer are left as they were."""

from __future__ import annotations

import pytest

from policies.file import OnCostAlarm
from router.routing.plan import Mode, Plan, Scope, plan, receipt
from router.routing.ports import CostAlarm
from tests.router.routing.test_plan import ACCEPT, FAILED, GATE, READ, REJECT

MODE = Mode(shadow=False, unscoped="escalate", serve_unverified_on_failure=False)
COVERED = Scope(covered=True, question="q")


def broken(choice: OnCostAlarm) -> CostAlarm:
    return CostAlarm(on_cost_alarm=choice, detail="cost promise broken: 90 of 300 escalated")


def test_serve_unverified_serves_what_the_policy_would_escalate() -> None:
    planned = plan(READ, REJECT, MODE, None, COVERED, cost_alarm=broken("serve_unverified"))
    assert planned.action == "unverified" and not planned.accepted
    assert planned.note is not None and "served unverified, not escalated" in planned.note
    assert "90 of 300" in planned.note and "below the threshold" in planned.note
    assert receipt(planned, "unverified", None, tier=None, watch=None).guarantee is None


def test_alert_only_leaves_the_escalation() -> None:
    assert (plan(READ, REJECT, MODE, None, COVERED, cost_alarm=broken("alert_only"))
            == plan(READ, REJECT, MODE, None, COVERED))


@pytest.mark.parametrize(("case", "args"), [
    ("an alarm's gate still escalates", (READ, ACCEPT, MODE, GATE, COVERED)),
    ("an accepted answer is served as before", (READ, ACCEPT, MODE, None, COVERED)),
    ("shadow mode still asks the slow model",
     (READ, REJECT, Mode(shadow=True, unscoped="escalate", serve_unverified_on_failure=False),
      None, COVERED)),
    ("no read: only the slow path can answer", (FAILED, None, MODE, None, COVERED)),
    ("an unscoped decision follows policy.unscoped", (READ, None, MODE, None,
                                                      Scope(covered=False, question="q"))),
])
def test_serve_unverified_touches_only_the_policys_own_escalations(
        case: str, args: tuple[object, ...]) -> None:
    alone: Plan = plan(*args)  # type: ignore[arg-type]
    with_alarm: Plan = plan(*args, cost_alarm=broken("serve_unverified"))  # type: ignore[arg-type]
    assert with_alarm == alone, case


def test_the_cost_promise_acts_before_the_callers_budget() -> None:
    """The precedence docs/proxy.md states: a broken cost promise under serve_unverified leaves
    no slow call for a spent budget to refuse; under alert_only the budget's answer stands."""
    from router.routing.plan import Spent

    spent = Spent(on_spent="refuse", limit=3, window_s=60, reset_s=12.0)
    served = plan(READ, REJECT, MODE, None, COVERED, cost_alarm=broken("serve_unverified"),
                  spent=spent)
    assert served == plan(READ, REJECT, MODE, None, COVERED, cost_alarm=broken("serve_unverified"))
    refused = plan(READ, REJECT, MODE, None, COVERED, cost_alarm=broken("alert_only"), spent=spent)
    assert refused.action == "refuse" and refused.retry_after_s == 12.0
