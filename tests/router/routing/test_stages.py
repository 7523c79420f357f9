"""Answering a body in stages (``router.routing.stages``): ask_if between stages, cascading
skips, one decide call per stage, and a body read whole by a server that runs the stages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from policies.types import Decision, DecisionRequest, OptionScores, Route, StagedQuestion
from router.http.systemone.answers import render_response
from router.http.systemone.wire import parse_request
from router.routing.service import FastRead
from router.routing.stages import run_stages


def decision(request: DecisionRequest, answer: str | None, *, route: Route = "fast",
             proba: dict[str, float] | None = None, escalated: bool | None = None) -> Decision:
    return Decision(
        decision_id=f"d-{request.question_id}", question_id=request.question_id, answer=answer,
        route=route, probability=None if proba is None or answer is None else proba[answer],
        raw_probability=None, threshold=0.9, policy_id="p", latency_ms=1.0, probabilities=proba,
        escalated=route == "slow" if escalated is None else escalated,
    )


class ScriptedDecide:
    """Answers each question with a fixed answer; records every call (one per stage)."""

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers = answers
        self.calls: list[list[DecisionRequest]] = []
        self.reads: list[list[FastRead] | None] = []

    async def __call__(self, requests: Sequence[DecisionRequest],
                       reads: Sequence[FastRead] | None = None) -> list[Decision]:
        self.calls.append(list(requests))
        self.reads.append(None if reads is None else list(reads))
        return [decision(r, self.answers[r.question_id]) for r in requests]


CHAIN = {
    "state": "My card was charged twice.",
    "instructions": "You triage bank tickets.",
    "seed": 5,
    "samples": 3,
    "questions": {
        "money": {"type": "noul", "instructions": "About money?"},
        "kind": {"type": "choice", "criteria": {"charge": None, "refund": None, "fraud": None},
                 "ask_if": {"money": ["yes"]}},
        "severity": {"type": "score", "criteria": ["low", "high"],
                     "ask_if": {"kind": ["fraud", "charge"]}},
        "escalate": {"type": "noul", "ask_if": {"severity": ["high"], "money": ["yes"]}},
    },
}


def parse(payload: dict[str, Any]):  # type: ignore[no-untyped-def]
    return parse_request(payload, max_questions=64, max_options=1024)


async def test_chain_asked_all_the_way() -> None:
    parsed = parse(CHAIN)
    decide = ScriptedDecide({"money": "yes", "kind": "charge", "severity": "high", "escalate": "no"})
    outcome = await run_stages(parsed.staged(), decide)
    assert outcome.stages == [["money"], ["kind"], ["severity"], ["escalate"]]
    assert outcome.skipped == {}
    first = decide.calls[0][0]
    assert (first.state, first.context, first.kind, first.samples, first.seed) == (
        "My card was charged twice.", "You triage bank tickets.", "noul", 3, 5)
    assert decide.calls[1][0].option_names == ("charge", "refund", "fraud")
    assert decide.calls[2][0].kind == "score" and decide.calls[2][0].option_names == ("low", "high")


async def test_skip_cascades_with_was_null() -> None:
    decide = ScriptedDecide({"money": "no"})
    outcome = await run_stages(parse(CHAIN).staged(), decide)
    assert [[r.question_id for r in call] for call in decide.calls] == [["money"]]
    assert outcome.skipped == {
        "kind": {"because": "money", "was": "no", "wanted": ["yes"]},
        "severity": {"because": "kind", "was": None, "wanted": ["fraud", "charge"]},
        "escalate": {"because": "severity", "was": None, "wanted": ["high"]},
    }
    body = render_response(parse(CHAIN), outcome, total_ms=2.5)
    assert body["answers"]["kind"] is None and body["answers"]["escalate"] is None
    assert body["answers"]["money"]["noul"] == 0.0  # scripted with no distribution
    assert body["diagnostics"]["stages"] == [["money"]]
    assert list(body["answers"]) == ["money", "kind", "severity", "escalate"]


async def test_partial_chain_one_asked_one_skipped() -> None:
    decide = ScriptedDecide({"money": "yes", "kind": "refund"})
    outcome = await run_stages(parse(CHAIN).staged(), decide)
    assert set(outcome.decisions) == {"money", "kind"}
    assert outcome.skipped["severity"] == {"because": "kind", "was": "refund",
                                           "wanted": ["fraud", "charge"]}
    assert outcome.skipped["escalate"]["was"] is None


async def test_one_stage_is_one_decide_call() -> None:
    payload = {"state": "s", "questions": {f"q{i}": {"type": "noul"} for i in range(5)}}
    decide = ScriptedDecide({f"q{i}": "yes" for i in range(5)})
    await run_stages(parse(payload).staged(), decide)
    assert len(decide.calls) == 1 and len(decide.calls[0]) == 5


def server_read(question: StagedQuestion, server_answers: dict[str, str | None]) -> FastRead:
    """A read of the whole body as the server made it: 0.8 on its answer, or skipped."""
    answer = server_answers[question.request.question_id]
    if answer is None:
        return FastRead(None, cached=False)
    names = question.request.option_names
    rest = 0.2 / (len(names) - 1)
    return FastRead(OptionScores(names, tuple(0.8 if n == answer else rest for n in names)),
                    cached=False)


def staged_reader(server_answers: dict[str, str | None], *, fail: bool = False):  # type: ignore[no-untyped-def]
    asked: list[list[StagedQuestion]] = []

    async def read_staged(questions: Sequence[StagedQuestion]) -> list[FastRead]:
        asked.append(list(questions))
        if fail:
            return [FastRead(None, cached=False, failure="fast backend failed (x)")
                    for _ in questions]
        return [server_read(q, server_answers) for q in questions]

    return read_staged, asked


async def test_staged_reads_are_routed_on_while_the_answers_agree() -> None:
    server = {"money": "yes", "kind": "charge", "severity": "high", "escalate": "no"}
    read_staged, asked = staged_reader(server)
    decide = ScriptedDecide(dict(server))
    outcome = await run_stages(parse(CHAIN).staged(), decide, read_staged)
    assert len(asked) == 1 and [q.request.question_id for q in asked[0]] == list(server)
    assert [q.ask_if for q in asked[0]][1] == (("money", ("yes",)),)
    assert all(r is not None and r[0].scores is not None for r in decide.reads)
    assert outcome.stages == [["money"], ["kind"], ["severity"], ["escalate"]]


async def test_a_changed_skip_makes_later_reads_unusable() -> None:
    """The server answered money = no and skipped the rest; the routed answer is yes, so kind is
    asked: the server has no read of it, and none of what follows continued yes."""
    read_staged, _ = staged_reader({"money": "no", "kind": None, "severity": None,
                                    "escalate": None})
    decide = ScriptedDecide({"money": "yes", "kind": "refund"})
    outcome = await run_stages(parse(CHAIN).staged(), decide, read_staged)
    assert outcome.stages == [["money"], ["kind"]]
    [kind_read] = decide.reads[1] or []
    assert kind_read.scores is None and kind_read.failure == (
        "no fast read fits: the server's read continued money = 'no', but the answer given "
        "is 'yes'")


async def test_failed_staged_reads_are_failures_not_divergences() -> None:
    read_staged, _ = staged_reader({}, fail=True)
    decide = ScriptedDecide({"money": "yes", "kind": "charge", "severity": "low"})
    await run_stages(parse(CHAIN).staged(), decide, read_staged)
    assert all(r.failure == "fast backend failed (x)" for reads in decide.reads for r in reads or [])


async def test_one_stage_is_not_read_staged() -> None:
    read_staged, asked = staged_reader({})
    payload = {"state": "s", "questions": {"a": {"type": "noul"}, "b": {"type": "noul"}}}
    await run_stages(parse(payload).staged(), ScriptedDecide({"a": "yes", "b": "no"}), read_staged)
    assert asked == []
