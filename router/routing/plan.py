"""How one decision is routed, decided in one place: ``plan(read, verdict, mode, gate, scope)``
turns the fast read, the policy's verdict, the routing mode (shadow, ``policy.unscoped``,
``slow.serve_unverified_on_failure``), an alarm's gate and the decision's scope into a ``Plan``.
Pure: no I/O, no state; the routing service executes the plan and logs the decision."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from policies.scope import UnscopedMode
from policies.types import OptionScores, Verdict
from router.routing.ports import FastRead

# The policy id an unscoped decision is logged under: the one the untuned fallback always had,
# so dashboards and log readers keep one name for "no tuned policy decided this".
UNSCOPED_POLICY_ID = "fallback"

# fast: serve the fast answer (its policy accepted it). escalate: the slow model answers.
# shadow: the slow model answers; the fast read, and the policy's verdict when there is one,
# are logged beside it. unverified: serve the fast answer marked unverified (no policy covers
# the question and ``policy.unscoped: unverified`` asks for it).
Action = Literal["fast", "escalate", "shadow", "unverified"]
# What a failed slow path leads to: the error reaches the caller (refuse), or the fast answer
# is served marked unverified (``slow.serve_unverified_on_failure``; read then if none was).
Fallback = Literal["refuse", "unverified"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Mode:
    """The routing mode of one decision. ``shadow``: its policy file's shadow flag, else the
    server's ``policy.shadow`` (an unscoped decision: the server's)."""

    shadow: bool
    unscoped: UnscopedMode
    serve_unverified_on_failure: bool


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
    ``error_note`` follows it in the error a refused decision raises (None: unchanged)."""

    action: Action
    fallback: Fallback = "refuse"
    verdict: Verdict | None = None
    accepted: bool = False
    note: str | None = None
    fallback_note: str = ""
    error_note: str | None = None


def judged_scores(read: FastRead, *, shadow: bool) -> OptionScores | None:
    """The scores a policy judges (and an unscoped decision may serve or log): the read's,
    unless a failure says not to route on them; shadow mode judges and logs any read, since
    the slow answer is served anyway."""
    return read.scores if read.failure is None or shadow else None


def plan(read: FastRead, verdict: Verdict | None, mode: Mode, gate: str | None,
         scope: Scope) -> Plan:
    """The plan for one decision. ``verdict``: the covering policy's on ``judged_scores``
    (None when there are none, or no policy covers the decision); ``gate``: why an alarm on
    that policy escalates what it accepts (None: its verdicts stand)."""
    if not scope.covered:
        return _unscoped(read, mode, scope.question)
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
