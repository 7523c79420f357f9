"""Routing a decision no loaded policy covers (``policies/scope.py``): it follows
``policy.unscoped`` and never reaches a policy, so it carries no guarantee and no watch sees it."""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from policies.scope import UnscopedMode, describe
from policies.types import Decision, DecisionRequest, OptionScores, Route
from router.errors import SlowPathError

if TYPE_CHECKING:
    from router.routing.escalation import Escalation
    from router.routing.ports import FastRead
    from router.settings import Settings
    from router.store.metrics import Metrics

# The policy id an unscoped decision is logged under: the one the untuned fallback always had,
# so dashboards and log readers keep one name for "no tuned policy decided this".
UNSCOPED_POLICY_ID = "fallback"


async def route_unscoped(
    request: DecisionRequest, read: FastRead, *, mode: UnscopedMode, shadow_all: bool,
    escalation: Escalation, metrics: Metrics, settings: Settings, namespace: str,
    started: float, read_later: Callable[[], Awaitable[FastRead]] | None = None,
) -> Decision:
    """``escalate``: the slow model answers; no fast read is made for it (``read`` is
    ``NOT_READ``: ``RoutingService.reads_fast``), so the decision has no ``raw_probability``
    and logs no ``proba``. Only when the slow path fails and
    ``slow.serve_unverified_on_failure`` serves the fast answer instead is it read then
    (``read_later``). ``shadow`` (or the server-wide ``policy.shadow``): the slow model answers,
    the decision marked shadow, the fast read logged beside it to tune on later. ``unverified``:
    the fast answer, route ``unverified``; with no usable read it escalates. A read made is
    logged (the decision log's ``proba``), never judged."""
    shadow = shadow_all or mode == "shadow"
    # A read with a failure (none made, or one not to be trusted) is not served, only logged.
    scores = read.scores if read.failure is None or shadow else None
    why = f"unscoped: no loaded policy was tuned on {describe(request)}" + (
        f"; {read.failure}" if scores is None and read.failure else "")
    decision_id = uuid.uuid4().hex

    def unverified(read: OptionScores, note: str, *, escalated: bool) -> Decision:
        """The fast read's top answer, served with no guarantee."""
        index = read.top_index
        metrics.decision(route="unverified", escalated=escalated)
        return Decision(
            decision_id, request.question_id, read.options[index], "unverified", None,
            read.proba[index], None, UNSCOPED_POLICY_ID, _ms(started), note=note)

    if mode == "unverified" and not shadow and scores is not None:
        return unverified(
            scores, f"{why}; the fast answer is served unverified (policy.unscoped: unverified)",
            escalated=False)
    try:
        answer, from_cache = await escalation.answer(request, namespace=namespace)
    except SlowPathError as exc:
        if (read.skipped and read_later is not None and not shadow
                and settings.slow.serve_unverified_on_failure):
            read = await read_later()  # the fallback the configuration asks for needs it now
            scores = read.scores if read.failure is None else None
            if scores is None and read.failure:
                why += f"; {read.failure}"
        if scores is None or shadow or not settings.slow.serve_unverified_on_failure:
            # The caller sees why this decision needed the slow model at all: a confident read
            # of a question no policy covers is escalated, and a bare "escalation unavailable"
            # would not say so. Same error class and status, the reason appended.
            # A copy: single flight hands one exception object to every waiter of the question.
            explained = copy.copy(exc)
            explained.message = (f"{exc.message}; {why} (policy.unscoped: {mode}; 'unverified' "
                                 "serves the fast answer marked so)")
            explained.args = (explained.message,)
            raise explained from exc
        return unverified(scores, f"{exc.message}; {why}; the fast answer was not verified",
                          escalated=True)
    route: Route = "cache" if from_cache else "slow"
    metrics.decision(route=route, escalated=True)
    note = f"{why}; answered by the slow model (policy.unscoped: {'shadow' if shadow else mode})"
    if read.skipped:
        note += "; no fast read was made (escalate does not use one)"
    if shadow and scores is not None:
        top, p = scores.top
        note += f"; the fast read answered {top!r} (p = {p:.3f}), logged to tune on"
    raw = scores.proba[scores.options.index(answer)] if (
        scores is not None and answer in scores.options) else None
    return Decision(
        decision_id, request.question_id, answer, route, None, raw, None, UNSCOPED_POLICY_ID,
        _ms(started), note=note, escalated=True, shadow=shadow, guarantee=None)


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0
