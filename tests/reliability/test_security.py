"""Security: client API keys (sha256 hashes, every hash compared in constant time, 401 without
one, a cache namespace per key), the upstream provider key kept out of every response, log line,
metric, decision-log record and Redis value, body/option limits, no client-chosen upstream URL
or model outside the allow-list, and Redis keys made of hashes only."""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis as redis_sync

from router.backends.mock import MockBackend
from router.http.state import app_state
from standins.llm import StandinHandle
from tests.reliability.conftest import (
    SECRET,
    SLOW_MODEL,
    LiveServer,
    Switch,
    answer_of,
    decision,
    settings_for,
)

KEY_A, KEY_B = "client-key-A-7f3c", "client-key-B-19ad"
HASHES = [hashlib.sha256(k.encode()).hexdigest() for k in (KEY_A, KEY_B)]
KEY_RE = re.compile(r"^slotgate:v1:(?:[A-Za-z0-9_.-]{1,64}:(?:read:[0-9a-f]{16}|slow):[0-9a-f]{64}"
                    r"|log|log:(?:decision|options):[0-9a-f]{64}|log:replica:[0-9a-f]{32})$")


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


@pytest.fixture
def server(standin: StandinHandle, redis_url: str, tmp_path: Path) -> Iterator[LiveServer]:
    standin.set_mode("ok")
    standin.clear()
    settings = settings_for(standin, tmp_path, api_key_hashes=HASHES, max_options=8,
                            max_questions=4, max_body_bytes=4096,
                            cache={"redis_url": redis_url},
                            slow={"allowed_models": ["openai/standin-mini"], "timeout_s": 1})
    with LiveServer(settings, backend=MockBackend(Switch())) as running:
        yield running


def test_api_key_required(server: LiveServer) -> None:
    body = decision("sure, lost_card")
    missing = server.post("/v1/chat/completions", body)
    wrong = server.post("/v1/chat/completions", body, headers=auth("nope"))
    systemone = server.post("/v1/systemone", {"state": "x", "questions": {}})
    ok = server.post("/v1/chat/completions", body, headers=auth(KEY_A))
    for r in (missing, wrong):
        assert r.status_code == 401 and r.json()["error"]["param"] == "authorization"
        assert r.json()["error"]["type"] == "authentication_error"
    assert systemone.status_code == 401 and set(systemone.json()["error"]) == {"message", "type"}
    assert ok.status_code == 200
    assert httpx.get(f"{server.url}/healthz").status_code == 200  # probes need no key


def test_every_hash_is_compared(server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """No early exit: the time taken does not say which hash (if any) matched."""
    import hmac

    import router.http.admission

    calls: list[int] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append(1)
        return real(a, b)

    monkeypatch.setattr(router.http.admission.hmac, "compare_digest", counting)
    for key in (KEY_A, KEY_B, "nope"):
        calls.clear()
        server.post("/v1/feedback", {"decision_id": "x", "label": "y"}, headers=auth(key))
        assert len(calls) == len(HASHES)


def test_two_keys_never_share_cached_reads(server: LiveServer, redis_url: str) -> None:
    body = decision("sure, my card has not arrived")
    routes = [answer_of(server.post("/v1/chat/completions", body, headers=auth(k)))[1]
              for k in (KEY_A, KEY_A, KEY_B, KEY_B)]
    assert routes == ["fast", "cache", "fast", "cache"]
    client = redis_sync.Redis.from_url(redis_url)
    namespaces = {k.decode().split(":")[2] for k in client.keys("slotgate:v1:*:read:*")}
    client.close()
    assert namespaces == {f"key-{h[:16]}" for h in HASHES}
    # Feedback on another key's decision is refused like an unknown id.
    r = server.post("/v1/chat/completions", body | {"messages": [
        {"role": "user", "content": "sure, feedback"}]}, headers=auth(KEY_A))
    decision_id = r.json()["slotgate"]["decision_id"]
    other = server.post("/v1/feedback", {"decision_id": decision_id, "label": "lost_card"},
                        headers=auth(KEY_B))
    assert other.status_code == 404


def test_provider_key_never_leaks(
    server: LiveServer, standin: StandinHandle, redis_url: str,
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []

    def keep(r: httpx.Response) -> None:
        seen.append(json.dumps(dict(r.headers)) + r.text)

    for mode in ("fail500", "ratelimit", "malformed", "wrong_option", "stall", "ok"):
        standin.set_mode(mode, stall_s=3)
        keep(server.post("/v1/chat/completions", decision(f"lost_card? {mode}"),
                         headers=auth(KEY_A)))
        keep(server.post("/v1/chat/completions", {
            "model": SLOW_MODEL, "messages": [{"role": "user", "content": mode}]},
            headers=auth(KEY_A)))
        keep(server.post("/v1/chat/completions", {
            "model": SLOW_MODEL, "stream": True, "messages": [{"role": "user", "content": mode}]},
            headers=auth(KEY_A)))
    standin.set_mode("ok")
    statuses = {s[:3] for s in seen}
    keep(httpx.get(f"{server.url}/metrics"))
    keep(httpx.get(f"{server.url}/v1/models", headers=auth(KEY_A)))
    keep(httpx.get(f"{server.url}/readyz"))
    # The key was really in use: the stand-in received it on every call.
    assert {c["authorization"] for c in standin.calls()} == {f"Bearer {SECRET}"}
    assert len(seen) == 21 and statuses
    client = redis_sync.Redis.from_url(redis_url)
    redis_dump = [repr(client.dump(k)) for k in client.keys("*")]
    redis_dump += [repr(e) for e in client.xrange("slotgate:v1:log")]
    client.close()
    log_file = app_state(server.app).settings.log.decision_log_path.read_text()
    out, err = capfd.readouterr()
    places = {"responses": "\n".join(seen), "log records": caplog.text, "stdout": out,
              "stderr": err, "decision log": log_file, "redis": "\n".join(redis_dump)}
    assert caplog.records and log_file and len(redis_dump) > 2  # each place really had content
    for place, text in places.items():
        assert SECRET not in text, place
        assert SECRET[8:24] not in text, place  # nor a fragment of it


def test_body_and_option_limits(server: LiveServer) -> None:
    big = server.post("/v1/chat/completions", decision("x" * 5000), headers=auth(KEY_A))
    big_s1 = server.post("/v1/systemone", {"state": "x" * 5000, "questions": {}},
                         headers=auth(KEY_A))
    many = server.post("/v1/chat/completions",
                       decision("x", options=[f"o{i}" for i in range(9)]), headers=auth(KEY_A))
    many_s1 = server.post("/v1/systemone", {"state": "x", "questions": {"q": {
        "type": "choice", "criteria": [f"o{i}" for i in range(9)]}}}, headers=auth(KEY_A))
    questions_s1 = server.post("/v1/systemone", {"state": "x", "questions": {
        f"q{i}": {"type": "noul"} for i in range(5)}}, headers=auth(KEY_A))
    assert big.status_code == 413 and big.json()["error"]["param"] == "body"
    assert big_s1.status_code == 413
    assert many.status_code == 400
    assert many.json()["error"]["param"] == "response_format.json_schema.schema.enum"
    assert many_s1.status_code == 422 and "q" in many_s1.json()["error"]["message"]
    assert questions_s1.status_code == 422 and "questions" in questions_s1.json()["error"]["message"]


@pytest.mark.parametrize("field", ["api_base", "base_url", "api_key", "extra_headers",
                                   "extra_body"])
def test_clients_cannot_choose_the_upstream(
    server: LiveServer, standin: StandinHandle, field: str
) -> None:
    evil = "http://127.0.0.1:9/v1"
    passthrough = server.post("/v1/chat/completions", {
        "model": SLOW_MODEL, "messages": [{"role": "user", "content": "hi"}], field: evil},
        headers=auth(KEY_A))
    escalated = server.post("/v1/chat/completions", decision("lost_card?", **{field: evil}),
                            headers=auth(KEY_A))
    for r in (passthrough, escalated):
        assert r.status_code == 403, r.text
        assert r.json()["error"]["param"] == field
    assert standin.calls() == []


def test_models_outside_the_allow_list(server: LiveServer, standin: StandinHandle) -> None:
    def chat(model: str) -> httpx.Response:
        return server.post("/v1/chat/completions", {
            "model": model, "messages": [{"role": "user", "content": "hi"}]}, headers=auth(KEY_A))

    refused = chat("openai/gpt-4o")
    assert refused.status_code == 403 and refused.json()["error"]["param"] == "model"
    assert chat("openai/standin-mini").status_code == 200
    assert chat(SLOW_MODEL).status_code == 200
    # A decision's escalation always uses the configured model, whatever the body names.
    escalated = server.post("/v1/chat/completions",
                            decision("lost_card?") | {"model": "openai/gpt-4o"},
                            headers=auth(KEY_A))
    assert escalated.status_code == 200
    assert [c["body"]["model"] for c in standin.calls()] == ["standin-mini", "standin", "standin"]


INJECTIONS = ["slotgate:v1:x", "a\nb", "slotgate:v1:default:read:*\r\nFLUSHALL", "*"]


def test_cache_keys_are_hashes_only(server: LiveServer, redis_url: str) -> None:
    for i, text in enumerate(INJECTIONS):
        options = [text, f"other {i}"]
        r = server.post("/v1/chat/completions", decision(f"{text} sure", options=options),
                        headers=auth(KEY_A))
        assert r.status_code == 200, r.text
        s1 = server.post("/v1/systemone", {"state": {"text": text}, "questions": {"q": {
            "type": "choice", "criteria": dict.fromkeys(options)}}}, headers=auth(KEY_A))
        assert s1.status_code == 200, s1.text
        # Ids with ':' or newlines are refused, naming the field; nothing is stored for them.
        bad_id = server.post("/v1/systemone", {"state": "x", "questions": {text: {
            "type": "noul"}}}, headers=auth(KEY_A))
        assert bad_id.status_code == (422 if ":" in text or "\n" in text else 200), bad_id.text
    client = redis_sync.Redis.from_url(redis_url)
    keys = [k.decode() for k in client.keys("*")]
    client.close()
    assert len(keys) >= 2 * len(INJECTIONS)
    assert [k for k in keys if not KEY_RE.match(k)] == []


def test_rate_limit_per_key(tmp_path: Path) -> None:
    switch = Switch()
    settings = settings_for(None, tmp_path, api_key_hashes=HASHES, rate_limit_rps=0.5,
                            rate_limit_burst=3)
    with LiveServer(settings, backend=MockBackend(switch)) as server:
        a = [server.post("/v1/chat/completions", decision(f"sure, lost_card {i}"),
                         headers=auth(KEY_A)) for i in range(5)]
        b = server.post("/v1/chat/completions", decision("sure, lost_card b"), headers=auth(KEY_B))
        probe = httpx.get(f"{server.url}/readyz")
    assert [r.status_code for r in a] == [200, 200, 200, 429, 429]
    for r in a[3:]:
        assert r.json()["error"]["type"] == "rate_limit_error"
        assert int(r.headers["retry-after"]) >= 1
    assert b.status_code == 200  # another key has its own bucket
    assert probe.status_code == 200  # probes are not limited
    assert switch.calls == 4  # refused requests never reached the backend
