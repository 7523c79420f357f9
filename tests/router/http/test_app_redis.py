"""The proxy with a real (private) Redis as cache and decision log, client API keys, and the
readiness probe following Redis; same harness as test_app (uvicorn, OpenAI SDK, stand-in LLM)."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import httpx
import openai
import pytest

from router.backends.mock import MockBackend
from standins.llm import StandinHandle
from tests.conftest import RedisServer
from tests.router.http.test_app import INTENTS, Recorder, Server, enum_format, settings_for

KEY_A, KEY_B = "client-key-a-0123456789", "client-key-b-0123456789"


def ask(server: Server, text: str, api_key: str = "unused") -> dict[str, object]:
    completion = server.client(api_key).chat.completions.create(
        model="m", response_format=enum_format(INTENTS),  # type: ignore[arg-type]
        messages=[{"role": "user", "content": text}])
    facts = dict(completion.model_extra["slotgate"])  # type: ignore[index]
    facts["content"] = json.loads(completion.choices[0].message.content or "")
    return facts


def test_second_identical_requests_come_from_redis(
    redis_url: str, standin: StandinHandle, tmp_path: Path
) -> None:
    recorder = Recorder()
    settings = settings_for(standin, tmp_path, cache={"redis_url": redis_url})
    with Server(settings, backend=MockBackend(recorder)) as server:
        first = [ask(server, "sure: card arrival"), ask(server, "where is my lost_card")]
        calls_after_first = len(standin.calls())
        second = [ask(server, "sure: card arrival"), ask(server, "where is my lost_card")]
    assert [f["route"] for f in first] == ["fast", "slow"]
    assert [f["route"] for f in second] == ["cache", "cache"]
    assert [f["content"] for f in first] == [f["content"] for f in second]
    assert recorder.states == ["sure: card arrival", "where is my lost_card"]  # read once each
    assert calls_after_first == 1 and len(standin.calls()) == 1  # slow answer cached too


def test_a_restarted_app_reuses_the_redis_entries(
    redis_url: str, standin: StandinHandle, tmp_path: Path
) -> None:
    settings = settings_for(standin, tmp_path, cache={"redis_url": redis_url})
    with Server(settings, backend=MockBackend(Recorder())) as server:
        ask(server, "sure thing")
    recorder = Recorder()
    with Server(settings, backend=MockBackend(recorder)) as server:
        assert ask(server, "sure thing")["route"] == "cache"
    assert recorder.states == []


def test_readyz_stays_ready_with_redis_down_and_says_so(
    standin: StandinHandle, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each replica answers decisions with Redis down, so /readyz stays 200 and says so: a 503
    would take the whole fleet out of its load balancer over a cache."""
    redis = RedisServer(tmp_path_factory.mktemp("redis-stop"))
    redis.start()
    settings = settings_for(standin, tmp_path, cache={"redis_url": redis.url})
    try:
        with Server(settings, backend=MockBackend(Recorder())) as server, \
                httpx.Client(base_url=server.url) as http:
            up = http.get("/readyz")
            redis.stop()
            with caplog.at_level(logging.WARNING, logger="slotgate"):
                down = http.get("/readyz")
                http.get("/readyz")  # the log line is for the change, not every probe
            answered = ask(server, "sure, redis is down")
            metrics = http.get("/metrics").text
    finally:
        redis.stop()
    assert up.status_code == 200 and up.json()["redis"]["state"] == "up"
    assert down.status_code == 200 and down.json()["status"] == "ready"
    body = down.json()
    assert body["redis"] == {"state": "down", "required": False,
                             "effect": "decisions are served without the cache"}
    assert body["checks"]["redis"] is False and "redis" not in body["required"]
    assert answered["route"] == "fast"
    assert "slotgate_redis_up 0.0" in metrics
    assert "slotgate_cache_errors_total" in metrics
    assert "slotgate_cache_errors_total 0.0" not in metrics
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("readiness:")]
    assert len(lines) == 1 and "still ready" in lines[0]


def test_cache_required_makes_a_down_redis_unready(
    standin: StandinHandle, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    redis = RedisServer(tmp_path_factory.mktemp("redis-required"))
    redis.start()
    settings = settings_for(standin, tmp_path, cache={"redis_url": redis.url, "required": True})
    try:
        with Server(settings, backend=MockBackend(Recorder())) as server, \
                httpx.Client(base_url=server.url) as http:
            assert http.get("/readyz").status_code == 200
            redis.stop()
            down = http.get("/readyz")
    finally:
        redis.stop()
    assert down.status_code == 503 and down.json()["redis"]["required"] is True
    assert "redis" in down.json()["required"]


def test_api_keys_authenticate_and_separate_cache_namespaces(
    standin: StandinHandle, tmp_path: Path
) -> None:
    hashes = [hashlib.sha256(k.encode()).hexdigest() for k in (KEY_A, KEY_B)]
    recorder = Recorder()
    settings = settings_for(standin, tmp_path, api_key_hashes=hashes)
    with Server(settings, backend=MockBackend(recorder)) as server:
        with pytest.raises(openai.AuthenticationError) as missing:
            ask(server, "sure", api_key="wrong-key")
        with httpx.Client(base_url=server.url) as http:
            no_header = http.post("/v1/chat/completions", json={"model": "m", "messages": []})
            health = http.get("/healthz")
        a1, a2, b1 = ask(server, "sure", KEY_A), ask(server, "sure", KEY_A), ask(server, "sure", KEY_B)
    assert missing.value.status_code == 401
    assert no_header.status_code == 401 and no_header.json()["error"]["param"] == "authorization"
    assert health.status_code == 200  # probes need no key
    assert [a1["route"], a2["route"], b1["route"]] == ["fast", "cache", "fast"]
    assert recorder.states == ["sure", "sure"]  # one read per key namespace


def test_rate_limit_is_per_key_with_retry_after(standin: StandinHandle, tmp_path: Path) -> None:
    hashes = [hashlib.sha256(k.encode()).hexdigest() for k in (KEY_A, KEY_B)]
    settings = settings_for(standin, tmp_path, api_key_hashes=hashes, rate_limit_rps=0.5,
                            rate_limit_burst=3)
    body = {"model": "m", "guided_choice": ["a", "b"],
            "messages": [{"role": "user", "content": "sure"}]}
    with Server(settings, backend=MockBackend(Recorder())) as server, \
            httpx.Client(base_url=server.url) as http:
        def post(key: str) -> httpx.Response:
            return http.post("/v1/chat/completions", json=body,
                             headers={"authorization": f"Bearer {key}"})

        a = [post(KEY_A).status_code for _ in range(3)]
        refused = post(KEY_A)
        b = post(KEY_B)
        probes = [http.get("/healthz").status_code for _ in range(5)]
    assert a == [200, 200, 200] and refused.status_code == 429
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert b.status_code == 200 and probes == [200] * 5
