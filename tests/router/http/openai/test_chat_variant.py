"""The vLLM example server's own chat-shaped decision call (system = the schema JSON with
``questions``, user = the state JSON) answered as that server answers it, through the OpenAI SDK
unchanged: a client written for the example server works against slotgate."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest

from tests.router.http.systemone.test_e2e import RecordingSlow, make_app

SCHEMA = {
    "questions": [
        {"id": "urgent", "type": "noul", "instructions": "Needs a reply today?",
         "criteria": {"true": "act now", "false": "can wait"}},
        {"id": "bucket", "type": "choice", "instructions": "Which queue?",
         "options": [{"name": "card", "description": "cards"}, "fraud", {"name": "other"}]},
        {"id": "tone", "type": "score", "instructions": "How upset?",
         "levels": ["calm", "annoyed", "high"]},
    ],
    "instructions": "Bank support triage.",
}


@pytest.fixture
async def sdk() -> AsyncIterator[tuple[openai.AsyncOpenAI, RecordingSlow, list[str]]]:
    slow, reads = RecordingSlow(), []
    app = make_app(slow, reads)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://test/v1"
    ) as http:
        yield openai.AsyncOpenAI(base_url="http://test/v1", api_key="x", http_client=http), slow, reads


def messages(schema: Any = SCHEMA, state: str = '{"ticket": "Someone used my card"}') -> list[Any]:
    return [{"role": "system", "content": json.dumps(schema)}, {"role": "user", "content": state}]


async def test_the_servers_chat_variant_is_answered_in_its_shape(
    sdk: tuple[openai.AsyncOpenAI, RecordingSlow, list[str]],
) -> None:
    client, slow, reads = sdk
    reply = await client.chat.completions.create(model="dgemma", messages=messages())
    assert reply.object == "chat.completion" and reply.model == "dgemma"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None and reply.usage.prompt_tokens == 0
    content = json.loads(reply.choices[0].message.content or "")
    assert set(content) == {"answers", "diagnostics"}
    urgent, bucket, tone = (content["answers"][k] for k in ("urgent", "bucket", "tone"))
    assert (urgent["type"], urgent["label"], urgent["route"]) == ("noul", "yes", "fast")
    assert urgent["noul"] == pytest.approx(urgent["probabilities"]["yes"]) and urgent["noul"] > 0.5
    assert (bucket["choice"], bucket["label"]) == ("fraud", "B")
    assert set(bucket["probabilities"]) == {"card", "fraud", "other"}
    assert (tone["level"], tone["label"]) == ("high", "3")
    expected = sum((i + 1) * p for i, p in enumerate(tone["probabilities"].values()))
    assert tone["score"] == pytest.approx(expected)  # 1-based, as the server's chat answer
    assert content["diagnostics"]["stages"] == [["urgent", "bucket", "tone"]]
    assert sorted(reads) == ["bucket", "tone", "urgent"] and slow.asked == []


async def test_a_slow_answer_in_the_chat_variant_carries_numbers(
    sdk: tuple[openai.AsyncOpenAI, RecordingSlow, list[str]],
) -> None:
    client, slow, _ = sdk
    schema = {"questions": [{"id": "tone", "type": "score", "instructions": "unsure",
                             "levels": ["calm", "cross", "irate"]}]}
    reply = await client.chat.completions.create(model="dgemma", messages=messages(schema))
    tone = json.loads(reply.choices[0].message.content or "")["answers"]["tone"]
    assert slow.asked == ["tone"] and tone["route"] == "slow"
    assert tone["probabilities"] == {"calm": 0.0, "cross": 0.0, "irate": 1.0}
    assert tone["confidence"] == 1.0 and tone["score"] == 3.0


@pytest.mark.parametrize(
    ("schema", "state", "message"),
    [
        ({"questions": []}, '"s"', "schema: needs a non-empty questions array"),
        ({"questions": [{"id": "q", "type": "rank"}]}, '"s"', "unknown type"),
        (SCHEMA, "not json", "user must be JSON state"),
    ],
)
async def test_variant_errors_are_400_as_on_the_server(
    sdk: tuple[openai.AsyncOpenAI, RecordingSlow, list[str]], schema: Any, state: str,
    message: str,
) -> None:
    client, slow, reads = sdk
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model="dgemma", messages=messages(schema, state))
    assert info.value.status_code == 400 and message in info.value.message
    assert slow.asked == [] and reads == []


async def test_an_ordinary_chat_with_a_json_system_prompt_is_not_taken_for_the_variant(
    sdk: tuple[openai.AsyncOpenAI, RecordingSlow, list[str]],
) -> None:
    client, slow, reads = sdk
    passed: list[dict[str, Any]] = []

    async def complete(body: dict[str, Any]) -> dict[str, Any]:
        passed.append(body)
        return {"id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "hi"}}]}

    slow.complete = complete  # type: ignore[attr-defined]
    reply = await client.chat.completions.create(
        model="dgemma", messages=messages({"persona": "helpful"}, "hello"))
    assert reply.choices[0].message.content == "hi" and len(passed) == 1 and reads == []
