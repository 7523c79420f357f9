"""Shutdown drains in-flight decisions and every answered one is in the decision log; a decision
asked with ``stream: true`` comes back as server-sent events."""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from policies.types import DecisionRequest
from router.backends.mock import MockBackend
from router.settings import Settings
from router.store.decision_log import read_records
from tests.router.http.test_app import INTENTS, Server, enum_format


class SlowReads:
    """Each read takes 0.4 s; ``started`` counts the reads under way."""

    def __init__(self) -> None:
        self.started = 0

    async def __call__(self, request: DecisionRequest) -> list[float]:
        self.started += 1
        await asyncio.sleep(0.4)
        return [0.98, 0.01, 0.01]


def test_shutdown_drains_in_flight_decisions_and_logs_each(tmp_path: Path) -> None:
    log_path = tmp_path / "decisions.jsonl"
    settings = Settings(fast={"timeout_s": 5}, log={"decision_log_path": log_path},
                        policy={"fallback_threshold": 0.9})  # no policy file: the fallback bar
    reads = SlowReads()
    server = Server(settings, backend=MockBackend(reads)).__enter__()
    body = {"model": "m", "response_format": enum_format(INTENTS)}

    def ask(i: int) -> int:
        with httpx.Client(base_url=server.url, timeout=10) as http:
            payload = {**body, "messages": [{"role": "user", "content": f"message {i}"}]}
            return http.post("/v1/chat/completions", json=payload).status_code

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(ask, i) for i in range(8)]
        deadline = time.monotonic() + 10
        while reads.started < 8 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert reads.started == 8  # all eight are inside the fast read: now stop the server
        server.__exit__(None, None, None)
        statuses = [f.result() for f in futures]
    assert statuses == [200] * 8
    decisions = [r for r in read_records(log_path) if r.get("type") == "decision"]
    assert sorted(r["text"] for r in decisions) == sorted(f"message {i}" for i in range(8))


def test_a_streamed_decision_is_one_event_then_done(tmp_path: Path) -> None:
    settings = Settings(log={"decision_log_path": tmp_path / "d.jsonl"},
                        policy={"fallback_threshold": 0.9})  # no policy file: the fallback bar
    with Server(settings, backend=MockBackend(lambda r: [0.96, 0.02, 0.02])) as server:
        stream = server.client().chat.completions.create(
            model="m", stream=True, response_format=enum_format(INTENTS),  # type: ignore[arg-type]
            messages=[{"role": "user", "content": "where is my card"}])
        chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert json.loads(text) == "card_arrival"
    assert chunks[0].model_extra["slotgate"]["route"] == "fast"  # type: ignore[index]
    assert chunks[-1].choices[0].finish_reason == "stop"
