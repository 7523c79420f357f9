"""Render the example server's answer shapes for a System One body answered in stages
(``router.routing.stages``), each answer with slotgate's route and calibrated confidence.

Answer fields (the example server's shapes, plus ``answer``, ``route`` and ``confidence``; a
span answer is the server's shape plus ``route``, its numbers the server's own, or 1.0 from the
slow model, ``router.routing.spans``):

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
- ``diagnostics`` has the server's ``steps``, ``thought`` (a System One fast tier's, for
  ``think``), ``stages``, ``skipped``, ``conditioning``,
  ``samples``, ``timing`` (``total_ms``, ``reads``: answers not served from the cache) and
  ``engine`` (``slotgate:<fast backend>``), plus ``routes`` (each decision's routing facts).
"""

from __future__ import annotations

import json
from typing import Any

from policies.types import Decision
from router.http.systemone.wire import Question, SystemOneRequest
from router.routing.spans import SpanDecision
from router.routing.stages import StagedOutcome

# Routes whose answer is the fast read's, so the calibrated distribution describes it.
_ROUTES_WITH_DISTRIBUTION = frozenset({"fast", "unverified", "cache"})


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
    request: SystemOneRequest, outcome: StagedOutcome, *, total_ms: float,
    engine: str = "slotgate", spans: dict[str, SpanDecision] | None = None,
) -> dict[str, Any]:
    """The whole 200 body: ``model``, ``answers`` (request order), ``usage``, ``diagnostics``.
    A span answer is the server's shape plus ``route``."""
    spans = spans or {}
    answers = {
        q.id: render_answer(q, outcome.decisions[q.id]) if q.id in outcome.decisions else None
        for q in request.questions
    } | {qid: s.answer.render() | {"route": s.decision.route} for qid, s in spans.items()}
    if request.order:
        answers = {qid: answers.get(qid) for qid in request.order}
    decisions = [*outcome.decisions.values(), *(s.decision for s in spans.values())]
    routes = {d.question_id: d.facts() for d in decisions}
    return {
        "model": request.model if request.model is not None else "slotgate",
        "answers": answers,
        "usage": {
            "input_tokens": 0,
            "output_tokens": 0,
            "decisions": len(decisions),
            "escalations": sum(d.escalated for d in decisions),
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
    thoughts = list({json.dumps(d.thought, sort_keys=True): d.thought
                     for d in outcome.decisions.values() if d.thought is not None}.values())
    return {
        "steps": steps,
        # The server's thought for ``think``: one, or one per read that wrote one; none from
        # the cache (a cached read's thought is not kept).
        "thought": thoughts[0] if len(thoughts) == 1 else thoughts or None,
        "stages": outcome.stages,
        "skipped": outcome.skipped,
        "conditioning": outcome.conditioning,
        "samples": {"n": request.samples, "policy": policy},
        "timing": {"total_ms": round(total_ms, 3), "reads": fresh},
        "engine": engine,
    }
