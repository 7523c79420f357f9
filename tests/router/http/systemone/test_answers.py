"""Rendering System One answers in the example server's shapes, with slotgate's routing facts."""

from __future__ import annotations

import math
from typing import Any

import pytest

from policies.types import Decision, DecisionRequest
from router.http.systemone.answers import render_answer, render_response
from router.routing.stages import run_stages
from tests.router.routing.test_stages import CHAIN, ScriptedDecide, decision, parse


def one(question: dict[str, Any]):  # type: ignore[no-untyped-def]
    parsed = parse({"state": "s", "questions": {"q": question}})
    q = parsed.questions[0]
    return q, DecisionRequest("q", "", q.options, "s", kind=q.kind)


def test_noul_shape_uses_the_calibrated_yes_probability() -> None:
    q, req = one({"type": "noul"})
    out = render_answer(q, decision(req, "yes", proba={"yes": 0.8, "no": 0.2}))
    assert out == {"type": "noul", "noul": 0.8, "answer": "yes", "route": "fast", "confidence": 0.8}


def test_choice_shape() -> None:
    q, req = one({"type": "choice", "criteria": {"a": None, "b": None, "c": None}})
    proba = {"a": 0.1, "b": 0.7, "c": 0.2}
    out = render_answer(q, decision(req, "b", proba=proba))
    assert out is not None
    assert out["choice"] == "b" and out["probabilities"] == proba and out["confidence"] == 0.7
    assert list(out["probabilities"]) == ["a", "b", "c"]


def test_score_shape_is_zero_indexed_expectation() -> None:
    q, req = one({"type": "score", "criteria": ["low", "mid", "high"]})
    out = render_answer(q, decision(req, "high", proba={"low": 0.2, "mid": 0.3, "high": 0.5}))
    assert out is not None
    assert math.isclose(out["score"], 0 * 0.2 + 1 * 0.3 + 2 * 0.5)
    assert out["legend"] == {"0": "low", "1": "mid", "2": "high"}
    assert out["probabilities"] == {"0": 0.2, "1": 0.3, "2": 0.5}
    assert out["confidence"] == 0.5 and out["answer"] == "high"


@pytest.mark.parametrize(
    ("question", "answer", "key", "value"),
    [
        ({"type": "noul"}, "yes", "noul", 1.0),
        ({"type": "noul"}, "no", "noul", 0.0),
        ({"type": "score", "criteria": ["low", "mid", "high"]}, "mid", "score", 1.0),
        ({"type": "choice", "criteria": {"a": None, "b": None}}, "b", "choice", "b"),
    ],
)
def test_slow_answers_carry_one_hot_numbers_that_agree_with_the_answer(
    question: dict[str, Any], answer: str, key: str, value: Any
) -> None:
    """Clients of the example server always get numbers: a slow answer is one-hot on the slow
    model's answer, confidence 1.0, and its route says whose numbers they are."""
    q, req = one(question)
    # Even if the service left the fast read's distribution on a slow decision, it is not shown.
    out = render_answer(q, decision(req, answer, route="slow",
                                    proba={n: 1 / len(q.options) for n in q.answer_names}))
    assert out is not None
    assert out[key] == value and out["route"] == "slow" and out["confidence"] == 1.0
    if q.kind != "noul":
        shown = list(out["probabilities"].values())
        assert shown == [float(n == answer) for n in q.answer_names]


def test_unanswered_decision_renders_null() -> None:
    q, req = one({"type": "noul"})
    assert render_answer(q, decision(req, None, route="none")) is None


async def test_response_usage_and_route_facts() -> None:
    parsed = parse({"model": "jev-latest", **CHAIN})
    outcome = await run_stages(parsed.staged(), ScriptedDecide(
        {"money": "yes", "kind": "charge", "severity": "high", "escalate": "no"}))
    body = render_response(parsed, outcome, total_ms=12.34567)
    assert body["model"] == "jev-latest"
    assert body["usage"] == {"input_tokens": 0, "output_tokens": 0, "decisions": 4,
                             "escalations": 0}
    assert body["diagnostics"]["routes"]["kind"]["decision_id"] == "d-kind"
    assert body["diagnostics"]["timing"] == {"total_ms": 12.346, "reads": 4}
    assert {"steps", "stages", "skipped", "samples", "timing", "engine"} <= set(body["diagnostics"])
    assert body["diagnostics"]["samples"] == {"n": 3, "policy": {"mode": "fixed", "n": 3}}


def test_cache_route_shows_the_distribution_only_for_a_cached_fast_read() -> None:
    q, req = one({"type": "noul"})
    proba = {"yes": 0.6, "no": 0.4}
    cached_slow = decision(req, "yes", route="cache", proba=proba, escalated=True)
    assert render_answer(q, cached_slow)["noul"] == 1.0  # type: ignore[index]
    fast = Decision(decision_id="d", question_id="q", answer="yes", route="cache",
                    probability=0.95, raw_probability=0.9, threshold=0.9, policy_id="p",
                    latency_ms=1.0, probabilities={"yes": 0.95, "no": 0.05})
    out = render_answer(q, fast)
    assert out is not None and out["noul"] == 0.95 and out["confidence"] == 0.95
    no_bar = Decision(decision_id="d", question_id="q", answer="no", route="cache",
                      probability=0.4, raw_probability=0.4, threshold=None, policy_id="p",
                      latency_ms=1.0, probabilities=proba, escalated=True)
    assert render_answer(q, no_bar)["confidence"] == 1.0  # type: ignore[index]


