"""The whole proxy with real parts: uvicorn on loopback, the OpenAI Python SDK as the client, the
real SlowPath (litellm) escalating to standins/llm.py, which records every call. The fast
backend is a MockBackend whose handler records what reached it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from policies.types import DecisionRequest
from router.backends.mock import MockBackend
from router.http.state import app_state
from router.settings import Settings
from router.store.decision_log import read_records
from router.tuning.log_export import export_predictions
from router.tuning.predictions import read_predictions
from standins.llm import StandinHandle
from tests.live import LiveServer

SLOW_MODEL = "openai/standin"
INTENTS = ["card_arrival", "lost_card", "exchange_rate"]


def enum_format(options: list[str], name: str = "intent") -> dict[str, Any]:
    return {"type": "json_schema",
            "json_schema": {"name": name, "schema": {"type": "string", "enum": options}}}


class Recorder:
    """The fast backend's handler: 0.97 on the first option when the text says 'sure', else a
    spread read (0.5 top) that the 0.9 fallback threshold escalates. Records every state read."""

    def __init__(self) -> None:
        self.states: list[str] = []

    def __call__(self, request: DecisionRequest) -> list[float]:
        self.states.append(request.state)
        k = len(request.options)
        top = 0.97 if "sure" in request.state else 0.5
        return [top] + [(1 - top) / (k - 1)] * (k - 1)


class Server(LiveServer):
    """The shared live server, plus one OpenAI SDK client per API key, closed with the server."""

    def __init__(self, settings: Settings, **parts: Any) -> None:
        super().__init__(settings, **parts)
        self.clients: dict[str, openai.OpenAI] = {}

    def __exit__(self, *exc: object) -> None:
        for client in self.clients.values():
            client.close()
        super().__exit__(*exc)

    def client(self, api_key: str = "unused") -> openai.OpenAI:
        """One SDK client per key, closed with the server (no sockets left to the collector)."""
        if api_key not in self.clients:
            self.clients[api_key] = openai.OpenAI(
                base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, timeout=20)
        return self.clients[api_key]


def settings_for(standin: StandinHandle | None, tmp_path: Path, **overrides: Any) -> Settings:
    slow = {"model": SLOW_MODEL, "api_base": standin.api_base, "api_key": "sk-standin-0000",
            "timeout_s": 10} if standin else {}
    return Settings(slow={**slow, **overrides.pop("slow", {})},
                    log={"decision_log_path": tmp_path / "decisions.jsonl"},
                    policy={"fallback_threshold": 0.9}, **overrides)


@pytest.fixture(scope="module")
def server(standin: StandinHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    recorder = Recorder()
    settings = settings_for(standin, tmp_path_factory.mktemp("app"), max_options=50)
    with Server(settings, backend=MockBackend(recorder)) as running:
        running.recorder = recorder  # type: ignore[attr-defined]
        yield running


@pytest.fixture
def app(server: Server, standin: StandinHandle) -> Server:
    standin.set_mode("ok")
    standin.clear()
    server.recorder.states.clear()  # type: ignore[attr-defined]
    return server


def test_enum_decision_is_answered_fast_through_the_sdk(app: Server, standin: StandinHandle) -> None:
    raw = app.client().chat.completions.with_raw_response.create(
        model="anything", response_format=enum_format(INTENTS),  # type: ignore[arg-type]
        messages=[{"role": "user", "content": "I am sure my card has not arrived"}])
    completion = raw.parse()
    assert json.loads(completion.choices[0].message.content or "") == "card_arrival"
    facts = completion.model_extra["slotgate"]  # type: ignore[index]
    assert (facts["route"], facts["policy_id"], facts["threshold"]) == ("fast", "fallback", 0.9)
    assert facts["probability"] == pytest.approx(0.97)
    assert raw.headers["x-slotgate-route"] == "fast"
    assert raw.headers["x-slotgate-decision-id"] == facts["decision_id"]
    assert standin.calls() == []
    assert app.recorder.states == ["I am sure my card has not arrived"]  # type: ignore[attr-defined]


def test_object_schema_with_two_enum_properties(app: Server) -> None:
    schema = {"type": "object", "properties": {
        "intent": {"type": "string", "enum": INTENTS},
        "urgent": {"type": "string", "enum": ["yes", "no"]}}}
    completion = app.client().chat.completions.create(
        model="m", messages=[{"role": "user", "content": "sure, lost it yesterday"}],
        response_format={"type": "json_schema",  # type: ignore[typeddict-item]
                         "json_schema": {"name": "triage", "schema": schema}})
    assert json.loads(completion.choices[0].message.content or "") == {
        "intent": "card_arrival", "urgent": "yes"}
    facts = completion.model_extra["slotgate"]  # type: ignore[index]
    assert [d["question_id"] for d in facts["decisions"]] == ["intent", "urgent"]
    assert len(set(facts["decision_id"].split(","))) == 2


def test_low_confidence_escalates_to_the_standin_and_only_then(
    app: Server, standin: StandinHandle
) -> None:
    client = app.client()
    confident = "sure: when does my card arrive?"
    unsure = "I think my lost_card was stolen"
    answers = {}
    for text in (confident, unsure):
        completion = client.chat.completions.create(
            model="m", response_format=enum_format(INTENTS),  # type: ignore[arg-type]
            messages=[{"role": "system", "content": "Banking support."},
                      {"role": "user", "content": text}])
        answers[text] = (json.loads(completion.choices[0].message.content or ""),
                         completion.model_extra["slotgate"]["route"])  # type: ignore[index]
    assert answers[confident] == ("card_arrival", "fast")
    assert answers[unsure] == ("lost_card", "slow")  # the stand-in's rule: the option named
    calls = standin.calls()
    assert len(calls) == 1
    sent = calls[0]["body"] if "body" in calls[0] else calls[0]
    assert unsure in json.dumps(sent) and confident not in json.dumps(sent)


def test_plain_chat_passes_through(app: Server, standin: StandinHandle) -> None:
    completion = app.client().chat.completions.create(
        model=SLOW_MODEL, messages=[{"role": "user", "content": "hello there"}])
    assert completion.choices[0].message.content == "echo: hello there"
    assert len(standin.calls()) == 1 and app.recorder.states == []  # type: ignore[attr-defined]


def test_streamed_chat_passes_through_as_events(app: Server, standin: StandinHandle) -> None:
    stream = app.client().chat.completions.create(
        model=SLOW_MODEL, stream=True, messages=[{"role": "user", "content": "stream me"}])
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text == "echo: stream me"
    assert len(standin.calls()) == 1


def test_model_outside_the_allow_list_is_forbidden(app: Server, standin: StandinHandle) -> None:
    with pytest.raises(openai.PermissionDeniedError) as info:
        app.client().chat.completions.create(
            model="openai/gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert info.value.body["param"] == "model"  # type: ignore[index]
    assert standin.calls() == []


BAD_BODIES = [
    (b'{"model": "m", "messages": [', "body"),
    (json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}],
                 "response_format": enum_format(["only"])}).encode(),
     "response_format.json_schema.schema.enum"),
    (json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}],
                 "response_format": enum_format(["a", ""])}).encode(),
     "response_format.json_schema.schema.enum.1"),
    (json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}],
                 "response_format": enum_format([f"o{i}" for i in range(51)])}).encode(),
     "response_format.json_schema.schema.enum"),
    (json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}],
                 "response_format": enum_format(["a", "b"], name="a:b")}).encode(),
     "response_format.json_schema.name"),
    (json.dumps({"model": "m", "messages": [], "guided_choice": ["a", "b"]}).encode(), "messages"),
    (json.dumps({"model": "m", "messages": [{"role": "wizard", "content": "x"}],
                 "guided_choice": ["a", "b"]}).encode(), "messages.0.role"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}],
                 "guided_choice": ["a", "b"]}).encode(), "model"),
]


@pytest.mark.parametrize(("payload", "field"), BAD_BODIES)
def test_bad_input_is_a_4xx_naming_the_field_and_reaches_no_backend(
    app: Server, standin: StandinHandle, payload: bytes, field: str
) -> None:
    with httpx.Client(base_url=app.url, timeout=10) as http:
        response = http.post("/v1/chat/completions", content=payload,
                             headers={"content-type": "application/json"})
    assert 400 <= response.status_code < 500, response.text
    error = response.json()["error"]
    assert error["param"] == field and set(error) == {"message", "type", "param", "code"}
    assert app.recorder.states == [] and standin.calls() == []  # type: ignore[attr-defined]


def test_body_over_the_limit_is_413(standin: StandinHandle, tmp_path: Path) -> None:
    recorder = Recorder()
    with Server(settings_for(standin, tmp_path, max_body_bytes=4096),
                backend=MockBackend(recorder)) as small, httpx.Client(base_url=small.url) as http:
        body = {"model": "m", "messages": [{"role": "user", "content": "x" * 5000}],
                "guided_choice": ["a", "b"]}
        response = http.post("/v1/chat/completions", json=body)
        chunked = http.post("/v1/chat/completions",
                            content=iter([json.dumps(body).encode()[:3000]] * 2))
    assert response.status_code == 413 and response.json()["error"]["param"] == "body"
    assert chunked.status_code == 413
    assert recorder.states == []


def test_feedback_round_trip(app: Server, tmp_path: Path) -> None:
    completion = app.client().chat.completions.create(
        model="m", response_format=enum_format(INTENTS),  # type: ignore[arg-type]
        messages=[{"role": "user", "content": "sure thing"}])
    decision_id = completion.model_extra["slotgate"]["decision_id"]  # type: ignore[index]
    with httpx.Client(base_url=app.url) as http:
        ok = http.post("/v1/feedback", json={"decision_id": decision_id, "label": "lost_card"})
        unknown = http.post("/v1/feedback", json={"decision_id": "nope", "label": "lost_card"})
        bad_label = http.post("/v1/feedback", json={"decision_id": decision_id, "label": "zzz"})
    assert ok.status_code == 200 and ok.json()["correct"] is False
    assert ok.json()["trusted"] is False  # no API keys: every caller has the default role
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "decision_id"
    assert bad_label.status_code == 400 and bad_label.json()["error"]["param"] == "label"
    # The label reaches the recalibration input: the decision log exported as predictions.
    log_path = Path(app_state(app.app).settings.log.decision_log_path)
    [record] = [r for r in read_records(log_path) if r["decision_id"] == decision_id
                and r.get("type") == "decision"]
    out = tmp_path / "preds.jsonl"
    export_predictions(log_path, out, signature=record["signature"], labelled_only=True,
                       untrusted_labels=True)
    preds = read_predictions(out)
    assert preds.ids == [decision_id] and preds.options == tuple(INTENTS)
    assert preds.y_true.tolist() == [INTENTS.index("lost_card")]


def test_ops_routes(app: Server) -> None:
    with httpx.Client(base_url=app.url) as http:
        app.client().chat.completions.create(
            model="m", response_format=enum_format(INTENTS),  # type: ignore[arg-type]
            messages=[{"role": "user", "content": "sure"}])
        assert http.get("/healthz").json() == {"status": "ok"}
        ready = http.get("/readyz")
        metrics = http.get("/metrics").text
        models = http.get("/v1/models").json()
    assert ready.status_code == 200 and ready.json()["escalation_available"] is True
    assert 'slotgate_decisions_total{route="fast"}' in metrics
    assert 'slotgate_stage_latency_seconds_count{stage="fast"}' in metrics
    assert [m["id"] for m in models["data"]] == [SLOW_MODEL, "slotgate-fast:mock"]


def ask_raw(server: Server, text: str) -> httpx.Response:
    with httpx.Client(base_url=server.url, timeout=20) as http:
        return http.post("/v1/chat/completions", json={
            "model": "m", "response_format": enum_format(INTENTS),
            "messages": [{"role": "user", "content": text}]})


def test_slow_path_failures_map_to_openai_errors(app: Server, standin: StandinHandle) -> None:
    standin.set_mode("ratelimit", times=2, retry_after_s=7)  # the call and its one retry, if any
    limited = ask_raw(app, "maybe about lost_card")
    standin.set_mode("fail500")
    down = ask_raw(app, "maybe about exchange_rate")
    standin.set_mode("ok")
    assert limited.status_code == 429 and limited.headers["retry-after"] == "7"
    assert limited.json()["error"]["code"] == "slow_path_rate_limited"
    assert down.status_code in (502, 503) and "retry-after" in down.headers
    assert set(down.json()["error"]) == {"message", "type", "param", "code"}
    with httpx.Client(base_url=app.url) as http:
        metrics = http.get("/metrics").text
    assert 'slotgate_responses_total{status="429",surface="openai"}' in metrics


def test_unverified_when_configured_and_the_slow_path_fails(
    standin: StandinHandle, tmp_path: Path
) -> None:
    settings = settings_for(standin, tmp_path, slow={"serve_unverified_on_failure": True})
    standin.set_mode("fail500")
    try:
        with Server(settings, backend=MockBackend(Recorder())) as server:
            response = ask_raw(server, "maybe about lost_card")
    finally:
        standin.set_mode("ok")
    assert response.status_code == 200
    facts = response.json()["slotgate"]
    assert facts["route"] == "unverified" and "not verified" in facts["note"]
    assert response.headers["x-slotgate-route"] == "unverified"
    assert json.loads(response.json()["choices"][0]["message"]["content"]) == "card_arrival"


def test_no_slow_model_says_escalation_is_unavailable(tmp_path: Path) -> None:
    with Server(settings_for(None, tmp_path), backend=MockBackend(Recorder())) as server:
        response = ask_raw(server, "no idea")
        confident = ask_raw(server, "sure")
    # Nothing changes by waiting while no slow model is configured: no Retry-After (the OpenAI
    # SDK would otherwise retry in silence).
    assert response.status_code == 503 and "retry-after" not in response.headers
    assert "escalation unavailable" in response.json()["error"]["message"]
    assert confident.status_code == 200


def test_full_fast_queue_is_429_with_retry_after(standin: StandinHandle, tmp_path: Path) -> None:
    import asyncio as aio
    from concurrent.futures import ThreadPoolExecutor

    async def slow(request: DecisionRequest) -> list[float]:
        await aio.sleep(0.5)
        return [0.98, 0.01, 0.01]

    settings = settings_for(standin, tmp_path, fast={"max_concurrency": 1, "timeout_s": 5},
                            max_queue=1)
    with Server(settings, backend=MockBackend(slow)) as server, ThreadPoolExecutor(4) as pool:
        responses = list(pool.map(lambda i: ask_raw(server, f"sure {i}"), range(4)))
    statuses = sorted(r.status_code for r in responses)
    assert statuses.count(200) >= 2 and 429 in statuses
    refused = next(r for r in responses if r.status_code == 429)
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["type"] == "rate_limit_error"


def test_sdk_parse_with_a_pydantic_model(app: Server) -> None:
    import enum
    from typing import Literal

    from pydantic import BaseModel

    class Urgency(str, enum.Enum):
        yes = "yes"
        no = "no"

    class Triage(BaseModel):
        intent: Literal["card_arrival", "lost_card", "exchange_rate"]
        urgent: Urgency

    completion = app.client().chat.completions.parse(
        model="m", response_format=Triage,
        messages=[{"role": "user", "content": "sure: my card is late"}])
    parsed = completion.choices[0].message.parsed
    assert parsed == Triage(intent="card_arrival", urgent=Urgency.yes)
    assert completion.model_extra["slotgate"]["route"] == "fast"  # type: ignore[index]
