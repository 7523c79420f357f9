"""A cascade policy through both wires, the surfaces unchanged: the OpenAI SDK's json_schema call
and System One's choice question are answered by the first tier that accepts, or by the slow
model, and the reply's facts name the tier that answered and every tier read."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from router.backends.mock import MockBackend
from router.http.app import create_app
from router.settings import Settings
from tests.router.routing.test_cascade import OPTIONS, cascade_file, cheap, deep
from tests.router.routing.test_service import RecordingSlow

SCHEMA = {"name": "intent", "description": "Which intent?",
          "schema": {"type": "string", "enum": list(OPTIONS)}}


@pytest.fixture
async def http(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(tiers=[{"name": "fast", "kind": "mock"}, {"name": "deep", "kind": "mock"}],
                        policy={"files": [cascade_file(tmp_path)]},
                        log={"decision_log_path": tmp_path / "log.jsonl"})
    app = create_app(settings, backend=MockBackend(cheap, label="cheap"),
                     tiers={"deep": MockBackend(deep, label="deep")}, slow=RecordingSlow())
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        yield client


async def ask_openai(http: httpx.AsyncClient, text: str) -> tuple[str, dict[str, Any]]:
    sdk = openai.AsyncOpenAI(base_url="http://t/v1", api_key="x", http_client=http)
    reply = await sdk.chat.completions.with_raw_response.create(
        model="any", messages=[{"role": "user", "content": text}],
        response_format={"type": "json_schema", "json_schema": SCHEMA})  # type: ignore[typeddict-item]
    body = reply.http_response.json()
    return body["choices"][0]["message"]["content"], body["slotgate"]


async def test_openai_replies_name_the_tier_that_answered(http: httpx.AsyncClient) -> None:
    answer, facts = await ask_openai(http, "a medium question")
    assert answer == '"b"' and (facts["route"], facts["tier"]) == ("fast", "deep")
    assert [(t["tier"], t["accepted"]) for t in facts["tiers"]] == [("fast", False),
                                                                    ("deep", True)]
    assert facts["guarantee"] == "accuracy" and facts["threshold"] == 0.8
    answer, facts = await ask_openai(http, "a hard question")
    assert answer == '"c"' and (facts["route"], facts["tier"]) == ("slow", None)


async def test_system_one_routes_name_the_tier_that_answered(http: httpx.AsyncClient) -> None:
    reply = await http.post("/v1/systemone", json={"state": "an easy one", "questions": {
        "intent": {"type": "choice", "instructions": "Which intent?",
                   "criteria": dict.fromkeys(OPTIONS)}}})
    assert reply.status_code == 200, reply.text
    facts = reply.json()["diagnostics"]["routes"]["intent"]
    assert (facts["route"], facts["tier"], [t["tier"] for t in facts["tiers"]]) == (
        "fast", "fast", ["fast"])
    assert reply.json()["answers"]["intent"]["choice"] == "a"


async def test_readyz_lists_the_cascades_tiers_in_reading_order(http: httpx.AsyncClient) -> None:
    [policy] = (await http.get("/readyz")).json()["policies"]
    assert policy["tiers"] == [{"name": "fast", "threshold": 0.9},
                               {"name": "deep", "threshold": 0.8}]


async def test_a_torch_tier_reads_what_the_first_tier_turned_down(tmp_path: Path) -> None:
    """The GPU tier as the CPU runs it (a tiny diffusion model, a real tokenizer) behind a
    classical first tier: a decision the first tier turns down is read by the torch backend
    and answered from its read (threshold 0: the tier accepts any read)."""
    from tests.router.http.test_app_fast_backend import torch_backend

    first, torch_tier = MockBackend(cheap, label="cheap"), torch_backend(failing_warm_up=False)
    path = cascade_file(tmp_path, thresholds=(0.9, 0.0), names=("fast", "gpu"),
                        fingerprints=(first.fingerprint, torch_tier.fingerprint))
    settings = Settings(tiers=[{"name": "fast", "kind": "mock"}, {"name": "gpu", "kind": "torch", "timeout_s": 60, "options": {
        "kind": "diffusion", "turn_close_id": 2}}], policy={"files": [path]},
                        log={"decision_log_path": tmp_path / "log.jsonl"})
    app = create_app(settings, backend=first, tiers={"gpu": torch_tier}, slow=RecordingSlow())
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        _, easy = await ask_openai(client, "an easy one")
        answer, hard = await ask_openai(client, "a hard one")
    assert (easy["tier"], [t["tier"] for t in easy["tiers"]]) == ("fast", ["fast"])
    assert (hard["route"], hard["tier"]) == ("fast", "gpu"), hard["note"]
    [_, gpu] = hard["tiers"]
    assert gpu["accepted"] and answer == f'"{gpu["answer"]}"' and 0 < gpu["probability"] <= 1
