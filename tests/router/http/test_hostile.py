"""Hostile bodies against the whole proxy (uvicorn on loopback, the real SlowPath to the stand-in
LLM): JSON nested past Python's recursion limit in any place a client or the slow model controls
is a clear error naming the field (4xx for the client's, 502 for the slow model's), never a 500;
routing headers stay small whatever the options are."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.backends.mock import MockBackend
from router.settings import Settings
from standins.llm import StandinHandle
from tests.router.http.test_app import INTENTS, Recorder, Server, enum_format, settings_for

DEEP = "[" * 5000 + "]" * 5000  # about 10 KB of text; Python's json parser gives up at ~1,000


def nested_schema(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


@pytest.fixture(scope="module")
def server(standin: StandinHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    settings = settings_for(standin, tmp_path_factory.mktemp("hostile"), max_options=50)
    with Server(settings, backend=MockBackend(Recorder())) as running:
        yield running


@pytest.fixture
def http(server: Server, standin: StandinHandle) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=20) as client:
        yield client


def chat_variant(system: str, user: str) -> dict[str, Any]:
    return {"messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}


SCHEMA = json.dumps({"questions": [{"id": "urgent", "type": "noul",
                                    "instructions": "Needs a reply within the hour?"}]})


def test_deeply_nested_schema_in_the_system_message_is_a_400_naming_it(
    http: httpx.Client, standin: StandinHandle
) -> None:
    for deep_schema in (SCHEMA[:-1] + ', "notes": ' + DEEP + "}",  # past the C parser's 1,024
                        SCHEMA[:-1] + ', "notes": ' + json.dumps(nested_schema(200)) + "}"):
        reply = http.post("/v1/chat/completions", json=chat_variant(deep_schema, '{"text": "hi"}'))
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["param"] == "messages.0.content"
        assert "nested more than 128 levels deep" in error["message"]
    assert standin.calls() == []


def test_a_deep_json_document_in_the_system_message_passes_through_unchanged(
    http: httpx.Client, standin: StandinHandle
) -> None:
    """Beside a JSON user message, a system message of JSON that is no question schema is no
    decision: slotgate does not parse it, so its depth is the slow model's business."""
    documents = [json.dumps(nested_schema(200)), DEEP,
                 json.dumps({"doc": nested_schema(200), "questions": "not an array"})]
    for document in documents:
        body = {"model": "any", **chat_variant(document, '{"text": "hi"}')}
        reply = http.post("/v1/chat/completions", json=body)
        assert reply.status_code == 200, reply.text
        assert "slotgate" not in reply.json()  # answered by the slow model, not decided
    sent = [call["body"]["messages"] for call in standin.calls()]
    assert sent == [chat_variant(d, '{"text": "hi"}')["messages"] for d in documents]


def test_deeply_nested_chat_variant_state_is_a_400_naming_it(http: httpx.Client) -> None:
    reply = http.post("/v1/chat/completions", json=chat_variant(SCHEMA, DEEP))
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "messages.1.content"
    assert "nested more than 128 levels deep" in error["message"]


def test_deeply_nested_passthrough_schema_is_a_400_naming_it(
    http: httpx.Client, standin: StandinHandle
) -> None:
    body = {"model": "any", "messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "deep", "schema": nested_schema(300)}}}
    reply = http.post("/v1/chat/completions", json=body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "response_format.json_schema.schema"
    assert error["message"] == (
        "response_format.json_schema.schema: JSON nested more than 128 levels deep")
    assert standin.calls() == []


def test_slow_model_answering_nested_arrays_is_a_502(
    http: httpx.Client, standin: StandinHandle
) -> None:
    standin.set_mode("nested")
    body = {"model": "any", "response_format": enum_format(INTENTS),
            "messages": [{"role": "user", "content": "which one, I wonder"}]}
    reply = http.post("/v1/chat/completions", json=body)
    assert reply.status_code == 502, reply.text
    assert reply.json()["error"]["type"] == "upstream_error"


def test_deeply_nested_body_is_a_400_naming_the_field(
    http: httpx.Client, standin: StandinHandle
) -> None:
    # Past 1,024 levels (where the C parser stops) the path is unknown: "body".
    for nested, field in (("[" * 900 + "]" * 900, "metadata.0.0"), (DEEP, "body")):
        body = ('{"model": "any", "messages": [{"role": "user", "content": "hi"}], "metadata": '
                + nested + "}")
        reply = http.post("/v1/chat/completions", content=body,
                          headers={"content-type": "application/json"})
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["param"] == field
    assert standin.calls() == []


def test_nesting_within_the_bound_is_answered(http: httpx.Client, standin: StandinHandle) -> None:
    body = {"model": "any", "messages": [{"role": "user", "content": "hi"}],
            "metadata": json.loads("[" * 120 + "]" * 120)}
    reply = http.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    assert len(standin.calls()) == 1


def test_note_header_stays_small_with_huge_options(
    standin: StandinHandle, tmp_path: Path
) -> None:
    settings = Settings(log={"decision_log_path": tmp_path / "decisions.jsonl"},
                        policy={"unscoped": "unverified"})
    big = ["a" * 400_000, "b" * 400_000]
    body = {"model": "any", "response_format": enum_format(big, name="huge"),
            "messages": [{"role": "user", "content": "either"}]}
    with Server(settings, backend=MockBackend(Recorder())) as running:
        reply = httpx.post(f"{running.url}/v1/chat/completions", json=body, timeout=20)
    assert reply.status_code == 200, reply.text
    note = reply.headers["x-slotgate-note"]
    assert len(note) == 1024 and note.endswith("...")
    assert reply.json()["slotgate"]["note"].startswith(note[:-3])


def test_decision_id_header_is_whole_or_absent(http: httpx.Client) -> None:
    """Every id in ``x-slotgate-decision-id`` is a whole id: past 1,024 characters (40 ids of
    32 hex characters) the header is left out, and the body carries them all."""
    for n_questions, in_header in ((20, True), (40, False)):
        schema = {"type": "object",
                  "properties": {f"q{i}": {"type": "string", "enum": ["yes", "no"]}
                                 for i in range(n_questions)}}
        body = {"model": "any", "messages": [{"role": "user", "content": "sure"}],
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": "many", "schema": schema}}}
        reply = http.post("/v1/chat/completions", json=body)
        assert reply.status_code == 200, reply.text
        facts = reply.json()["slotgate"]
        ids = [d["decision_id"] for d in facts["decisions"]]
        assert len(ids) == n_questions and facts["decision_id"] == ",".join(ids)
        if in_header:
            assert reply.headers["x-slotgate-decision-id"] == facts["decision_id"]
        else:
            assert "x-slotgate-decision-id" not in reply.headers
        assert reply.headers["x-slotgate-route"] == "fast"
