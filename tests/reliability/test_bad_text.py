"""Bad text reaches neither a 5xx nor a dropped reply, and decision bodies
with fields a decision cannot answer are honoured or refused clearly. A live server,
the real slow path (litellm) on the stand-in LLM, httpx and the OpenAI SDK as clients."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from policies.types import DecisionRequest
from router.backends.mock import MockBackend
from router.settings import Settings
from standins.llm import StandinHandle
from tests.live import LiveServer

OPTIONS = ["card_arrival", "lost_card"]
ENUM = {"type": "json_schema",
        "json_schema": {"name": "intent", "schema": {"type": "string", "enum": OPTIONS}}}
LONE = "\ud800"  # json.dumps writes it as the escape "\\ud800", as a client's JSON would


def unsure(request: DecisionRequest) -> list[float]:
    """0.97 on the first option when the text says 'sure', else an even read (escalated)."""
    k = len(request.options)
    top = 0.97 if "sure" in request.state else 1 / k
    return [top] + [(1 - top) / (k - 1)] * (k - 1)


@pytest.fixture(scope="module")
def server(standin: StandinHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = Settings(
        slow={"model": "openai/standin", "api_base": standin.api_base, "api_key": "sk-standin-1",
              "timeout_s": 10, "serve_unverified_on_failure": True},
        log={"decision_log_path": tmp_path_factory.mktemp("bad-text") / "decisions.jsonl"},
        policy={"fallback_threshold": 0.9})
    with LiveServer(settings, backend=MockBackend(unsure)) as running:
        yield running


@pytest.fixture
def http(server: LiveServer, standin: StandinHandle) -> Iterator[httpx.Client]:
    standin.set_mode("ok")
    standin.clear()
    with httpx.Client(base_url=server.url, timeout=20) as client:
        yield client


def post(http: httpx.Client, path: str, payload: dict[str, Any]) -> httpx.Response:
    return http.post(path, content=json.dumps(payload).encode(),  # ensure_ascii: "\ud800" escape
                     headers={"content-type": "application/json"})


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "openai/standin", "messages": [{"role": "user", "content": "hi"}], **fields}


SURROGATE_CASES = [  # (path, body, field named)
    ("/v1/chat/completions", chat(response_format=ENUM,
                                  messages=[{"role": "user", "content": f"card {LONE}"}]),
     "messages.0.content"),
    ("/v1/chat/completions", chat(response_format=ENUM, messages=[
        {"role": "system", "content": f"bank {LONE}"}, {"role": "user", "content": "card"}]),
     "messages.0.content"),
    ("/v1/chat/completions", chat(guided_choice=["card_arrival", f"lost{LONE}"]),
     "guided_choice.1"),
    ("/v1/chat/completions", chat(messages=[{"role": "user", "content": f"hello {LONE}"}]),
     "messages.0.content"),  # a passthrough: never blamed on the upstream
    ("/v1/systemone", {"state": f"card {LONE}",
                       "questions": {"q": {"type": "choice", "criteria": OPTIONS}}}, "state"),
    ("/v1/systemone", {"state": "card", "questions": {
        "q": {"type": "choice", "criteria": ["card_arrival", f"x{LONE}"]}}}, "questions.q.criteria.1"),
]


@pytest.mark.parametrize(("path", "payload", "field"), SURROGATE_CASES)
def test_a_lone_surrogate_is_a_400_naming_the_field(
    http: httpx.Client, standin: StandinHandle, path: str, payload: dict[str, Any], field: str
) -> None:
    response = post(http, path, payload)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert field in error["message"] and "surrogate" in error["message"]
    if path != "/v1/systemone":
        assert error["param"] == field
    assert standin.calls() == []


def test_feedback_label_with_a_lone_surrogate_is_a_400(http: httpx.Client) -> None:
    response = post(http, "/v1/feedback", {"decision_id": "x", "label": f"a{LONE}"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "label"


def test_upstream_error_text_with_cr_lf_still_gets_a_reply(
    http: httpx.Client, standin: StandinHandle
) -> None:
    standin.set_mode("fail500", error_message="broken\r\nx-evil: 1\r\n\r\nbody")
    response = post(http, "/v1/chat/completions", chat(
        response_format=ENUM, messages=[{"role": "user", "content": "which one?"}]))
    assert response.status_code == 200, response.text
    assert response.headers["x-slotgate-route"] == "unverified"
    note = response.headers["x-slotgate-note"]
    assert "broken  x-evil: 1" in note and "x-evil" not in response.headers
    assert "broken\r\nx-evil" in response.json()["slotgate"]["note"]  # the body keeps it intact
    assert len(standin.calls()) >= 1


def test_integer_enum_is_decided_through_the_sdk(server: LiveServer, standin: StandinHandle) -> None:
    standin.set_mode("ok")
    standin.clear()
    fmt = {"type": "json_schema", "json_schema": {
        "name": "stars", "schema": {"type": "integer", "enum": [1, 2, 3]}}}
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0) as client:
        reply = client.chat.completions.create(
            model="m", response_format=fmt,  # type: ignore[arg-type]
            messages=[{"role": "user", "content": "sure, five stars"}])
    assert json.loads(reply.choices[0].message.content or "") == 1  # an integer, not "1"
    assert reply.model_extra["slotgate"]["route"] == "fast"  # type: ignore[index]
    assert standin.calls() == []


def test_nullable_enum_passes_through_to_the_slow_model(
    http: httpx.Client, standin: StandinHandle
) -> None:
    fmt = {"type": "json_schema", "json_schema": {
        "name": "intent", "schema": {"type": ["string", "null"], "enum": [*OPTIONS, None]}}}
    response = post(http, "/v1/chat/completions", chat(response_format=fmt))
    assert response.status_code == 200, response.text
    assert "slotgate" not in response.json() and len(standin.calls()) == 1


def test_tool_choice_required_is_passed_through(http: httpx.Client, standin: StandinHandle) -> None:
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    response = post(http, "/v1/chat/completions",
                    chat(response_format=ENUM, tools=tools, tool_choice="required"))
    assert response.status_code == 200, response.text
    assert "slotgate" not in response.json()
    [call] = standin.calls()
    assert call["body"]["tool_choice"] == "required"


def test_logprobs_on_a_decision_is_a_clear_400(http: httpx.Client, standin: StandinHandle) -> None:
    response = post(http, "/v1/chat/completions", chat(response_format=ENUM, logprobs=True))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "logprobs" and "calibrated probability" in error["message"]
    assert standin.calls() == []


def test_streamed_decision_honours_include_usage(server: LiveServer) -> None:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0) as client:
        chunks = list(client.chat.completions.create(
            model="m", response_format=ENUM, stream=True,  # type: ignore[arg-type]
            stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "sure, it has not arrived"}]))
        plain = list(client.chat.completions.create(
            model="m", response_format=ENUM, stream=True,  # type: ignore[arg-type]
            messages=[{"role": "user", "content": "sure, it has not arrived"}]))
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.total_tokens == 0
    assert all(c.usage is None for c in plain) and plain[-1].choices
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == '"card_arrival"'


