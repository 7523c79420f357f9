"""Answer a validated System One request stage by stage (``ask_if`` evaluated between stages) and
render the example server's answer shapes, each with slotgate's route and calibrated confidence.

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
- ``diagnostics`` has the server's ``steps``, ``stages``, ``skipped``, ``samples``, ``timing``
  (``total_ms``, ``reads``: answers not served from the cache) and ``engine`` (``slotgate:<fast backend>``), plus
  ``routes`` (each decision's routing facts).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from policies.types import Decision, DecisionRequest
from router.http.systemone.wire import Question, SystemOneRequest

Decide = Callable[[Sequence[DecisionRequest]], Awaitable[list[Decision]]]

# Routes whose answer is the fast read's, so the calibrated distribution describes it.
_ROUTES_WITH_DISTRIBUTION = frozenset({"fast", "unverified", "cache"})


@dataclass
class StagedOutcome:
    """What running the stages produced: a decision per asked question, a reason per skipped one,
    and the ids asked in each stage that asked anything."""

    decisions: dict[str, Decision] = field(default_factory=dict)
    skipped: dict[str, dict[str, Any]] = field(default_factory=dict)
    stages: list[list[str]] = field(default_factory=list)


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
        engine=request.engine,
    )


async def run_stages(request: SystemOneRequest, decide: Decide) -> StagedOutcome:
    """Ask each stage's questions whose ``ask_if`` holds in one ``decide`` call, in stage order."""
    outcome = StagedOutcome()
    answers: dict[str, str | None] = {}
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
        if not asked:
            continue
        decisions = await decide([decision_request(request, q) for q in asked])
        for question, decision in zip(asked, decisions, strict=True):
            outcome.decisions[question.id] = decision
            answers[question.id] = decision.answer
        outcome.stages.append([q.id for q in asked])
    return outcome


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
        "samples": {"n": request.samples, "policy": policy},
        "timing": {"total_ms": round(total_ms, 3), "reads": fresh},
        "engine": engine,
    }
