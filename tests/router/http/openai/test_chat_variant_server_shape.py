"""The chat variant as the vLLM example server (structured_server.py) answers it: ``ask`` picks
the questions read (an unknown id is its 400), ``response_format: json_object`` does not make it
an ordinary chat, non-string instructions and descriptions reach the fast tier as the server
prints them (``str()``, a falsy description skipped; a question's non-string instructions on
/v1/systemone as ``json.dumps`` with ASCII escapes), and every answer carries ``stderr`` and
``agreement`` (null: slotgate's reads are not a set of draws)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import pytest

from policies.types import DecisionRequest
from router.backends.mock import MockBackend
from router.http.app import create_app
from router.settings import Settings
from tests.router.http.systemone.test_e2e import MemoryLog, RecordingSlow, confident

SCHEMA: dict[str, Any] = {
    "questions": [
        {"id": "urgent", "type": "noul", "instructions": "Needs a reply today?"},
        {"id": "bucket", "type": "choice", "instructions": "Which queue?",
         "options": [{"name": "card", "description": 0}, {"name": "fraud",
                                                           "description": {"k": "é"}}]},
        {"id": "tone", "type": "score", "instructions": {"ask": "How upset?", "n": 1},
         "levels": ["calm", "high"]},
    ],
    "instructions": True,
}
STATE = '{"ticket": "Someone used my card"}'


@pytest.fixture
async def http() -> AsyncIterator[tuple[httpx.AsyncClient, list[DecisionRequest]]]:
    seen: list[DecisionRequest] = []

    def handler(request: DecisionRequest) -> Sequence[float]:
        seen.append(request)
        return confident(request)

    settings = Settings.model_validate({"policy": {"fallback_threshold": 0.9}})
    app = create_app(settings, backend=MockBackend(handler), slow=RecordingSlow(),
                     decision_log=MemoryLog())
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://test/v1") as client:
        yield client, seen


def chat(schema: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "dgemma", "messages": [{"role": "system", "content": json.dumps(schema)},
                                            {"role": "user", "content": STATE}], **extra}


def answers(reply: httpx.Response) -> dict[str, Any]:
    assert reply.status_code == 200, reply.text
    return dict(json.loads(reply.json()["choices"][0]["message"]["content"])["answers"])


async def test_ask_picks_the_questions_read(
    http: tuple[httpx.AsyncClient, list[DecisionRequest]],
) -> None:
    client, seen = http
    got = answers(await client.post("/chat/completions", json=chat({**SCHEMA, "ask": ["bucket"]})))
    assert list(got) == ["bucket"] and [r.question_id for r in seen] == ["bucket"]


async def test_ask_naming_an_unknown_question_is_the_servers_400(
    http: tuple[httpx.AsyncClient, list[DecisionRequest]],
) -> None:
    client, seen = http
    reply = await client.post("/chat/completions", json=chat({**SCHEMA, "ask": ["nope"]}))
    assert reply.status_code == 400
    assert "ask must list question ids from this schema" in reply.json()["error"]["message"]
    assert seen == []


async def test_json_object_response_format_is_still_the_variant(
    http: tuple[httpx.AsyncClient, list[DecisionRequest]],
) -> None:
    client, seen = http
    body = chat(SCHEMA, response_format={"type": "json_object"})
    assert set(answers(await client.post("/chat/completions", json=body))) == {
        "urgent", "bucket", "tone"}
    assert len(seen) == 3


async def test_every_answer_carries_stderr_and_agreement(
    http: tuple[httpx.AsyncClient, list[DecisionRequest]],
) -> None:
    client, _ = http
    for answer in answers(await client.post("/chat/completions", json=chat(SCHEMA))).values():
        assert "stderr" in answer and "agreement" in answer


async def test_non_string_text_reaches_the_fast_tier_as_the_server_prints_it(
    http: tuple[httpx.AsyncClient, list[DecisionRequest]],
) -> None:
    client, seen = http
    answers(await client.post("/chat/completions", json=chat(SCHEMA)))
    by_id = {r.question_id: r for r in seen}
    assert by_id["urgent"].context == "True"  # str(True), not JSON's true
    assert by_id["tone"].instructions == str({"ask": "How upset?", "n": 1})  # a Python repr
    card, fraud = by_id["bucket"].options
    assert card.description is None  # a falsy description is skipped
    assert fraud.description == "{'k': 'é'}"
    seen.clear()
    falsy = {**SCHEMA, "instructions": 0}
    answers(await client.post("/chat/completions", json=chat(falsy)))
    assert {r.context for r in seen} == {""}


async def test_systemone_question_instructions_are_json_with_ascii_escapes(
    http: tuple[httpx.AsyncClient, list[DecisionRequest]],
) -> None:
    client, seen = http
    body = {"state": STATE, "instructions": {"team": "é"}, "questions": {
        "urgent": {"type": "noul", "instructions": {"ask": "Réponse?"}}}}
    reply = await client.post("/systemone", json=body)
    assert reply.status_code == 200, reply.text
    [request] = seen
    assert request.instructions == json.dumps({"ask": "Réponse?"})  # "R\\u00e9ponse?"
    assert request.context == str({"team": "é"})
