"""Span questions (``span`` / ``spans``) on /v1/systemone (slotgate under uvicorn on loopback):
validated as the example server validates them, read by a System One fast tier (the stand-in
over loopback HTTP), routed by
``policy.unscoped``, and escalated to a slow model whose answer must be grounded in the text."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import pytest

from policies.types import DecisionRequest
from router.backends.mock import MockBackend
from router.backends.systemone import SystemOneBackend
from router.settings import Settings
from standins.harness import Reply
from standins.llm import StandinHandle
from standins.systemone_server import SystemOneStandin
from tests.live import LiveServer
from tests.router.http.systemone.test_e2e import MemoryLog, confident
from tests.router.routing.test_slow import ScriptedCompletion, slow_path

INVOICE = "Invoice #A-1042 from Northwind Traders. Total due: $1,234.56 by 2024-03-15."
SPANS = {
    "invoice_id": {"type": "span", "instructions": "the invoice id"},
    "amount": {"type": "span", "instructions": "the total amount due"},
    "dates": {"type": "spans", "instructions": "date"},
}
GROUNDED = json.dumps({"found": True, "text": "A-1042", "start": 9, "end": 15})


@pytest.fixture
def upstream(systemone_standin: SystemOneStandin) -> SystemOneStandin:
    return systemone_standin


@contextlib.asynccontextmanager
async def serving(backend: Any, completion: ScriptedCompletion | None = None, *,
                  slow_settings: dict[str, Any] | None = None, serve_unverified: bool = False,
                  **policy: Any) -> AsyncIterator[httpx.AsyncClient]:
    slow = slow_path(completion or ScriptedCompletion(GROUNDED), **(slow_settings or {}))
    settings = Settings(fast={"timeout_s": 10.0}, policy=policy,
                        slow={"serve_unverified_on_failure": serve_unverified})
    # The app closes the tier's client at shutdown; no warm-up read (the upstream's request
    # counts are the tests' own).
    with LiveServer(settings, backend=backend, slow=slow, decision_log=MemoryLog(),
                    close_backend=True, warm_up=False) as live:
        async with httpx.AsyncClient(base_url=live.url, timeout=10.0) as c:
            yield c


async def test_span_answers_come_back_in_the_servers_shapes_from_the_fast_tier(
    upstream: SystemOneStandin,
) -> None:
    async with serving(SystemOneBackend(upstream.url), unscoped="unverified") as client:
        r = await client.post("/v1/systemone", json={"state": INVOICE, "questions": SPANS})
    assert r.status_code == 200, r.text
    answers = r.json()["answers"]
    assert list(answers) == ["invoice_id", "amount", "dates"]
    span = answers["invoice_id"]
    assert {k: span[k] for k in ("type", "found", "text", "start", "end")} == {
        "type": "span", "found": True, "text": "A-1042", "start": 9, "end": 15}
    assert span["confidence"] == 0.87 and span["coverage"] == 0.99 and span["reads"] == 1
    assert span["route"] == "unverified"
    assert answers["amount"]["text"] == INVOICE[answers["amount"]["start"]:answers["amount"]["end"]]
    assert answers["dates"]["found"] is True
    assert [i["text"] for i in answers["dates"]["items"]] == ["2024-03-15"]
    routes = r.json()["diagnostics"]["routes"]
    assert "span answers carry no guarantee" in routes["invoice_id"]["note"]
    sent = upstream.stats.bodies[-1]
    assert sent["questions"]["dates"] == {"type": "spans", "instructions": "date"}


async def test_offsets_index_the_states_text_field_when_the_state_is_an_object(
    upstream: SystemOneStandin,
) -> None:
    state = {"customer": "Northwind", "text": INVOICE}
    async with serving(SystemOneBackend(upstream.url), unscoped="unverified") as client:
        r = await client.post("/v1/systemone", json={"state": state, "questions": SPANS})
    assert r.status_code == 200, r.text
    span = r.json()["answers"]["invoice_id"]
    assert (span["start"], span["end"]) == (9, 15)
    assert upstream.stats.bodies[-1]["state"] == state  # sent as sent: the same offsets


async def test_span_and_label_questions_answer_together_in_request_order(
    upstream: SystemOneStandin,
) -> None:
    questions = {"amount": SPANS["amount"],
                 "urgent": {"type": "noul", "instructions": "Reply today?"}}
    async with serving(SystemOneBackend(upstream.url), unscoped="unverified") as client:
        r = await client.post("/v1/systemone", json={"state": INVOICE, "questions": questions})
    assert r.status_code == 200, r.text
    body = r.json()
    assert list(body["answers"]) == ["amount", "urgent"]
    assert body["answers"]["urgent"]["type"] == "noul"
    assert body["usage"]["decisions"] == 2


async def test_escalation_asks_the_slow_model_and_checks_its_offsets(
    upstream: SystemOneStandin,
) -> None:
    completion = ScriptedCompletion(GROUNDED)
    async with serving(SystemOneBackend(upstream.url), completion) as client:  # escalate
        r = await client.post("/v1/systemone", json={
            "state": INVOICE, "questions": {"invoice_id": SPANS["invoice_id"]}})
    assert r.status_code == 200, r.text
    span = r.json()["answers"]["invoice_id"]
    assert span["route"] == "slow" and span["text"] == "A-1042" and span["confidence"] == 1.0
    [call] = completion.calls
    assert "the invoice id" in call["messages"][0]["content"]
    assert call["messages"][1]["content"] == INVOICE


async def test_an_ungrounded_slow_span_is_corrected_once_then_a_failed_escalation(
    upstream: SystemOneStandin,
) -> None:
    wrong = json.dumps({"found": True, "text": "A-1042", "start": 3, "end": 9})
    completion = ScriptedCompletion(wrong)
    async with serving(SystemOneBackend(upstream.url), completion) as client:
        r = await client.post("/v1/systemone", json={
            "state": INVOICE, "questions": {"invoice_id": SPANS["invoice_id"]}})
    assert r.status_code == 502, r.text
    message = r.json()["error"]["message"]
    assert "no grounded span answer" in message and "is not the text at [3, 9)" in message
    assert len(completion.calls) == 2  # the answer, then one corrective retry


async def test_every_item_of_a_slow_spans_answer_must_be_grounded(
    upstream: SystemOneStandin,
) -> None:
    items = [{"text": "2024-03-15", "start": 64, "end": 74},
             {"text": "Northwind", "start": 0, "end": 9}]
    completion = ScriptedCompletion(json.dumps({"items": items}))
    async with serving(SystemOneBackend(upstream.url), completion) as client:
        r = await client.post("/v1/systemone", json={
            "state": INVOICE, "questions": {"dates": SPANS["dates"]}})
    assert r.status_code == 502
    assert "items[1] text 'Northwind'" in r.json()["error"]["message"]


async def test_a_fast_tier_that_reads_no_spans_sends_them_to_the_slow_model() -> None:
    asked: list[DecisionRequest] = []

    def handler(request: DecisionRequest) -> Sequence[float]:
        asked.append(request)
        return confident(request)

    async with serving(MockBackend(handler), unscoped="unverified") as client:
        r = await client.post("/v1/systemone", json={
            "state": INVOICE, "questions": {"invoice_id": SPANS["invoice_id"]}})
    assert r.status_code == 200, r.text
    assert r.json()["answers"]["invoice_id"]["route"] == "slow"
    note = r.json()["diagnostics"]["routes"]["invoice_id"]["note"]
    assert "the fast tier (mock) reads no span questions" in note
    assert asked == []


async def test_threshold_holds_the_servers_span_confidence_to_the_bar(
    upstream: SystemOneStandin,
) -> None:
    questions = {"invoice_id": SPANS["invoice_id"],
                 "vague": {"type": "span", "instructions": "unsure"}}
    completion = ScriptedCompletion(json.dumps({"found": False}))
    async with serving(SystemOneBackend(upstream.url), completion, unscoped="threshold",
                       fallback_threshold=0.8) as client:
        r = await client.post("/v1/systemone", json={"state": INVOICE, "questions": questions})
    assert r.status_code == 200, r.text
    answers = r.json()["answers"]
    assert answers["invoice_id"]["route"] == "fast"  # 0.87 >= 0.8
    assert answers["vague"]["route"] == "slow" and answers["vague"]["found"] is False
    assert "span confidence 0.200 < threshold 0.800" in (
        r.json()["diagnostics"]["routes"]["vague"]["note"])


@pytest.mark.parametrize(("question", "message"), [
    ({"type": "span", "criteria": [24]},
     'question \'x\': span criteria must be an object, e.g. {"max_tokens": 24}'),
    ({"type": "span", "criteria": {"max_tokens": 97}}, "question 'x': max_tokens must be 1 to 96"),
    ({"type": "spans", "criteria": {"max_items": 0}}, "question 'x': max_items must be 1 to 64"),
    ({"type": "spans", "criteria": {"max_items": True}}, "question 'x': max_items must be 1 to 64"),
    ({"type": "span", "depends_on": ["y"]},
     "question 'x': a span question cannot depend on another question"),
])
async def test_span_criteria_are_refused_with_the_servers_messages(
    upstream: SystemOneStandin, question: dict[str, Any], message: str,
) -> None:
    body = {"state": INVOICE, "questions": {"x": question, "y": SPANS["amount"]}}
    async with serving(SystemOneBackend(upstream.url), unscoped="unverified") as client:
        r = await client.post("/v1/systemone", json=body)
    assert (r.status_code, r.json()["error"]["message"]) == (422, message)
    async with httpx.AsyncClient() as plain:  # the stand-in agrees
        direct = await plain.post(f"{upstream.url}/v1/systemone", json=body)
    assert (direct.status_code, direct.json()["error"]["message"]) == (422, message)


async def test_no_question_may_depend_on_a_span_question_and_spans_need_text(
    upstream: SystemOneStandin,
) -> None:
    async with serving(SystemOneBackend(upstream.url), unscoped="unverified") as client:
        r = await client.post("/v1/systemone", json={"state": INVOICE, "questions": {
            "amount": SPANS["amount"],
            "big": {"type": "noul", "instructions": "Large?", "depends_on": ["amount"]}}})
        assert r.status_code == 422
        assert r.json()["error"]["message"] == (
            "question 'big': cannot depend on the span question 'amount'")
        r = await client.post("/v1/systemone", json={"state": {"text": " "},
                                                      "questions": {"amount": SPANS["amount"]}})
    assert (r.status_code, r.json()["error"]["message"]) == (
        422, "a span question needs a text state to point into")


async def test_the_chat_variant_refuses_span_questions_by_name() -> None:
    schema = {"questions": [{"id": "amount", "type": "span", "instructions": "the amount"}]}
    async with serving(MockBackend(confident)) as client:
        r = await client.post("/v1/chat/completions", json={"messages": [
            {"role": "system", "content": json.dumps(schema)},
            {"role": "user", "content": json.dumps({"text": INVOICE})}]})
    assert r.status_code == 400
    assert "span questions are answered on /v1/systemone only" in r.json()["error"]["message"]


async def test_a_fast_span_off_its_offsets_is_a_failed_read_and_escalates(
    upstream: SystemOneStandin,
) -> None:
    off = {"type": "span", "found": True, "text": "A-1042", "start": 0, "end": 6,
           "confidence": 0.9, "coverage": 0.9, "reads": 1}
    upstream.faults.append(Reply(200, {"model": "dgemma", "answers": {"invoice_id": off}}))
    async with serving(SystemOneBackend(upstream.url), unscoped="unverified") as client:
        r = await client.post("/v1/systemone", json={
            "state": INVOICE, "questions": {"invoice_id": SPANS["invoice_id"]}})
    assert r.status_code == 200, r.text
    assert r.json()["answers"]["invoice_id"]["route"] == "slow"
    note = r.json()["diagnostics"]["routes"]["invoice_id"]["note"]
    assert "the fast read failed: answers['invoice_id']: text 'A-1042' is not the text at [0, 6)" in note


async def test_a_failed_span_escalation_reads_the_fast_tier_late_when_told_to_serve_it(
    upstream: SystemOneStandin,
) -> None:
    completion = ScriptedCompletion("not json")
    async with serving(SystemOneBackend(upstream.url), completion,
                       serve_unverified=True) as client:  # escalate: no read made first
        before = upstream.stats.requests
        r = await client.post("/v1/systemone", json={
            "state": INVOICE, "questions": {"invoice_id": SPANS["invoice_id"]}})
    assert r.status_code == 200, r.text
    answer = r.json()["answers"]["invoice_id"]
    assert answer["route"] == "unverified" and answer["text"] == "A-1042"
    assert upstream.stats.requests == before + 1  # read once, after the slow model failed
    note = r.json()["diagnostics"]["routes"]["invoice_id"]["note"]
    assert "it is not JSON" in note and "the fast answer was not verified" in note


async def test_a_span_escalation_through_litellm_to_the_stand_in_llm(
    upstream: SystemOneStandin, standin: StandinHandle,
) -> None:
    settings = Settings(fast={"timeout_s": 10.0}, slow={
        "model": "openai/standin", "api_base": standin.api_base, "api_key": "sk-test-standin-key"})
    body = {"state": {"customer": "Northwind", "text": INVOICE}, "questions": {
        "invoice_id": SPANS["invoice_id"], "dates": SPANS["dates"]}}
    with LiveServer(settings, backend=SystemOneBackend(upstream.url),
                    decision_log=MemoryLog()) as live:
        async with httpx.AsyncClient(base_url=live.url, timeout=10.0) as client:
            r = await client.post("/v1/systemone", json=body)
    assert r.status_code == 200, r.text
    answers = r.json()["answers"]
    assert answers["invoice_id"]["route"] == "slow"
    assert (answers["invoice_id"]["text"], answers["invoice_id"]["start"]) == ("A-1042", 9)
    assert [i["start"] for i in answers["dates"]["items"]] == [INVOICE.index("2024-03-15")]
    assert {c["body"]["response_format"]["type"] for c in standin.calls()} == {"json_object"}


async def test_a_span_question_with_no_slow_model_to_escalate_to_is_a_503_saying_why() -> None:
    with LiveServer(Settings(), backend=MockBackend(confident), decision_log=MemoryLog()) as live:
        async with httpx.AsyncClient(base_url=live.url, timeout=10.0) as client:
            r = await client.post("/v1/systemone", json={
                "state": INVOICE, "questions": {"invoice_id": SPANS["invoice_id"]}})
    assert r.status_code == 503
    message = r.json()["error"]["message"]
    assert "the fast tier (mock) reads no span questions" in message
