"""Escalations too large for the slow model, over HTTP with the real SlowPath: a request over
``slow.max_request_bytes`` is a 413 naming the setting and its value before any call (a
decision's options go to the slow model twice, in the prompt and in the answer schema), and a
slow model's server that refuses a body as too large (413) is a 413 naming it too, not a 5xx."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from router.backends.mock import MockBackend
from router.settings import Settings
from standins.llm import StandinHandle
from tests.conftest import free_port
from tests.live import LiveServer

LIMIT = 64 * 1024


def escalation(options: list[str], *, stream: bool = False) -> dict[str, Any]:
    return {"model": "any", "stream": stream, "messages": [{"role": "user", "content": "which"}],
            "response_format": {"type": "json_schema", "json_schema": {
                "name": "big", "schema": {"type": "string", "enum": options}}}}


def serve(tmp_path: Path, api_base: str) -> LiveServer:
    settings = Settings(slow={"model": "openai/standin", "api_base": api_base,
                              "api_key": "sk-standin-0000", "timeout_s": 10,
                              "max_request_bytes": LIMIT},
                        log={"decision_log_path": tmp_path / "decisions.jsonl"},
                        policy={"fallback_threshold": 0.99})
    # a spread read: every decision escalates
    return LiveServer(settings, backend=MockBackend(lambda r: [1 / len(r.options)] * len(r.options)))


def test_an_escalation_over_the_limit_is_a_413_naming_the_setting(
    tmp_path: Path, standin: StandinHandle
) -> None:
    small = [f"option {i}" for i in range(4)]
    big = [f"option {i} " + "x" * 10_000 for i in range(4)]  # 40 KB: 80 KB sent, over 64 KiB
    with serve(tmp_path, standin.api_base) as server, httpx.Client(
            base_url=server.url, timeout=20) as client:
        assert client.post("/v1/chat/completions", json=escalation(small)).status_code == 200
        assert len(standin.calls()) == 1
        for body in (escalation(big), {**escalation(big), "response_format": None,
                                       "messages": [{"role": "user", "content": "y" * LIMIT}]}):
            reply = client.post("/v1/chat/completions", json=body)  # a decision; a passthrough
            assert reply.status_code == 413, reply.text
            error = reply.json()["error"]
            assert f"slow.max_request_bytes = {LIMIT}" in error["message"]
            assert error["param"] == "body" and error["code"] == "payload_too_large"
    assert len(standin.calls()) == 1  # neither reached the slow model


@pytest.fixture
def refusing_upstream() -> Iterator[str]:
    """A slow model's server that answers every request 413, as nginx past its body limit."""

    async def refuse(request: Request) -> PlainTextResponse:
        return PlainTextResponse("413 Request Entity Too Large", status_code=413)

    app = Starlette(routes=[Route("/v1/chat/completions", refuse, methods=["POST"])])
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="off", ws="none"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "upstream did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}/v1"
    server.should_exit = True
    thread.join(timeout=10)


def test_a_413_from_the_slow_models_server_is_a_413_naming_the_setting(
    tmp_path: Path, refusing_upstream: str
) -> None:
    with serve(tmp_path, refusing_upstream) as server, httpx.Client(
            base_url=server.url, timeout=20) as client:
        reply = client.post("/v1/chat/completions", json=escalation(["yes", "no"]))
    assert reply.status_code == 413, reply.text
    message = reply.json()["error"]["message"]
    assert "refused as too large by the slow model's server" in message
    assert f"slow.max_request_bytes = {LIMIT}" in message
