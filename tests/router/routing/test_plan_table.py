"""``plan`` over every routing mode x scope x alarm gate x read outcome, against a decision
table written out below (first matching row wins). The table is the documented precedence:
scope, then a missing or failed read, then the gate, then shadow mode, then the verdict; last,
the caller's spent escalation budget, over the same cases (``BUDGET_TABLE``)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from policies.types import OptionScores, Verdict
from router.routing.plan import Mode, Scope, Spent, plan, reads_first_tier
from router.routing.ports import NOT_READ, FastRead

SURE = OptionScores(("a", "b"), (0.97, 0.03))
UNSURE = OptionScores(("a", "b"), (0.6, 0.4))
READS = {
    "accept": FastRead(SURE, cached=False),
    "below": FastRead(UNSURE, cached=False),
    "failed": FastRead(SURE, cached=False, failure="fast backend failed (BackendTimeout)"),
    "none": NOT_READ,
}
# The covering policy's verdict on each outcome: a failed read is judged only in shadow mode
# (``judged_scores``), as the climb judges it; a read not made is never judged.
VERDICTS = {"accept": Verdict(True, 0, 0.97, 0.9, "p >= t"),
            "below": Verdict(False, 0, 0.6, 0.9, "p < t")}
ANY = object()

# (scope, read, gate, shadow, unscoped, serve_unverified) -> (action, fallback); ANY matches all.
TABLE: list[tuple[tuple[Any, ...], tuple[str, str]]] = [
    # Unscoped: policy.unscoped alone (no gate); server-wide shadow or unscoped shadow shadows.
    (("unscoped", ANY, ANY, True, ANY, ANY), ("shadow", "refuse")),
    (("unscoped", ANY, ANY, ANY, "shadow", ANY), ("shadow", "refuse")),
    (("unscoped", "accept", ANY, False, "unverified", ANY), ("unverified", "refuse")),
    (("unscoped", "below", ANY, False, "unverified", ANY), ("unverified", "refuse")),
    (("unscoped", "accept", ANY, False, "threshold", ANY), ("fast", "refuse")),
    (("unscoped", ANY, ANY, False, ANY, True), ("escalate", "unverified")),
    (("unscoped", ANY, ANY, False, ANY, False), ("escalate", "refuse")),
    # Covered, no read to route on: only the slow path can answer.
    (("covered", "none", ANY, True, ANY, ANY), ("shadow", "refuse")),
    (("covered", "none", ANY, False, ANY, ANY), ("escalate", "refuse")),
    (("covered", "failed", ANY, False, ANY, ANY), ("escalate", "refuse")),
    # Covered with a verdict: shadow serves the slow answer, a gate turns an accept down.
    (("covered", ANY, ANY, True, ANY, True), ("shadow", "unverified")),
    (("covered", ANY, ANY, True, ANY, False), ("shadow", "refuse")),
    (("covered", "accept", None, False, ANY, ANY), ("fast", "refuse")),
    (("covered", ANY, ANY, False, ANY, True), ("escalate", "unverified")),
    (("covered", ANY, ANY, False, ANY, False), ("escalate", "refuse")),
]

CASES = list(itertools.product(("covered", "unscoped"), READS, (None, "accuracy alarm"),
                               (False, True), ("escalate", "shadow", "unverified", "threshold"),
                               (False, True)))


def expected(case: tuple[Any, ...]) -> tuple[str, str]:
    for row, outcome in TABLE:
        if all(want is ANY or want == got for want, got in zip(row, case, strict=True)):
            return outcome
    raise AssertionError(f"no row of the table matches {case}")


@pytest.mark.parametrize("case", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_every_mode_scope_gate_and_read_outcome_follows_the_table(case: tuple[Any, ...]) -> None:
    scope, outcome, gate, shadow, unscoped, serve_unverified = case
    read = READS[outcome]
    judged = outcome in VERDICTS or (outcome == "failed" and shadow)
    verdict = (VERDICTS.get(outcome, VERDICTS["accept"]) if judged and scope == "covered"
               else None)
    mode = Mode(shadow=shadow, unscoped=unscoped, serve_unverified_on_failure=serve_unverified)
    the_plan = plan(read, verdict, mode, gate, Scope(covered=scope == "covered", question="q"))
    assert (the_plan.action, the_plan.fallback) == expected(case)
    if scope == "covered" and gate is not None and outcome == "accept" and verdict is not None:
        # The policy accepted; the gate's reason is the verdict the decision carries.
        assert the_plan.accepted and the_plan.verdict is not None
        assert not the_plan.verdict.accept and the_plan.verdict.reason == gate
    if scope == "unscoped":
        assert the_plan.note is not None and the_plan.note.startswith("unscoped: ")


@pytest.mark.parametrize(("unscoped", "shadow", "reads"), [
    ("escalate", False, False), ("escalate", True, True), ("shadow", False, True),
    ("unverified", False, True), ("threshold", False, True)])
def test_the_read_plan_reads_an_unscoped_decision_only_where_its_mode_uses_the_read(
        unscoped: Any, shadow: bool, reads: bool) -> None:
    mode = Mode(shadow=shadow, unscoped=unscoped, serve_unverified_on_failure=False)
    assert reads_first_tier(None, mode) is reads


# A spent budget acts on the plan the facts above give (its action; whether it is a shadow
# plan's read, which shadow mode judges even when failed), per budget.on_spent:
# (planned action, read, shadow plan, on_spent) -> action with the budget spent, and whether
# the cheaper model answers.
BUDGET_TABLE: list[tuple[tuple[Any, ...], tuple[str, bool]]] = [
    # A plan that calls no slow model never meets the budget: the policy's own budget (which
    # accepts in its verdict), an accept, policy.unscoped's unverified or threshold answers.
    (("fast", ANY, ANY, ANY), ("fast", False)),
    (("unverified", ANY, ANY, ANY), ("unverified", False)),
    # Escalations (the gate's included) and shadow calls: the operator's answer.
    ((ANY, ANY, ANY, "cheaper_model"), ("same", True)),
    ((ANY, ANY, ANY, "refuse"), ("refuse", False)),
    ((ANY, "failed", False, "unverified"), ("refuse", False)),  # no fast answer to serve
    ((ANY, ANY, ANY, "unverified"), ("unverified", False)),  # a read not made is made late
]


def budget_expected(case: tuple[Any, ...]) -> tuple[str, bool]:
    for row, outcome in BUDGET_TABLE:
        if all(want is ANY or want == got for want, got in zip(row, case, strict=True)):
            return outcome
    raise AssertionError(f"no row of the budget table matches {case}")


@pytest.mark.parametrize("case", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_a_spent_budget_acts_last_on_every_plan_that_calls_the_slow_model(
        case: tuple[Any, ...]) -> None:
    scope, outcome, gate, shadow, unscoped, serve_unverified = case
    judged = outcome in VERDICTS or (outcome == "failed" and shadow)
    verdict = (VERDICTS.get(outcome, VERDICTS["accept"]) if judged and scope == "covered"
               else None)
    mode = Mode(shadow=shadow, unscoped=unscoped, serve_unverified_on_failure=serve_unverified)
    facts = (READS[outcome], verdict, mode, gate, Scope(covered=scope == "covered", question="q"))
    planned = plan(*facts)
    on_spent: Any
    for on_spent in ("unverified", "refuse", "cheaper_model"):
        spent = Spent(on_spent=on_spent, limit=3, window_s=60, reset_s=41.5)
        budgeted = plan(*facts, spent=spent)
        action, cheaper = budget_expected(
            (planned.action, outcome, planned.action == "shadow", on_spent))
        assert (budgeted.action, budgeted.cheaper) == (
            planned.action if action == "same" else action, cheaper), on_spent
        if budgeted.action == planned.action and not cheaper:
            assert budgeted == planned  # untouched
        if action in ("refuse", "unverified") and budgeted != planned:
            # The verdict (the gate's reason included) is kept for the log; the caller learns
            # why and when the window resets; nothing falls back to a slow call.
            assert budgeted.verdict == planned.verdict and budgeted.fallback == "refuse"
            assert budgeted.error_note is not None and "budget is spent" in budgeted.error_note
            assert budgeted.retry_after_s == 41.5
