"""/v1/systemone in front of a System One server (the stand-in, with the example server's
validation): what a client sends reaches the upstream as the server would need it to give the
same answers, and what the upstream refuses comes back as the caller's 422."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.backends.systemone import SystemOneBackend
from router.http.app import create_app
from router.settings import Settings
from standins.systemone_server import SystemOneStandin
from tests.router.backends.standins import small_reader
from tests.router.http.systemone.test_e2e import MemoryLog, RecordingSlow


@pytest.fixture
def upstream(banking77_dir: Path) -> Iterator[SystemOneStandin]:
    with SystemOneStandin(reader=small_reader(banking77_dir)) as server:
        yield server


@contextlib.asynccontextmanager
async def serving(upstream: SystemOneStandin, **policy: Any
                  ) -> AsyncIterator[tuple[httpx.AsyncClient, RecordingSlow]]:
    slow = RecordingSlow()
    backend = SystemOneBackend(upstream.url)
    app = create_app(Settings(fast={"timeout_s": 10.0}, policy=policy), backend=backend,
                     slow=slow, decision_log=MemoryLog())
    async with app.router.lifespan_context(app), httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://test"
    ) as c:
        yield c, slow
    await backend.aclose()


@pytest.fixture
async def client(upstream: SystemOneStandin) -> AsyncIterator[tuple[httpx.AsyncClient, RecordingSlow]]:
    # No policy is loaded, so every question is unscoped: under "unverified" it is read from the
    # upstream (and served), which these tests are about; "escalate" reads nothing (below).
    async with serving(upstream, unscoped="unverified") as served:
        yield served


QUESTIONS: dict[str, Any] = {
    " urgent ": {"type": "noul", "instructions": "Reply today?"},
    "intent": {"type": "choice", "criteria": {"card_arrival": None, "lost_or_stolen_card": None}},
}


async def test_knobs_auto_samples_and_trimmed_ids_reach_the_upstream(
    client: tuple[httpx.AsyncClient, RecordingSlow], upstream: SystemOneStandin
) -> None:
    c, _ = client
    r = await c.post("/v1/systemone", json={
        "state": "my new card has not arrived", "questions": QUESTIONS, "samples": "auto",
        "think": 32, "chunk_rows": 16, "chunk_prompt": "shared", "steps": 20})
    assert r.status_code == 200, r.text
    assert set(r.json()["answers"]) == {"urgent", "intent"}  # trimmed, as the server answers
    [body] = upstream.stats.bodies  # one stage, one joint read
    assert list(body["questions"]) == ["urgent", "intent"]
    assert (body["samples"], body["think"], body["chunk_rows"], body["chunk_prompt"],
            body["steps"]) == ("auto", 32, 16, "shared", 8)  # steps clamped to 8, as the server does
    assert r.json()["diagnostics"]["engine"] == "slotgate:systemone"
    assert r.json()["diagnostics"]["steps"] == 8


async def test_an_upstream_422_is_answered_422_without_a_slow_call(
    client: tuple[httpx.AsyncClient, RecordingSlow], upstream: SystemOneStandin
) -> None:
    c, slow = client
    r = await c.post("/v1/systemone", json={
        "state": "s", "questions": {"x" * 300: {"type": "noul"}}})
    assert r.status_code == 422
    assert r.json()["error"]["type"] == "validation_error"  # the server's own word for it
    assert "answer template is" in r.json()["error"]["message"]
    assert slow.asked == [] and upstream.stats.requests == 1
    # the example server's chat variant answers the same refusal with 400, and so does slotgate
    schema = {"questions": [{"id": "x" * 300, "type": "noul", "instructions": "?"}]}
    r = await c.post("/v1/chat/completions", json={"model": "dgemma", "messages": [
        {"role": "system", "content": json.dumps(schema)}, {"role": "user", "content": '"s"'}]})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert "answer template is" in r.json()["error"]["message"] and slow.asked == []


async def test_unscoped_questions_under_escalate_never_reach_the_upstream(
    upstream: SystemOneStandin
) -> None:
    """policy.unscoped: escalate (the default): the slow model answers every question no policy
    covers, so no fast read is made of them; what the upstream would refuse is not asked."""
    async with serving(upstream) as (c, slow):
        r = await c.post("/v1/systemone", json={
            "state": "my new card has not arrived", "questions": QUESTIONS})
        refused = await c.post("/v1/systemone", json={
            "state": "s", "questions": {"x" * 300: {"type": "noul"}}})
    assert r.status_code == 200 and refused.status_code == 200, (r.text, refused.text)
    assert {a["route"] for a in r.json()["answers"].values()} == {"slow"}
    assert upstream.stats.requests == 0 and sorted(slow.asked) == ["intent", "urgent", "x" * 300]
