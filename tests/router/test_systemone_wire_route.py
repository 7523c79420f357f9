"""The /v1/systemone route on a bare FastAPI app with a stand-in service: HTTP status codes, the
example server's error dialect, and that nothing reaches the service on bad input."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from policies.types import Decision, DecisionRequest
from router.errors import SlowPathUnavailable, TooManyRequests
from router.routes_systemone import make_router
from router.settings import Settings


class StubService:
    """Answers the first option with probability 0.75 (the rest shared); records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[DecisionRequest], str]] = []
        self.fail: Exception | None = None

    async def decide(self, requests: Sequence[DecisionRequest], *, namespace: str,
                     messages: list[dict[str, Any]] | None = None) -> list[Decision]:
        self.calls.append((list(requests), namespace))
        if self.fail is not None:
            raise self.fail
        out = []
        for r in requests:
            rest = 0.25 / (len(r.options) - 1)
            proba = {name: (0.75 if i == 0 else rest) for i, name in enumerate(r.option_names)}
            out.append(Decision(f"id-{r.question_id}", r.question_id, r.option_names[0], "fast",
                                0.75, 0.7, 0.5, "stub", 1.0, proba))
        return out


@pytest.fixture
def service() -> StubService:
    return StubService()


@pytest.fixture
async def client(service: StubService) -> AsyncIterator[httpx.AsyncClient]:
    app = FastAPI()
    app.state.settings = Settings(max_body_bytes=4096, max_options=100)
    app.state.service = service
    app.include_router(make_router())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://test") as c:
        yield c


GOOD = {"state": "s", "questions": {"urgent": {"type": "noul"}}}


async def test_ok_and_namespace(client: httpx.AsyncClient, service: StubService) -> None:
    r = await client.post("/v1/systemone", json={**GOOD, "model": "jev-latest"})
    assert r.status_code == 200
    body = r.json()
    assert body["model"] == "jev-latest"
    assert body["answers"]["urgent"] == {"type": "noul", "noul": 0.75, "answer": "yes",
                                         "route": "fast", "confidence": 0.75}
    assert service.calls[0][1] == "default"
    assert body["diagnostics"]["timing"]["total_ms"] >= 0


@pytest.mark.parametrize(
    ("payload", "status", "kind", "message"),
    [
        ({"questions": GOOD["questions"]}, 422, "validation_error", "state: required"),
        ({"state": "s", "questions": {"q": {"type": "rank"}}}, 422, "validation_error",
         "question 'q': unknown type 'rank'"),
        ({"state": "s", "questions": {"q": {"type": "choice", "criteria": {"a": None}}}}, 422,
         "validation_error", "question 'q': needs at least two alternatives"),
        ({"state": "s", "questions": {"a:b": {"type": "noul"}}}, 422, "validation_error",
         "question 'a:b': ids must be non-empty after trimming, with no ':' or newline"),
        ({"state": "s", "questions": {"q": {"type": "choice",
                                            "criteria": {str(i): None for i in range(101)}}}},
         422, "validation_error", "question 'q': at most 100 alternatives"),
    ],
)
async def test_schema_errors_are_422_in_the_example_server_dialect(
    client: httpx.AsyncClient, service: StubService, payload: dict[str, Any], status: int,
    kind: str, message: str,
) -> None:
    r = await client.post("/v1/systemone", json=payload)
    assert r.status_code == status
    assert r.json()["error"]["type"] == kind and r.json()["error"]["message"] == message
    assert service.calls == []


async def test_malformed_json_is_400(client: httpx.AsyncClient, service: StubService) -> None:
    r = await client.post("/v1/systemone", content=b'{"state": ',
                          headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert r.json()["error"]["message"].startswith("invalid body: ")
    assert "detail" not in r.json() and service.calls == []


async def test_body_over_the_limit_is_413(client: httpx.AsyncClient, service: StubService) -> None:
    r = await client.post("/v1/systemone", json={**GOOD, "state": "x" * 5000})
    assert r.status_code == 413 and r.json()["error"]["field"] == "body"
    assert service.calls == []


async def test_multipart_request_part(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/systemone", files={"request": (None, json.dumps(GOOD))})
    assert r.status_code == 200 and r.json()["answers"]["urgent"]["answer"] == "yes"


async def test_service_errors_keep_the_dialect(
    client: httpx.AsyncClient, service: StubService
) -> None:
    service.fail = SlowPathUnavailable("no slow model configured")
    r = await client.post("/v1/systemone", json=GOOD)
    assert r.status_code == 503
    assert r.json() == {"error": {"message": "no slow model configured",
                                  "type": "upstream_error"}}
    service.fail = TooManyRequests("queue full", retry_after_s=2.0)
    r = await client.post("/v1/systemone", json=GOOD)
    assert r.status_code == 429 and r.headers["retry-after"] == "2"
