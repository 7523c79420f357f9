"""/v1/systemone end to end through ``create_app``: a MockBackend as the fast tier, a recording
slow path, the real routing service, cache and policies (fallback threshold 0.9)."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from policies.types import DecisionRequest
from router.backends.mock import MockBackend
from router.http.app import create_app
from router.routing.ports import SlowAnswer
from router.settings import Settings
from tests.conftest import free_port


def confident(request: DecisionRequest) -> Sequence[float]:
    """The fast read: 0.96 on a scripted option, the rest shared; 'unsure' questions get 0.5."""
    names = request.option_names
    if request.instructions == "unsure":
        return [1 / len(names)] * len(names)
    pick = {"noul": "yes", "choice": "fraud", "score": "high"}.get(request.kind, names[0])
    pick = "no" if request.instructions == "say no" else pick
    rest = 0.04 / (len(names) - 1)
    return [0.96 if n == pick else rest for n in names]


class RecordingSlow:
    """A slow path that always answers the last option, recording what it was asked."""

    available = True

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def ask(self, request: DecisionRequest) -> SlowAnswer:
        self.asked.append(request.question_id)
        return SlowAnswer(request.option_names[-1], "stand-in", 1.0, 1)
    audit = ask  # one budget: audits and escalations alike

    async def aclose(self) -> None:
        return None


class MemoryLog:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    async def append(self, record: Any) -> None:  # a DecisionRecord, kept as its dict
        self.records.append(record.model_dump())

    async def get(self, decision_id: str) -> dict[str, Any] | None:
        return next((r for r in self.records if r.get("decision_id") == decision_id), None)

    async def add_feedback(self, decision_id: str, label: str, *, trusted: bool) -> None:
        return None

    async def aclose(self) -> None:
        return None


@pytest.fixture
def slow() -> RecordingSlow:
    return RecordingSlow()


@pytest.fixture
def reads() -> list[str]:
    """Question ids the fast backend was asked, in order."""
    return []


def make_app(slow: RecordingSlow, reads: list[str]) -> FastAPI:
    def handler(request: DecisionRequest) -> Sequence[float]:
        reads.append(request.question_id)
        return confident(request)

    # The fallback bar set explicitly: these questions are tuned on by no policy, and are routed
    # on it (policy.unscoped "threshold") rather than all escalated.
    settings = Settings.model_validate({"max_options": 200, "max_body_bytes": 4096,
                                        "policy": {"fallback_threshold": 0.9}})
    return create_app(settings, backend=MockBackend(handler), slow=slow, decision_log=MemoryLog())


@pytest.fixture
async def client(slow: RecordingSlow, reads: list[str]) -> AsyncIterator[httpx.AsyncClient]:
    app = make_app(slow, reads)
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
        transport=transport, base_url="http://test"
    ) as c:
        yield c


async def post(client: httpx.AsyncClient, payload: dict[str, Any]) -> httpx.Response:
    return await client.post("/v1/systemone", json=payload)


async def test_noul_choice_and_score(client: httpx.AsyncClient, slow: RecordingSlow) -> None:
    intents = {f"intent_{i}": None for i in range(74)} | {"fraud": "not me", "card": None,
                                                         "other": None}
    r = await post(client, {
        "model": "jev-latest", "state": {"ticket": "Someone used my card in Lisbon"},
        "instructions": "Bank support triage.",
        "questions": {
            "urgent": {"type": "noul", "criteria": {"true": "act now", "false": "can wait"}},
            "intent": {"type": "choice", "criteria": intents, "instructions": "Which intent?"},
            "risk": {"type": "score", "criteria": ["low", "mid", "high"]},
        },
    })
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "jev-latest"
    urgent, intent, risk = (body["answers"][k] for k in ("urgent", "intent", "risk"))
    assert urgent["type"] == "noul" and urgent["answer"] == "yes" and urgent["route"] == "fast"
    assert urgent["noul"] == pytest.approx(urgent["confidence"]) and urgent["noul"] > 0.5
    assert intent["choice"] == "fraud" and len(intent["probabilities"]) == 77
    assert math.isclose(sum(intent["probabilities"].values()), 1.0, abs_tol=1e-6)
    assert intent["confidence"] == pytest.approx(intent["probabilities"]["fraud"])
    assert risk["legend"] == {"0": "low", "1": "mid", "2": "high"}
    expected = sum(int(i) * p for i, p in risk["probabilities"].items())
    assert risk["score"] == pytest.approx(expected) and risk["score"] > 1.5
    assert body["diagnostics"]["stages"] == [["urgent", "intent", "risk"]]
    assert set(body["diagnostics"]["routes"]) == {"urgent", "intent", "risk"}
    assert body["usage"]["decisions"] == 3 and slow.asked == []


CHAIN = {
    "state": "I do not recognise a payment",
    "questions": {
        "fraud": {"type": "noul", "instructions": "say no"},
        "block": {"type": "noul", "ask_if": {"fraud": ["yes"]}},
        "notify": {"type": "noul", "ask_if": {"block": ["yes"]}},
        "explain": {"type": "noul", "ask_if": {"fraud": ["no"]}},
    },
}


async def test_ask_if_chain_skips_and_asks(client: httpx.AsyncClient) -> None:
    r = await post(client, CHAIN)
    assert r.status_code == 200, r.text
    body = r.json()
    answers, diagnostics = body["answers"], body["diagnostics"]
    assert answers["fraud"]["answer"] == "no" and answers["fraud"]["noul"] < 0.5
    assert answers["block"] is None and answers["notify"] is None
    assert answers["explain"]["answer"] == "yes"
    assert diagnostics["skipped"] == {
        "block": {"because": "fraud", "was": "no", "wanted": ["yes"]},
        "notify": {"because": "block", "was": None, "wanted": ["yes"]},
    }
    assert diagnostics["stages"] == [["fraud"], ["explain"]]


async def test_escalated_answer_has_one_hot_numbers(
    client: httpx.AsyncClient, slow: RecordingSlow
) -> None:
    payload = {"state": "s", "questions": {
        "tone": {"type": "score", "instructions": "unsure", "criteria": ["calm", "cross", "irate"]},
    }}
    r = await post(client, payload)
    assert r.status_code == 200, r.text
    tone = r.json()["answers"]["tone"]
    assert tone["route"] == "slow" and slow.asked == ["tone"]
    assert (tone["answer"], tone["score"], tone["probabilities"], tone["confidence"]) == (
        "irate", 2.0, {"0": 0.0, "1": 0.0, "2": 1.0}, 1.0)
    again = (await post(client, payload)).json()["answers"]["tone"]  # slow answer from the cache
    assert slow.asked == ["tone"] and again["answer"] == "irate" and again["score"] == 2.0


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"questions": {"q": {"type": "noul"}}}, "state: required"),
        ({"state": "s", "questions": {"q": {"type": "rank"}}}, "question 'q': unknown type 'rank'"),
        ({"state": "s", "questions": {"q": {"type": "choice", "criteria": {"only": None}}}},
         "question 'q': needs at least two alternatives"),
        ({"state": "s", "questions": {"q\nr": {"type": "noul"}}},
         "question 'q\nr': ids must be non-empty after trimming, with no ':' or newline"),
        ({"state": "s", "questions": {"q": {"type": "noul"}, " q ": {"type": "noul"}}},
         "duplicate question id 'q'"),
        ({"state": "s", "questions": {"q": {"type": "noul"}}, "think": -1},
         "schema: think must be a thought budget in tokens, 0 to 4096"),
        ({"state": "s", "questions": {"q": {"type": "noul"}}, "chunk_rows": 4},
         "schema: chunk_rows must be an integer of at least 8"),
        ({"state": "s", "questions": {"q": {"type": "noul"}}, "chunk_prompt": "all"},
         'schema: chunk_prompt must be "shared" or "own"'),
    ],
)
async def test_422_dialect(client: httpx.AsyncClient, slow: RecordingSlow, reads: list[str],
                           payload: dict[str, Any], message: str) -> None:
    r = await post(client, payload)
    assert r.status_code == 422
    assert r.json() == {"error": {"message": message, "type": "validation_error"}}
    assert slow.asked == [] and reads == []


async def test_malformed_json_400_dialect(client: httpx.AsyncClient, reads: list[str]) -> None:
    r = await client.post("/v1/systemone", content=b"{not json",
                          headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert r.json()["error"]["message"].startswith("invalid body: ") and reads == []


async def test_body_over_the_limit_is_413_in_the_dialect(
    client: httpx.AsyncClient, reads: list[str]
) -> None:
    r = await post(client, {"state": "x" * 5000, "questions": {"q": {"type": "noul"}}})
    assert r.status_code == 413 and set(r.json()["error"]) == {"message", "type"}
    assert reads == []


async def test_multipart_request_part(client: httpx.AsyncClient) -> None:
    request = {"state": "s", "questions": {"urgent": {"type": "noul"}}}
    r = await client.post("/v1/systemone", files={"request": (None, json.dumps(request))})
    assert r.status_code == 200, r.text
    assert r.json()["answers"]["urgent"]["answer"] == "yes"


async def test_escalation_unavailable_is_503_in_the_dialect(
    client: httpx.AsyncClient, slow: RecordingSlow
) -> None:
    slow.available = False
    r = await post(client, {"state": "s", "questions": {"q": {"type": "noul",
                                                               "instructions": "unsure"}}})
    assert r.status_code == 503 and r.json()["error"]["type"] == "upstream_error"
    assert "escalation" in r.json()["error"]["message"].lower() and slow.asked == []


async def test_cached_fast_read_keeps_its_distribution(client: httpx.AsyncClient) -> None:
    payload = {"state": "s", "questions": {"urgent": {"type": "noul"}}}
    first = (await post(client, payload)).json()["answers"]["urgent"]
    second = (await post(client, payload)).json()["answers"]["urgent"]
    assert (first["route"], second["route"]) == ("fast", "cache")
    assert second["noul"] == pytest.approx(first["noul"]) and second["confidence"] is not None


async def test_ask_if_chain_over_real_http(slow: RecordingSlow, reads: list[str]) -> None:
    """The same chain through uvicorn on loopback: a real socket, real content-length."""
    port = free_port()
    config = uvicorn.Config(make_app(slow, reads), host="127.0.0.1", port=port,
                            log_level="warning", lifespan="on", ws="none")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        for _ in range(200):
            if server.started:
                break
            await asyncio.sleep(0.02)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:
            r = await c.post("/v1/systemone", json=CHAIN)
        assert r.status_code == 200, r.text
        assert r.json()["diagnostics"]["skipped"]["notify"]["was"] is None
        assert reads == ["fraud", "explain"]
    finally:
        server.should_exit = True
        await task


async def test_requests_are_counted_in_metrics(client: httpx.AsyncClient) -> None:
    await post(client, {"state": "s", "questions": {"q": {"type": "noul"}}})
    text = (await client.get("/metrics")).text
    assert 'slotgate_requests_total{route="fast",surface="systemone"} 1.0' in text


async def test_openapi_describes_the_body(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    body = spec["paths"]["/v1/systemone"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"]["required"] == ["state", "questions"]
