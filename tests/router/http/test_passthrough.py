"""Passthrough to the System One server of a ``systemone`` tier, over real HTTP on loopback with
the OpenAI SDK as the client: slotgate -> the System One stand-in -> its upstream (standins/llm.py
serving the name ``dgemma``, as vLLM would). Plain chat and other /v1 POSTs naming a model the
server lists are relayed as sent, streaming chunk by chunk, after slotgate's admission; every
other name goes to the slow path; decisions keep being decided; ``GET /v1/models`` lists both."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from router.backends.mock import MockBackend
from router.backends.systemone import SystemOneBackend
from router.settings import Settings
from standins.llm import StandinHandle, start_standin
from standins.systemone_server import SystemOneStandin
from tests.conftest import free_port
from tests.live import LiveServer
from tests.router.backends.standins import small_reader
from tests.router.http.systemone.test_differences import difference

SLOW_MODEL = "openai/standin"
CLIENT_KEY = "client-key"
TIER_KEY = "tier-key"
CHAT = [{"role": "user", "content": "stream these words through please"}]


def settings(slow: StandinHandle, tmp: Path, *, fast_url: str | None, **more: Any) -> Settings:
    fast = {"kind": "systemone", "url": fast_url, "api_key": TIER_KEY, "timeout_s": 10} \
        if fast_url else {}
    return Settings(fast=fast, slow={"model": SLOW_MODEL, "api_base": slow.api_base,
                                     "api_key": "sk-standin-0000", "timeout_s": 10},
                    log={"decision_log_path": tmp / "decisions.jsonl"},
                    policy={"fallback_threshold": 0.5}, **more)


def sdk(url: str, key: str = CLIENT_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=20)


@pytest.fixture(scope="module")
def vllm() -> Iterator[StandinHandle]:
    """The System One server's upstream, serving ``dgemma`` as the example's vLLM does."""
    handle = start_standin(served_models=("dgemma",))
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def server_one(vllm: StandinHandle, banking77_dir: Path) -> Iterator[SystemOneStandin]:
    with SystemOneStandin(reader=small_reader(banking77_dir), upstream=vllm.url,
                          api_key=TIER_KEY) as server:
        yield server


# The app closes the tier's client at shutdown (no connection outlives the server); no warm-up
# read, so the upstream sees the tests' requests alone.
OWNED = {"close_backend": True, "warm_up": False}


@pytest.fixture(scope="module")
def gate(server_one: SystemOneStandin, standin: StandinHandle,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    key_hash = hashlib.sha256(CLIENT_KEY.encode()).hexdigest()
    backend = SystemOneBackend(server_one.url, api_key=TIER_KEY)
    with LiveServer(settings(standin, tmp_path_factory.mktemp("gate"), fast_url=server_one.url,
                             api_key_hashes=[key_hash]), backend=backend, **OWNED) as live:
        yield live


@pytest.fixture
def fresh(vllm: StandinHandle, server_one: SystemOneStandin) -> StandinHandle:
    vllm.reset()
    server_one.stats.bodies.clear()
    server_one.stats.auth_headers.clear()
    return vllm


def test_models_list_names_the_servers_models_beside_slotgates_own(gate: LiveServer) -> None:
    with sdk(gate.url) as client:
        ids = [m.id for m in client.models.list()]
    assert ids == [SLOW_MODEL, "dgemma", "slotgate-fast:systemone"]
    listing = httpx.get(f"{gate.url}/v1/models",
                        headers={"authorization": f"Bearer {CLIENT_KEY}"}).json()
    dgemma = listing["data"][1]
    assert (dgemma["owned_by"], dgemma["root"]) == ("vllm", "dgemma")  # the server's card, as is
    assert dgemma["slotgate"] == {"route": "passthrough", "tier": "fast"}
    assert listing["slotgate"]["upstreams"] == [{"tier": "fast", "models": ["dgemma"],
                                                 "error": None}]
    row = difference("`GET /v1/models`")
    assert "always 200" in row["slotgate"] and row["deliberate"].startswith("yes")


def test_a_plain_chat_stream_is_relayed_chunk_by_chunk(
        gate: LiveServer, fresh: StandinHandle, server_one: SystemOneStandin,
        standin: StandinHandle) -> None:
    """The upstream holds its last chunk until the client has the first: a relay that buffered
    anywhere (slotgate or the System One server) would hand it on only after the gate timed out."""
    held = threading.Event()
    fresh.state.last_chunk_gate = held
    fresh.state.gate_waits.clear()
    try:
        with sdk(gate.url) as client:
            stream = client.chat.completions.create(
                model="dgemma", messages=CHAT, stream=True,  # type: ignore[arg-type]
                extra_body={"top_k": 5, "chat_template_kwargs": {"enable_thinking": False}})
            pieces = []
            for chunk in stream:
                held.set()
                pieces += [c.delta.content or "" for c in chunk.choices]
    finally:
        fresh.state.last_chunk_gate = None
        held.set()
    assert fresh.state.gate_waits == [True]
    assert "".join(pieces) == "echo: stream these words through please"
    [call] = fresh.calls()
    assert call["body"] == {"model": "dgemma", "messages": CHAT, "stream": True, "top_k": 5,
                            "chat_template_kwargs": {"enable_thinking": False}}  # as sent
    assert server_one.stats.auth_headers == [f"Bearer {TIER_KEY}"]  # the tier's key, not ours
    assert standin.calls() == []
    assert "streamed chunk by chunk" in difference("plain chat")["slotgate"]


def test_a_plain_chat_comes_back_as_the_server_answered(
        gate: LiveServer, fresh: StandinHandle) -> None:
    with sdk(gate.url) as client:
        raw = client.chat.completions.with_raw_response.create(
            model="dgemma", messages=CHAT)  # type: ignore[arg-type]
    assert raw.parse().choices[0].message.content == "echo: stream these words through please"
    assert raw.headers["x-slotgate-upstream"] == "fast"
    assert "x-slotgate-route" not in raw.headers  # no decision was made
    assert "content-length" not in raw.headers  # streamed on as it came
    assert "no `content-length`" in difference("answer headers")["slotgate"]
    fresh.set_mode("fail500", times=1, error_message="engine dead")
    failed = httpx.post(f"{gate.url}/v1/chat/completions",
                        headers={"authorization": f"Bearer {CLIENT_KEY}"},
                        json={"model": "dgemma", "messages": CHAT})
    assert failed.status_code == 500  # the server's own status and body, relayed
    assert failed.json()["error"]["message"] == "engine dead"


def test_other_model_names_go_to_the_slow_path(
        gate: LiveServer, fresh: StandinHandle, standin: StandinHandle) -> None:
    with sdk(gate.url) as client:
        reply = client.chat.completions.create(model=SLOW_MODEL, messages=CHAT)  # type: ignore[arg-type]
        with pytest.raises(openai.PermissionDeniedError):  # neither served nor allowed
            client.chat.completions.create(model="gpt-x", messages=CHAT)  # type: ignore[arg-type]
    assert reply.choices[0].message.content == "echo: stream these words through please"
    assert len(standin.calls()) == 1 and fresh.calls() == []


def test_decisions_naming_a_served_model_are_still_decided(
        gate: LiveServer, fresh: StandinHandle, server_one: SystemOneStandin) -> None:
    enum = {"type": "json_schema", "json_schema": {
        "name": "intent", "schema": {"type": "string", "enum": ["card_arrival", "lost_or_stolen_card"]}}}
    schema = {"questions": [{"id": "urgent", "type": "noul", "instructions": "Reply today?"}]}
    with sdk(gate.url) as client:
        decided = client.chat.completions.create(
            model="dgemma", response_format=enum,  # type: ignore[arg-type]
            messages=[{"role": "user", "content": "my card has not arrived"}])
        variant = client.chat.completions.create(model="dgemma", messages=[  # type: ignore[arg-type]
            {"role": "system", "content": json.dumps(schema)},
            {"role": "user", "content": json.dumps({"ticket": "card not here"})}])
    assert decided.model_extra is not None and "slotgate" in decided.model_extra
    assert "urgent" in json.loads(variant.choices[0].message.content or "")["answers"]
    assert fresh.calls() == []  # nothing relayed
    assert len(server_one.stats.bodies) == 2  # both read on /v1/systemone


def test_other_v1_posts_are_relayed_by_model(gate: LiveServer, fresh: StandinHandle) -> None:
    with sdk(gate.url) as client:
        done = client.completions.create(model="dgemma", prompt="hello")
        with pytest.raises(openai.NotFoundError) as unknown:
            client.completions.create(model="gpt-x", prompt="hello")
        with pytest.raises(openai.BadRequestError) as no_model:
            client.post("/embeddings", body={"input": "x"}, cast_to=object)
    assert done.choices[0].text == "echo: hello"
    assert fresh.calls()[0]["body"] == {"model": "dgemma", "prompt": "hello"}
    error = unknown.value.body
    assert isinstance(error, dict) and error["param"] == "model"
    assert "'gpt-x'" in error["message"] and "['dgemma']" in error["message"]
    assert isinstance(no_model.value.body, dict) and no_model.value.body["param"] == "model"
    assert "404 naming `model`" in difference("other `/v1/...` POSTs")["slotgate"]


def test_admission_still_applies_to_relayed_requests(gate: LiveServer, fresh: StandinHandle) -> None:
    for key in (None, "wrong"):
        headers = {"authorization": f"Bearer {key}"} if key else {}
        r = httpx.post(f"{gate.url}/v1/chat/completions", headers=headers,
                       json={"model": "dgemma", "messages": CHAT, "stream": True})
        assert r.status_code == 401 and r.json()["error"]["param"] == "authorization"
    auth = {"authorization": f"Bearer {CLIENT_KEY}"}
    smuggled = httpx.post(f"{gate.url}/v1/completions", headers=auth,
                          json={"model": "dgemma", "prompt": "x", "api_base": "http://evil"})
    surrogate = httpx.post(f"{gate.url}/v1/completions", headers=auth,
                           content=b'{"model": "dgemma", "prompt": "\\ud800"}')
    assert (smuggled.status_code, smuggled.json()["error"]["param"]) == (403, "api_base")
    assert (surrogate.status_code, surrogate.json()["error"]["param"]) == (400, "prompt")
    assert fresh.calls() == []
    assert "tier's `api_key` sent to the server" in difference("keys and refusals")["slotgate"]


def test_the_rate_limit_counts_relayed_requests(
        server_one: SystemOneStandin, fresh: StandinHandle, standin: StandinHandle,
        tmp_path: Path) -> None:
    with LiveServer(settings(standin, tmp_path, fast_url=server_one.url, rate_limit_rps=0.001,
                             rate_limit_burst=1),
                    backend=SystemOneBackend(server_one.url, api_key=TIER_KEY),
                    **OWNED) as live:
        body = {"model": "dgemma", "messages": CHAT}
        first = httpx.post(f"{live.url}/v1/chat/completions", json=body)
        second = httpx.post(f"{live.url}/v1/chat/completions", json=body)
    assert (first.status_code, second.status_code) == (200, 429)
    assert "retry-after" in second.headers and len(fresh.calls()) == 1


def test_an_unreachable_server_keeps_slotgates_own_models_and_says_so(
        standin: StandinHandle, tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with LiveServer(settings(standin, tmp_path, fast_url=dead),
                    backend=MockBackend(lambda r: [1.0] + [0.0] * (len(r.options) - 1))) as live:
        with sdk(live.url) as client:
            ids = [m.id for m in client.models.list()]
            with pytest.raises(openai.InternalServerError) as down:
                client.chat.completions.create(model="dgemma", messages=CHAT)  # type: ignore[arg-type]
            slow = client.chat.completions.create(model=SLOW_MODEL, messages=CHAT)  # type: ignore[arg-type]
        listing = httpx.get(f"{live.url}/v1/models").json()
    assert ids == [SLOW_MODEL, "slotgate-fast:mock"]
    [upstream] = listing["slotgate"]["upstreams"]
    assert upstream["models"] == [] and "ConnectError" in upstream["error"]
    assert down.value.status_code == 503
    assert isinstance(down.value.body, dict) and down.value.body["param"] == "model"
    assert "'dgemma'" in down.value.body["message"] and "tier 'fast'" in down.value.body["message"]
    assert slow.choices[0].message.content == "echo: stream these words through please"


def test_without_a_systemone_tier_other_v1_posts_are_404s(
        standin: StandinHandle, tmp_path: Path) -> None:
    with LiveServer(settings(standin, tmp_path, fast_url=None),
                    backend=MockBackend(lambda r: [1.0] + [0.0] * (len(r.options) - 1))) as live:
        r = httpx.post(f"{live.url}/v1/completions", json={"model": "dgemma", "prompt": "x"})
        listing = httpx.get(f"{live.url}/v1/models").json()
    assert r.status_code == 404 and "none is configured" in r.json()["error"]["message"]
    assert "slotgate" not in listing


def test_a_model_list_is_reused_within_its_ttl(gate: LiveServer, fresh: StandinHandle) -> None:
    headers = {"authorization": f"Bearer {CLIENT_KEY}"}
    httpx.get(f"{gate.url}/v1/models", headers=headers)  # fetched now, or still fresh
    fresh.state.served_models = ("renamed",)
    try:
        listing = httpx.get(f"{gate.url}/v1/models", headers=headers).json()
    finally:
        fresh.state.served_models = ("dgemma",)
    assert listing["slotgate"]["upstreams"][0]["models"] == ["dgemma"]  # cached, 30 s


def test_the_standin_routes_as_the_example_server_does(
        server_one: SystemOneStandin, fresh: StandinHandle) -> None:
    """structured_server.py (mmastrac/djev 28b1e26): /v1/models and other POSTs relayed with
    their status, a body that is not JSON a 400, an unreachable upstream a 503."""
    schema = json.dumps({"questions": [{"id": "q", "type": "noul"}]})
    with httpx.Client(base_url=server_one.url,
                      headers={"authorization": f"Bearer {TIER_KEY}"}) as http:
        models = http.get("/v1/models")
        raw = http.post("/v1/raw/chat/completions", json={"model": "dgemma", "messages": CHAT})
        missing = http.post("/v1/nowhere", json={"model": "dgemma"})
        structured = http.post("/v1/chat/completions", json={"model": "dgemma", "messages": [
            {"role": "developer", "content": schema}, {"role": "user", "content": "{}"}]})
        not_json = http.post("/v1/chat/completions", content=b"{")
    assert [m["id"] for m in models.json()["data"]] == ["dgemma"]
    assert raw.json()["choices"][0]["message"]["content"].startswith("echo: ")
    assert missing.status_code == 404  # vLLM's own 404, relayed
    assert structured.status_code == 400 and "/v1/systemone only" in structured.text
    assert not_json.status_code == 400 and "invalid body" in not_json.text
    dead = SystemOneStandin(reader=server_one.reader, upstream=f"http://127.0.0.1:{free_port()}")
    with dead, httpx.Client(base_url=dead.url) as http:
        down = http.get("/v1/models")
        chat = http.post("/v1/chat/completions", json={"model": "dgemma", "messages": CHAT})
    assert (down.status_code, chat.status_code) == (503, 503)
    assert down.json()["error"]["message"].startswith("upstream unavailable: ")


def test_a_stream_that_breaks_on_the_way_ends_with_an_error_event(
        vllm: StandinHandle, standin: StandinHandle, tmp_path: Path) -> None:
    """The tier's server here is the OpenAI-compatible stand-in itself (it lists ``dgemma``),
    which cuts the stream after two chunks: slotgate's read of it breaks midway."""
    vllm.reset()
    vllm.set_mode("cut", times=1)
    with LiveServer(settings(standin, tmp_path, fast_url=vllm.url),
                    backend=MockBackend(lambda r: [1.0] + [0.0] * (len(r.options) - 1))) as live, \
            httpx.stream("POST", f"{live.url}/v1/chat/completions",
                         json={"model": "dgemma", "messages": CHAT, "stream": True}) as r:
        events = [line for line in r.iter_lines() if line]
    assert r.status_code == 200 and len(events) == 3
    last = json.loads(events[-1].removeprefix("data: "))
    assert last["error"]["type"] == "upstream_error" and "tier 'fast'" in last["error"]["message"]
    assert "data: [DONE]" not in events


def test_passthrough_off_leaves_every_name_to_the_slow_path(
        server_one: SystemOneStandin, fresh: StandinHandle, standin: StandinHandle,
        tmp_path: Path) -> None:
    with LiveServer(settings(standin, tmp_path, fast_url=server_one.url,
                             passthrough={"enabled": False}),
                    backend=SystemOneBackend(server_one.url, api_key=TIER_KEY),
                    **OWNED) as live:
        chat = httpx.post(f"{live.url}/v1/chat/completions",
                          json={"model": "dgemma", "messages": CHAT})
        listing = httpx.get(f"{live.url}/v1/models").json()
    assert chat.status_code == 403 and chat.json()["error"]["param"] == "model"  # not allowed
    assert "slotgate" not in listing and "dgemma" not in [m["id"] for m in listing["data"]]
    assert fresh.calls() == []


def test_a_client_that_leaves_midstream_gives_its_slot_back(
        server_one: SystemOneStandin, fresh: StandinHandle, standin: StandinHandle,
        tmp_path: Path) -> None:
    """One relayed call at a time: the next one is served (it would wait forever on a slot the
    client that left still held)."""
    held = threading.Event()
    fresh.state.last_chunk_gate = held
    try:
        with LiveServer(settings(standin, tmp_path, fast_url=server_one.url,
                                 passthrough={"max_concurrency": 1}),
                        backend=SystemOneBackend(server_one.url, api_key=TIER_KEY),
                    **OWNED) as live:
            with httpx.stream("POST", f"{live.url}/v1/chat/completions",
                              json={"model": "dgemma", "messages": CHAT, "stream": True}) as r:
                first = next(r.iter_lines())
            held.set()  # the client has left; the upstream may finish
            after = httpx.post(f"{live.url}/v1/chat/completions", timeout=10,
                               json={"model": "dgemma", "messages": CHAT})
    finally:
        fresh.state.last_chunk_gate = None
        held.set()
    assert first.startswith("data: ")
    assert after.status_code == 200 and len(fresh.calls()) == 2
