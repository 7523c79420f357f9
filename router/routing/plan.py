"""How one decision is routed, decided in one place, from facts. ``reads_first_tier(policy,
mode)`` is the read plan: whether a decision needs the first tier's read at all.
``plan(read, verdict, mode, gate, scope)`` turns the fast read, the policy's verdict, the
routing mode (shadow, ``policy.unscoped`` with its fixed bar, ``slow.serve_unverified_on_failure``),
an alarm's gate and the decision's scope into a ``Plan``. Precedence, highest first: scope (an
unscoped decision follows ``policy.unscoped`` alone, no gate applies), a failed or missing read
(only the slow path can answer), the alarm's gate (it turns an accept into an escalation), shadow
mode (the slow answer is served, the verdict logged), the policy's verdict; then a broken cost
promise (``CostAlarm``: under ``serve_unverified`` the policy's own escalations serve the fast
answer marked unverified); last, the caller's escalation budget (``spent``): a plan that still
would call the slow model gets ``budget.on_spent`` instead once it is spent. Pure: no I/O, no
state; the routing service reads, executes the plan and logs the decision."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from policies.scope import UnscopedMode
from policies.types import OptionScores, Receipt, Route, Verdict
from router.routing.ports import CostAlarm, FastRead

if TYPE_CHECKING:
    from policies.policy import Policy

# The policy id an unscoped decision is logged under: the one the untuned fallback always had,
# so dashboards and log readers keep one name for "no tuned policy decided this".
UNSCOPED_POLICY_ID = "fallback"

# fast: serve the fast answer (its policy accepted it). escalate: the slow model answers.
# shadow: the slow model answers; the fast read, and the policy's verdict when there is one,
# are logged beside it. unverified: serve the fast answer marked unverified (no policy covers
# the question and ``policy.unscoped: unverified`` asks for it).
# refuse: the caller's escalation budget is spent and ``budget.on_spent: refuse`` asks for a 429.
Action = Literal["fast", "escalate", "shadow", "unverified", "refuse"]
# What a failed slow path leads to: the error reaches the caller (refuse), or the fast answer
# is served marked unverified (``slow.serve_unverified_on_failure``; read then if none was).
Fallback = Literal["refuse", "unverified"]
# What a decision that needs the slow model gets once its caller's budget is spent.
OnSpent = Literal["unverified", "refuse", "cheaper_model"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Mode:
    """The routing mode of one decision. ``shadow``: its policy file's shadow flag, else the
    server's ``policy.shadow`` (an unscoped decision: the server's); ``fallback_threshold``:
    the fixed bar on the raw read under ``policy.unscoped: threshold``."""

    shadow: bool
    unscoped: UnscopedMode
    serve_unverified_on_failure: bool
    fallback_threshold: float = 0.9


@dataclass(frozen=True, slots=True, kw_only=True)
class Scope:
    """Whether a loaded policy covers the decision (``PolicyRegistry.lookup``), and the question
    as a note names it (``policies.scope.describe``)."""

    covered: bool
    question: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """What to do with one decision. ``verdict``: the policy's, after the alarm gate (None: no
    policy judged a read); ``accepted``: the policy's own verdict before the gate (what its watch
    takes). ``note``: the decision's note once the plan ran as planned; ``fallback_note``
    follows the slow path's error message when the fast answer is served unverified instead;
    ``error_note`` follows it in the error a refused decision raises (None: unchanged).
    ``calibrated``: every option's probability as the verdict saw it (None: no verdict).
    ``cheaper``: the slow call goes to ``budget.cheaper_model``; ``retry_after_s``: when a
    refused decision's caller has budget again."""

    action: Action
    fallback: Fallback = "refuse"
    verdict: Verdict | None = None
    accepted: bool = False
    note: str | None = None
    fallback_note: str = ""
    error_note: str | None = None
    calibrated: list[float] | None = None
    cheaper: bool = False
    retry_after_s: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Spent:
    """The caller's escalation budget is spent: ``limit`` units per ``window_s`` seconds, the
    window resets in ``reset_s``; ``on_spent`` says what a decision needing the slow model gets."""

    on_spent: OnSpent
    limit: float
    window_s: float
    reset_s: float


def reads_first_tier(policy: Policy | None, mode: Mode) -> bool:
    """The read plan: whether routing a decision uses its first tier's read. A policy's
    decision does unless its first tier is tuned off (a cascade starting higher); an unscoped
    one under ``policy.unscoped`` ``shadow`` (or server-wide shadow, which logs it),
    ``unverified`` (which serves it) and ``threshold`` (which judges it). Under ``escalate``
    the slow model answers whatever the read says, so none is made (only a failed slow path
    with ``slow.serve_unverified_on_failure`` reads it, late)."""
    if policy is not None:
        return policy.reads_first_tier
    return mode.unscoped != "escalate" or mode.shadow


def judged_scores(read: FastRead, *, shadow: bool) -> OptionScores | None:
    """The scores a policy judges (and an unscoped decision may serve or log): the read's,
    unless a failure says not to route on them; shadow mode judges and logs any read, since
    the slow answer is served anyway."""
    return read.scores if read.failure is None or shadow else None


def plan(read: FastRead, verdict: Verdict | None, mode: Mode, gate: str | None,
         scope: Scope, calibrated: list[float] | None = None, *,
         cost_alarm: CostAlarm | None = None, spent: Spent | None = None) -> Plan:
    """The plan for one decision. ``verdict``: the covering policy's on ``judged_scores``
    (None when there are none, or no policy covers the decision), with ``calibrated``, the
    probabilities it saw; ``gate``: why an alarm on that policy escalates what it accepts
    (None: its verdicts stand); ``cost_alarm``: that policy's cost promise is broken (None:
    it holds, or the policy has none); ``spent``: the caller's escalation budget, when it is
    spent. In that order: the cost promise acts on the policy's plan, the budget last."""
    if not scope.covered:
        the_plan = _unscoped(read, mode, scope.question)
    else:
        the_plan = dataclasses.replace(_over_cost(_covered(read, verdict, mode, gate), cost_alarm),
                                       calibrated=calibrated)
    if spent is not None and calls_slow_model(the_plan):
        return _over_budget(the_plan, read, spent)
    return the_plan


def _over_cost(planned: Plan, cost_alarm: CostAlarm | None) -> Plan:
    """Under a broken cost promise with ``on_cost_alarm: serve_unverified``, the policy's own
    escalations (a verdict below the threshold) serve the fast answer unverified; an alarm's
    escalations, shadow mode and failed reads are left as they are."""
    if (cost_alarm is None or cost_alarm.on_cost_alarm != "serve_unverified"
            or planned.action != "escalate" or planned.verdict is None or planned.accepted):
        return planned
    return Plan(action="unverified", verdict=planned.verdict, note=(
        f"the fast answer is below the threshold ({planned.verdict.reason}); served "
        f"unverified, not escalated: {cost_alarm.detail} (on_cost_alarm: serve_unverified)"))


def calls_slow_model(the_plan: Plan) -> bool:
    """Whether carrying out ``the_plan`` asks the slow model (what a caller's budget counts)."""
    return the_plan.action in ("escalate", "shadow")


def _over_budget(the_plan: Plan, read: FastRead, spent: Spent) -> Plan:
    """``budget.on_spent`` for a plan that would call the slow model: the cheaper model answers,
    or the fast answer is served unverified (read late if none was made; a failed read leaves
    nothing to serve: refused), or the decision is refused until the window resets."""
    why = (f"this API key's escalation budget is spent ({spent.limit:g} per {spent.window_s:g} s "
           f"window, budget.on_spent: {spent.on_spent}; it resets in {spent.reset_s:.0f} s)")
    if spent.on_spent == "cheaper_model":
        return dataclasses.replace(the_plan, cheaper=True, note="; ".join(
            filter(None, (the_plan.note, f"{why}: answered by budget.cheaper_model"))))
    scores = judged_scores(read, shadow=the_plan.action == "shadow")
    if spent.on_spent == "unverified" and (scores is not None or read.skipped):
        return dataclasses.replace(
            the_plan, action="unverified", fallback="refuse", error_note=why,
            retry_after_s=spent.reset_s, note=f"{why}; the fast answer is served unverified")
    if spent.on_spent == "unverified":  # asked for the fast answer, but no read can give one
        why += f"; no fast answer to serve instead ({read.failure})"
    return dataclasses.replace(the_plan, action="refuse", fallback="refuse", error_note=why,
                               retry_after_s=spent.reset_s)


def _covered(read: FastRead, verdict: Verdict | None, mode: Mode, gate: str | None) -> Plan:
    fallback: Fallback = "unverified" if mode.serve_unverified_on_failure else "refuse"
    if verdict is None:  # no read to route on: only the slow path can answer
        return Plan(action="shadow" if mode.shadow else "escalate",
                    note=f"{read.failure}; answered by the slow path")
    accepted = verdict.accept
    if accepted and gate is not None:  # an alarm's action (on_alarm), beside the mode
        verdict = dataclasses.replace(verdict, accept=False, reason=gate)
    if mode.shadow:
        assert read.scores is not None  # a verdict was made on them
        answer = read.scores.options[verdict.index]
        return Plan(
            action="shadow", fallback=fallback, verdict=verdict, accepted=accepted,
            note=(f"shadow mode: the slow model's answer is served; the fast read answered "
                  f"{answer!r} and the policy would have "
                  f"{'accepted' if verdict.accept else 'escalated'} it ({verdict.reason})"),
            fallback_note="the fast answer is in shadow mode and was not verified")
    if verdict.accept:
        return Plan(action="fast", verdict=verdict, accepted=accepted)
    if accepted:  # the policy accepted; the alarm's gate escalates it
        return Plan(action="escalate", fallback=fallback, verdict=verdict, accepted=accepted,
                    note=f"the policy accepted the fast answer; escalated: {verdict.reason}",
                    fallback_note=f"the fast answer was escalated ({verdict.reason}) and was "
                                  "not verified")
    return Plan(action="escalate", fallback=fallback, verdict=verdict, accepted=accepted,
                fallback_note=f"the fast answer is below the threshold ({verdict.reason}) "
                              "and was not verified")


def _unscoped(read: FastRead, mode: Mode, question: str) -> Plan:
    """A decision no loaded policy covers follows ``policy.unscoped`` and carries no guarantee.
    ``escalate``: the slow model answers (no fast read was made for it: ``read`` is NOT_READ,
    read only if the slow path fails and ``slow.serve_unverified_on_failure`` serves the fast
    answer instead). ``shadow`` (or the server-wide ``policy.shadow``): the slow model answers,
    the fast read logged beside it to tune on later. ``unverified``: the fast answer, marked so;
    with no usable read it escalates."""
    shadow = mode.shadow or mode.unscoped == "shadow"
    scores = judged_scores(read, shadow=shadow)
    why = f"unscoped: no loaded policy was tuned on {question}" + (
        f"; {read.failure}" if scores is None and read.failure else "")
    if mode.unscoped == "unverified" and not shadow and scores is not None:
        return Plan(action="unverified", note=(f"{why}; the fast answer is served unverified "
                                               "(policy.unscoped: unverified)"))
    if mode.unscoped == "threshold" and not shadow and scores is not None:
        return _unscoped_threshold(scores, mode, why)
    note = (f"{why}; answered by the slow model "
            f"(policy.unscoped: {'shadow' if shadow else mode.unscoped})")
    if read.skipped:
        note += "; no fast read was made (escalate does not use one)"
    if shadow and scores is not None:
        top, p = scores.top
        note += f"; the fast read answered {top!r} (p = {p:.3f}), logged to tune on"
    return Plan(
        action="shadow" if shadow else "escalate",
        fallback="unverified" if mode.serve_unverified_on_failure and not shadow else "refuse",
        note=note, fallback_note=f"{why}; the fast answer was not verified",
        # The caller sees why this decision needed the slow model at all: a bare "escalation
        # unavailable" would not say that no policy covers a confident read.
        error_note=(f"{why} (policy.unscoped: {mode.unscoped}; 'unverified' serves the fast "
                    "answer marked so)"))


def _unscoped_threshold(scores: OptionScores, mode: Mode, why: str) -> Plan:
    """``policy.unscoped: threshold``: the fast answer when its raw probability clears the
    fixed bar, else the slow model's, no guarantee either way."""
    held = _held_to_bar(scores, mode.fallback_threshold)
    assert held.verdict is not None
    if held.verdict.accept:
        return dataclasses.replace(held, note=(
            f"{why}; the uncalibrated read is held to a fixed bar, no guarantee "
            f"(policy.unscoped: threshold, {held.verdict.reason})"))
    return dataclasses.replace(
        held, note=f"{why}; answered by the slow model (policy.unscoped: threshold, "
                   f"{held.verdict.reason})",
        fallback="unverified" if mode.serve_unverified_on_failure else "refuse",
        fallback_note=f"{why}; the fast answer was not verified",
        error_note=f"{why} (policy.unscoped: threshold; 'unverified' serves the fast answer "
                   "marked so)")


def _held_to_bar(scores: OptionScores, bar: float) -> Plan:
    """``policy.unscoped: threshold``: the raw read's top option against a fixed bar; its
    probabilities are the backend's own, which nothing checked."""
    index, p = scores.top_index, scores.proba[scores.top_index]
    accept = p >= bar
    verdict = Verdict(accept, index, p, bar,
                      f"p {p:.3f} {'>=' if accept else '<'} threshold {bar:.3f}")
    return Plan(action="fast" if accept else "escalate", verdict=verdict, accepted=accept,
                calibrated=list(scores.proba))


def span_plan(confidence: float | None, mode: Mode, question: str,
              no_read: str | None = None) -> Plan:
    """The plan for one span question. Span answers are unscoped (no policy is tuned on spans),
    so ``policy.unscoped`` decides, as for any unscoped decision; ``threshold`` holds the
    server's own span confidence to the fixed bar. ``confidence``: the fast tier's (None: none
    made, or none to be had, ``no_read`` saying why); a failed escalation falls back to the fast
    answer under ``slow.serve_unverified_on_failure`` wherever one can be read."""
    why = f"unscoped: no loaded policy was tuned on {question} (span answers carry no guarantee)"
    if no_read:
        why += f"; {no_read}"
    shadow = mode.shadow or mode.unscoped == "shadow"
    if confidence is not None and not shadow and mode.unscoped == "unverified":
        return Plan(action="unverified", note=(f"{why}; the fast answer is served unverified "
                                               "(policy.unscoped: unverified)"))
    bar = ""
    if confidence is not None and not shadow and mode.unscoped == "threshold":
        accept = confidence >= mode.fallback_threshold
        bar = (f", span confidence {confidence:.3f} {'>=' if accept else '<'} threshold "
               f"{mode.fallback_threshold:.3f}")
        if accept:
            return Plan(action="fast", note=(f"{why}; the server's confidence is held to a "
                                             f"fixed bar, no guarantee (policy.unscoped: "
                                             f"threshold{bar})"))
    return Plan(
        action="shadow" if shadow else "escalate",
        fallback=("unverified" if mode.serve_unverified_on_failure and not shadow
                  and not no_read else "refuse"),
        note=(f"{why}; answered by the slow model (policy.unscoped: "
              f"{'shadow' if shadow else mode.unscoped}{bar})"),
        fallback_note=f"{why}; the fast answer was not verified",
        error_note=f"{why} (policy.unscoped: {mode.unscoped})")


@dataclass(frozen=True, slots=True, kw_only=True)
class Promise:
    """What a covering policy promises, as its receipt states it: its file's guarantee (None
    when the file is served without it, ``unguaranteed`` saying why), target, delta, digest and
    the question it covers (its scope signature)."""

    policy_id: str
    guarantee: str | None
    target_accuracy: float
    delta: float
    digest: str | None
    question: str | None
    unguaranteed: str | None = None


def receipt(the_plan: Plan, route: Route, promise: Promise | None, *, tier: str | None,
            watch: str | None) -> Receipt:
    """What was promised for the answer served (``route``) under ``the_plan``: the policy's
    guarantee only for a fast answer it accepted (and no gate turned down); for every other
    answer, none, and why."""
    served_fast = the_plan.action == "fast" and route in ("fast", "cache")
    answered_by = ("slow model" if route in ("slow", "cache") and not served_fast
                   else "fast tier (unverified)" if route == "unverified"
                   else f"fast tier {tier}" if tier else "fast tier")
    if promise is None:
        return Receipt(guarantee=None, answered_by=answered_by, why=(
            "unscoped: no loaded policy covers this question, so nothing is promised"))
    if served_fast and promise.guarantee is not None:
        what = ("agree with the slow model" if promise.guarantee == "agreement_with_slow"
                else "are right")
        guarantee: str | None = promise.guarantee
        why = (f"accepted by policy {promise.policy_id}: at least {promise.target_accuracy:g} "
               f"of the answers it accepts {what}, with probability {1 - promise.delta:g}")
    else:
        guarantee, why = None, _why_none(the_plan, route, promise)
    return Receipt(guarantee=guarantee, answered_by=answered_by, why=why,
                   target_accuracy=promise.target_accuracy, delta=promise.delta,
                   policy_digest=promise.digest, question=promise.question, watch=watch)


def _why_none(the_plan: Plan, route: Route, promise: Promise) -> str:
    if the_plan.action == "fast":
        return f"policy {promise.policy_id} is served without its guarantee: {promise.unguaranteed}"
    if route == "unverified":
        return "the fast answer is served unverified: no guarantee covers it"
    covers = "the guarantee covers fast answers the policy accepts, not the slow model's"
    if the_plan.action == "shadow":
        return f"shadow mode: the slow model's answer is served; {covers}"
    if the_plan.accepted and the_plan.verdict is not None:
        return f"escalated by the policy's alarm ({the_plan.verdict.reason}); {covers}"
    return f"escalated: {covers}"
