"""Bodies of questions answered in stages (System One's ``depends_on`` / ``ask_if``): each stage's
asked questions routed in one ``route`` call, ``ask_if`` evaluated between stages on the routed
answers, skips cascading (a skipped answer is None).

Who reads the stages: when the fast backend can read the whole body as its server runs it
(``FastBackend.read_staged``: a System One server that runs stages), the body is read once,
through the read cache, so every answer is the one the server gives its own clients, later
stages continuing the answers it gave. The policy still routes stage by stage. Where an
escalation changed an earlier answer (or its skip), the server's reads of the later stages
continued an answer the caller does not get: those questions go to the slow path, with a note
saying so. Otherwise each stage is read on its own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from policies.policy import Policy
from policies.types import Decision, DecisionRequest, OptionScores, StagedQuestion
from router.errors import InvalidRequest
from router.routing.ports import FastRead
from router.routing.service import RoutingService
from router.store.cache import read_key


class RouteStage(Protocol):
    """Decisions for one stage's requests (the routing service's ``route``, one namespace);
    ``reads`` are their fast reads when the whole body was read already."""

    def __call__(self, requests: Sequence[DecisionRequest],
                 reads: Sequence[FastRead] | None = None) -> Awaitable[list[Decision]]: ...


class ReadWhole(Protocol):
    """The reads of a whole body as its server runs it (``read_whole``, one namespace): one per
    question, in order; None when the backend cannot read the body so. A read with no
    ``scores`` failed (``failure`` says why) or, with no failure, the server skipped it."""

    def __call__(self, questions: Sequence[StagedQuestion], /
                 ) -> Awaitable[list[FastRead] | None]: ...


@dataclass
class StagedOutcome:
    """What running the stages produced: a decision per asked question, a reason per skipped one,
    and the ids asked in each stage that asked anything."""

    decisions: dict[str, Decision] = field(default_factory=dict)
    skipped: dict[str, dict[str, Any]] = field(default_factory=dict)
    stages: list[list[str]] = field(default_factory=list)
    # The server's word for how later stages saw earlier answers: "prefill" when the body was read
    # whole by a server that runs stages, None when nothing conditioned them (one stage, or
    # stages read one by one).
    conditioning: str | None = None


def stage_order(dependencies: Mapping[str, Sequence[str]]) -> tuple[tuple[str, ...], ...]:
    """Ids in stages: each after every id it depends on, in the given order within a stage.
    Raises ValueError naming the ids of a dependency cycle."""
    placed: set[str] = set()
    stages: list[tuple[str, ...]] = []
    while len(placed) < len(dependencies):
        ready = tuple(qid for qid, deps in dependencies.items()
                      if qid not in placed and all(dep in placed for dep in deps))
        if not ready:
            stuck = ", ".join(qid for qid in dependencies if qid not in placed)
            raise ValueError(f"dependency cycle among {stuck}")
        stages.append(ready)
        placed.update(ready)
    return tuple(stages)


def skip_reason(question: StagedQuestion, answers: Mapping[str, str | None]) -> dict[str, Any] | None:
    """Why ``question`` is not asked, or None when every ``ask_if`` key holds (AND over keys, OR
    within a key's list). A skipped or unanswered dependency was ``None``, so skips cascade.
    ``run_stages`` adds a ``note`` when the dependency's answer was escalated."""
    for dep, wanted in question.ask_if:
        was = answers.get(dep)
        if was not in wanted:
            return {"because": dep, "was": was, "wanted": list(wanted)}
    return None


async def run_stages(questions: Sequence[StagedQuestion], route: RouteStage,
                     read_whole: ReadWhole | None = None) -> StagedOutcome:
    """Ask each stage's questions whose ``ask_if`` holds in one ``route`` call, in stage order;
    with ``read_whole``, a body of several stages is read whole first (module docstring)."""
    by_id = {q.request.question_id: q for q in questions}
    stages = stage_order({qid: q.dependencies for qid, q in by_id.items()})
    outcome = StagedOutcome()
    upstream = None
    if read_whole is not None and len(stages) > 1:
        reads = await read_whole(questions)
        upstream = None if reads is None else dict(zip(by_id, reads, strict=True))
    answers: dict[str, str | None] = {}
    diverged: str | None = None  # the first earlier answer the server continued differently
    for stage in stages:
        asked = _asked(stage, by_id, answers, outcome)
        if asked:
            requests = [q.request for q in asked]
            if upstream is None:
                decisions = await route(requests)
            else:
                decisions = await route(requests, [_usable(upstream[r.question_id], diverged)
                                                    for r in requests])
            for request, decision in zip(requests, decisions, strict=True):
                outcome.decisions[request.question_id] = decision
                answers[request.question_id] = decision.answer
            outcome.stages.append([r.question_id for r in requests])
        if upstream is not None and diverged is None:
            diverged = _diverged_in(stage, answers, upstream)
    if upstream is not None and len(outcome.stages) > 1:
        outcome.conditioning = "prefill"
    return outcome


def _asked(stage: Sequence[str], by_id: Mapping[str, StagedQuestion],
           answers: dict[str, str | None], outcome: StagedOutcome) -> list[StagedQuestion]:
    """The questions of ``stage`` whose ``ask_if`` holds; each other one is skipped (its reason
    in ``outcome.skipped``, its answer None, so that skips cascade)."""
    asked: list[StagedQuestion] = []
    for qid in stage:
        reason = skip_reason(by_id[qid], answers)
        if reason is None:
            asked.append(by_id[qid])
        else:
            outcome.skipped[qid] = _noted(reason, outcome.decisions.get(reason["because"]))
            answers[qid] = None
    return asked


def _diverged_in(stage: Sequence[str], answers: Mapping[str, str | None],
                 upstream: Mapping[str, FastRead]) -> str | None:
    """The first answer of ``stage`` given otherwise than the server's read continued it (a
    failed read continued nothing), said as ``_divergence`` says it; None when all agree."""
    return next((_divergence(qid, answers[qid], upstream[qid]) for qid in stage
                 if upstream[qid].failure is None
                 and answers[qid] != _server_answer(upstream[qid])), None)


async def answer_stages(service: RoutingService, questions: Sequence[StagedQuestion], *,
                        namespace: str) -> StagedOutcome:
    """``run_stages`` through the routing service, in the caller's cache namespace. Each
    question's policy is looked up once, for the whole body; a policy name the registry refuses
    is raised when its question is asked (a skipped question asks nothing)."""
    looked_up: dict[str, Policy | None | InvalidRequest] = {}
    for question in questions:
        try:
            [looked_up[question.request.question_id]] = service.lookup([question.request])
        except InvalidRequest as exc:
            looked_up[question.request.question_id] = exc

    def policy_of(request: DecisionRequest) -> Policy | None:
        found = looked_up[request.question_id]
        if isinstance(found, InvalidRequest):
            raise found
        return found

    async def route(requests: Sequence[DecisionRequest],
                     reads: Sequence[FastRead] | None = None) -> list[Decision]:
        return await service.route(requests, namespace=namespace, reads=reads,
                                    policies=[policy_of(r) for r in requests])

    async def whole(body: Sequence[StagedQuestion]) -> list[FastRead] | None:
        # Nothing routes on a read (all unscoped, escalated): none upstream. A refused policy
        # name counts as a read: its question raises if it is asked.
        if not any(isinstance(found, InvalidRequest) or service.reads_fast(found)
                   for found in looked_up.values()):
            return None
        return await read_whole(service, body, namespace=namespace)

    return await run_stages(questions, route, whole)


async def read_whole(service: RoutingService, questions: Sequence[StagedQuestion], *,
                     namespace: str) -> list[FastRead] | None:
    """The reads of a whole body of several stages, read as one (``backend.read_staged``: the
    server runs the stages) through the read cache; None when the backend cannot read this body
    so. Each key holds the whole body, since every answer of it depends on every question."""
    backend = service.backend
    if not backend.reads_staged(questions):
        return None
    fingerprint = backend.fingerprint
    requests = [q.request for q in questions]
    body = [q.key() for q in questions]
    keys = [read_key(namespace, r, fingerprint,
                     {**backend.read_inputs(r, requests), "staged": body}) for r in requests]

    async def read(bounded: list[DecisionRequest]) -> list[OptionScores | None]:
        return await backend.read_staged([replace(q, request=r)
                                          for q, r in zip(questions, bounded, strict=True)])

    return await service.read_through_cache(requests, keys, read)


def _server_answer(read: FastRead) -> str | None:
    """The server's answer (the read's argmax), which its later stages continued."""
    return read.scores.options[read.scores.top_index] if read.scores is not None else None


def _noted(reason: dict[str, Any], dependency: Decision | None) -> dict[str, Any]:
    """A skip decided on an escalated answer says so: the fast read alone might have asked it."""
    if dependency is None or not dependency.escalated:
        return reason
    return reason | {"note": f"ask_if was evaluated on an escalated answer: {reason['because']} = "
                             f"{reason['was']!r} is the slow model's answer"}


def _divergence(qid: str, routed: str | None, read: FastRead) -> str:
    def shown(answer: str | None) -> str:
        return "skipped" if answer is None else repr(answer)

    return (f"the server's read continued {qid} = {shown(_server_answer(read))}, "
            f"but the answer given is {shown(routed)}")


def _usable(read: FastRead, diverged: str | None) -> FastRead:
    """The fast read to route a question on; ``failure`` says why it is not routed on. A later
    stage's read that continued an answer the caller does not get is not (shadow mode still
    judges and logs it)."""
    if diverged is not None and read.failure is None:
        return FastRead(read.scores, cached=read.cached, failure=f"no fast read fits: {diverged}")
    if read.scores is None and read.failure is None:  # the server skipped what slotgate asks
        return FastRead(None, cached=read.cached,
                        failure="the server skipped this question (its ask_if failed there)")
    return FastRead(read.scores, cached=read.cached, failure=read.failure)
