"""Answer a validated System One request stage by stage (``ask_if`` evaluated between stages) and
render the example server's answer shapes, each with slotgate's route and calibrated confidence.

Who reads the stages: when the fast backend can read the whole body as the server runs it
(``read_staged``: a System One server that runs stages), the body goes upstream once, so every
answer is the one the server gives its own clients, later stages continuing the answers it gave.
The policy still routes stage by stage, and ``ask_if`` is evaluated on the routed answers. Where an
escalation changed an earlier answer (or its skip), the server's reads of the later stages
continued an answer the caller does not get: those questions go to the slow path, with a note
saying so. Otherwise (``stages: "router"``, other backends) each stage is read on its own.

Answer fields (the example server's shapes, plus ``answer``, ``route`` and ``confidence``):

- ``confidence`` is the *calibrated* probability of the chosen answer (the policy's number), not
  the raw top probability the example server reports nor OpenJev's entropy score.
- ``probabilities``, ``noul`` and ``score`` are recomputed from the calibrated distribution. The
  fast answer is the raw read's argmax, so with a calibrator that moves the argmax the chosen
  answer need not be the calibrated top: ``answer`` always names the routed answer.
- An answer from the slow LLM carries numbers too, as every answer of the server does: its
  ``probabilities`` are one-hot on the slow model's answer, ``confidence`` is 1.0, ``noul`` is 1.0
  for yes and 0.0 for no, and ``score`` is the chosen level's 0-based index; ``route`` says whose
  numbers they are. A ``cache`` answer is shown like that too when it was a cached slow answer
  (``Decision.escalated``).
- ``usage`` has ``input_tokens`` and ``output_tokens`` set to 0: slotgate does not see its
  backends' token counts. It adds ``decisions`` (questions asked) and ``escalations`` (slow answers).
- ``diagnostics`` has the server's ``steps``, ``stages``, ``skipped``, ``conditioning``, ``samples``, ``timing``
  (``total_ms``, ``reads``: answers not served from the cache) and ``engine`` (``slotgate:<fast backend>``), plus
  ``routes`` (each decision's routing facts).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from policies.types import Decision, DecisionRequest
from router.backends.base import StagedQuestion
from router.http.systemone.wire import Question, SystemOneRequest
from router.routing.service import FastRead, RoutingService


class Decide(Protocol):
    """Decisions for one stage's requests (the routing service's ``decide``, one namespace);
    ``reads`` are their fast reads when a staged read already made them."""

    def __call__(self, requests: Sequence[DecisionRequest],
                 reads: Sequence[FastRead] | None = None) -> Awaitable[list[Decision]]: ...


class ReadStaged(Protocol):
    """The routing service's ``read_staged`` (one namespace): None when the backend cannot."""

    def __call__(self, questions: Sequence[StagedQuestion]) -> Awaitable[list[FastRead] | None]: ...

# Routes whose answer is the fast read's, so the calibrated distribution describes it.
_ROUTES_WITH_DISTRIBUTION = frozenset({"fast", "unverified", "cache"})


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


def skip_reason(question: Question, answers: dict[str, str | None]) -> dict[str, Any] | None:
    """Why ``question`` is not asked, or None when every ``ask_if`` key holds (AND over keys, OR
    within a key's list). A skipped or unanswered dependency was ``None``, so skips cascade."""
    for dep, wanted in question.ask_if:
        was = answers.get(dep)
        if was not in wanted:
            return {"because": dep, "was": was, "wanted": list(wanted)}
    return None


def decision_request(request: SystemOneRequest, question: Question) -> DecisionRequest:
    return DecisionRequest(
        question_id=question.id,
        instructions=question.instructions,
        options=question.options,
        state=request.state,
        context=request.context,
        kind=question.kind,
        samples=request.samples,
        seed=request.seed,
        policy=question.policy or request.policy,
        samples_auto=request.samples_auto,
        engine=request.engine + ((("alone", True),) if question.alone else ()),
    )


async def run_stages(request: SystemOneRequest, decide: Decide,
                     read_staged: ReadStaged | None = None) -> StagedOutcome:
    """Ask each stage's questions whose ``ask_if`` holds in one ``decide`` call, in stage order;
    with ``read_staged``, a body of several stages is read whole first (module docstring)."""
    outcome = StagedOutcome()
    upstream = await _staged_reads(request, read_staged)
    answers: dict[str, str | None] = {}
    diverged: str | None = None  # the first earlier answer the server continued differently
    for stage in request.stages:
        asked: list[Question] = []
        for qid in stage:
            question = request.question(qid)
            reason = skip_reason(question, answers)
            if reason is None:
                asked.append(question)
            else:
                outcome.skipped[qid] = reason
                answers[qid] = None
        if asked:
            requests = [decision_request(request, q) for q in asked]
            if upstream is None:
                decisions = await decide(requests)
            else:
                decisions = await decide(requests, [_usable(upstream[q.id], diverged)
                                                    for q in asked])
            for question, decision in zip(asked, decisions, strict=True):
                outcome.decisions[question.id] = decision
                answers[question.id] = decision.answer
            outcome.stages.append([q.id for q in asked])
        if upstream is not None and diverged is None:
            diverged = next((_divergence(qid, answers[qid], upstream[qid]) for qid in stage
                             if upstream[qid].failure is None
                             and answers[qid] != upstream[qid].answer), None)
    if upstream is not None and len(outcome.stages) > 1:
        outcome.conditioning = "prefill"
    return outcome


async def run_stages_on(service: RoutingService, request: SystemOneRequest, *,
                        namespace: str) -> StagedOutcome:
    """``run_stages`` through the routing service, in the caller's cache namespace."""

    async def decide(requests: Sequence[DecisionRequest],
                     reads: Sequence[FastRead] | None = None) -> list[Decision]:
        return await service.decide(requests, namespace=namespace, reads=reads)

    async def read_staged(questions: Sequence[StagedQuestion]) -> list[FastRead] | None:
        return await service.read_staged(questions, namespace=namespace)

    return await run_stages(request, decide, read_staged)


async def _staged_reads(request: SystemOneRequest,
                        read_staged: ReadStaged | None) -> dict[str, FastRead] | None:
    """The whole body's reads by question id, when it has several stages and the backend reads
    it whole; else None."""
    if read_staged is None or len(request.stages) < 2:
        return None
    questions = [StagedQuestion(decision_request(request, q), q.depends_on, q.ask_if)
                 for q in request.questions]
    reads = await read_staged(questions)
    return None if reads is None else {q.id: r for q, r in zip(request.questions, reads)}


def _divergence(qid: str, routed: str | None, read: FastRead) -> str:
    def shown(answer: str | None) -> str:
        return "skipped" if answer is None else repr(answer)

    return (f"the server's read continued {qid} = {shown(read.answer)}, "
            f"but the answer given is {shown(routed)}")


def _usable(read: FastRead, diverged: str | None) -> FastRead:
    """The staged read to route a question on; one without scores says why in ``failure``. A
    later stage's read that continued an answer the caller does not get is ``stale``: not routed
    on (shadow mode still judges and logs it)."""
    if diverged is not None and read.failure is None:
        reason = f"no fast read fits: {diverged}"
        if read.scores is None:
            return FastRead(None, cached=read.cached, failure=reason)
        return dataclasses.replace(read, stale=reason)
    if read.scores is None and read.failure is None:  # the server skipped what slotgate asks
        return FastRead(None, cached=read.cached,
                        failure="the server skipped this question (its ask_if failed there)")
    return read


def render_answer(question: Question, decision: Decision) -> dict[str, Any] | None:
    """One answer in the example server's shape for ``question.kind``; None when unanswered."""
    if decision.answer is None:
        return None
    names = question.answer_names
    chosen = names.index(decision.answer)
    proba = calibrated_distribution(names, decision)
    confidence = decision.probability if decision.probability is not None else proba[chosen]
    if _from_slow(decision):
        confidence = 1.0
    out: dict[str, Any] = {"type": question.kind}
    if question.kind == "noul":
        out["noul"] = proba[0]
    elif question.kind == "choice":
        out["choice"] = decision.answer
        out["probabilities"] = dict(zip(names, proba))
    else:
        out["score"] = sum(i * p for i, p in enumerate(proba))
        out["legend"] = {str(i): level for i, level in enumerate(names)}
        out["probabilities"] = {str(i): p for i, p in enumerate(proba)}
    out.update(answer=decision.answer, route=decision.route, confidence=confidence)
    return out


def calibrated_distribution(names: tuple[str, ...], decision: Decision) -> list[float]:
    """The calibrated distribution of a fast answer, one-hot on the answer of a slow one (the slow
    model gives no distribution; the server's clients always get numbers)."""
    if _from_slow(decision) or decision.probabilities is None:
        return [float(name == decision.answer) for name in names]
    return [float(decision.probabilities.get(name, 0.0)) for name in names]


def _from_slow(decision: Decision) -> bool:
    return decision.escalated or decision.route not in _ROUTES_WITH_DISTRIBUTION


def render_response(
    request: SystemOneRequest, outcome: StagedOutcome, *, total_ms: float, engine: str = "slotgate"
) -> dict[str, Any]:
    """The whole 200 body: ``model``, ``answers`` (request order), ``usage``, ``diagnostics``."""
    answers = {
        q.id: render_answer(q, outcome.decisions[q.id]) if q.id in outcome.decisions else None
        for q in request.questions
    }
    routes = {qid: d.facts() for qid, d in outcome.decisions.items()}
    return {
        "model": request.model if request.model is not None else "slotgate",
        "answers": answers,
        "usage": {
            "input_tokens": 0,
            "output_tokens": 0,
            "decisions": len(outcome.decisions),
            "escalations": sum(d.escalated for d in outcome.decisions.values()),
        },
        "diagnostics": diagnostics(request, outcome, total_ms=total_ms, engine=engine) | {
            "routes": routes},
    }


def diagnostics(request: SystemOneRequest, outcome: StagedOutcome, *, total_ms: float,
                engine: str) -> dict[str, Any]:
    """The server's diagnostics keys, as far as slotgate knows them."""
    steps = dict(request.engine).get("steps", 1)
    policy = ({"mode": "auto"} if request.samples_auto else
              {"mode": "fixed", "n": request.samples})
    fresh = sum(d.route != "cache" for d in outcome.decisions.values())
    return {
        "steps": steps,
        "stages": outcome.stages,
        "skipped": outcome.skipped,
        "conditioning": outcome.conditioning,
        "samples": {"n": request.samples, "policy": policy},
        "timing": {"total_ms": round(total_ms, 3), "reads": fresh},
        "engine": engine,
    }
