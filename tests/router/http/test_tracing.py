"""OpenTelemetry decision spans through real HTTP: the live server (uvicorn, the OpenAI SDK as
client, real litellm against the stand-in LLM), spans caught by the SDK's in-memory exporter.
Skipped where the ``tracing`` extra is not installed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.backends.mock import MockBackend
from router.errors import ConfigError
from standins.llm import StandinHandle
from tests.router.http.test_app import INTENTS, Recorder, Server, enum_format, settings_for

pytest.importorskip("opentelemetry.sdk.trace", reason="the tracing extra is not installed")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    yield InMemorySpanExporter()


def provider_for(exporter: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def chat(server: Server, text: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    body = {"model": "m", "response_format": enum_format(INTENTS),
            "messages": [{"role": "user", "content": text}]}
    reply = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=headers or {},
                       timeout=30)
    assert reply.status_code == 200, reply.text
    facts: dict[str, Any] = reply.json()["slotgate"]
    return facts


def decision_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == "slotgate.decision"]


def test_an_escalated_decision_is_a_child_of_the_callers_trace_and_passes_it_to_the_slow_model(
        standin: StandinHandle, tmp_path: Path, exporter: InMemorySpanExporter) -> None:
    settings = settings_for(standin, tmp_path, tracing={"enabled": True})
    with Server(settings, backend=MockBackend(Recorder()),
                tracer_provider=provider_for(exporter)) as server:
        facts = chat(server, "where is my secret card", {"traceparent": PARENT})
    [span] = decision_spans(exporter)
    context = span.get_span_context()
    assert format(context.trace_id, "032x") == TRACE_ID
    assert span.parent is not None and format(span.parent.span_id, "016x") == "00f067aa0ba902b7"
    attributes = dict(span.attributes or {})
    assert attributes["slotgate.route"] == "slow" and attributes["slotgate.escalated"] is True
    assert attributes["slotgate.decision_id"] == facts["decision_id"]
    assert attributes["slotgate.policy_id"] == facts["policy_id"]
    assert attributes["slotgate.guarantee"] == "none"
    assert attributes["slotgate.fast.read"] is True
    # The message text is not an attribute unless tracing.record_text says so.
    assert not any("secret" in str(value) for value in attributes.values())
    [call] = standin.calls()
    sent = call["traceparent"]
    assert sent is not None and sent.split("-")[1] == TRACE_ID
    assert sent.split("-")[2] == format(context.span_id, "016x")  # the decision span is its parent


def test_a_fast_decision_without_a_traceparent_starts_its_own_trace_and_records_text_if_asked(
        standin: StandinHandle, tmp_path: Path, exporter: InMemorySpanExporter) -> None:
    settings = settings_for(standin, tmp_path, tracing={"enabled": True, "record_text": True})
    with Server(settings, backend=MockBackend(Recorder()),
                tracer_provider=provider_for(exporter)) as server:
        chat(server, "sure: card arrival")
    [span] = decision_spans(exporter)
    attributes = dict(span.attributes or {})
    assert span.parent is None and attributes["slotgate.route"] == "fast"
    assert attributes["slotgate.state"] == "sure: card arrival"
    assert attributes["slotgate.answer"] == "card_arrival"
    assert standin.calls() == []


def test_tracing_off_makes_no_spans_and_sends_no_traceparent(
        standin: StandinHandle, tmp_path: Path, exporter: InMemorySpanExporter) -> None:
    settings = settings_for(standin, tmp_path)
    with Server(settings, backend=MockBackend(Recorder()),
                tracer_provider=provider_for(exporter)) as server:
        chat(server, "where is my card", {"traceparent": PARENT})
    assert exporter.get_finished_spans() == ()
    [call] = standin.calls()
    assert call["traceparent"] is None


def test_tracing_without_the_sdk_is_refused_naming_the_setting(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from router.http.app import create_app

    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # as if not installed
    settings = settings_for(None, tmp_path, tracing={"enabled": True})
    with pytest.raises(ConfigError, match=r"tracing\.enabled: .*pip install 'slotgate\[tracing\]'"):
        create_app(settings, backend=MockBackend(Recorder()))


def test_an_otlp_endpoint_that_is_not_a_url_is_refused_naming_the_field() -> None:
    from router.settings import load_settings

    with pytest.raises(ConfigError, match=r"tracing\.otlp_endpoint"):
        load_settings(tracing={"enabled": True, "otlp_endpoint": "collector:4318"})


def test_a_passthrough_chat_passes_the_callers_traceparent_on(
        standin: StandinHandle, tmp_path: Path, exporter: InMemorySpanExporter) -> None:
    settings = settings_for(standin, tmp_path, tracing={"enabled": True})
    with Server(settings, backend=MockBackend(Recorder()),
                tracer_provider=provider_for(exporter)) as server:
        reply = httpx.post(f"{server.url}/v1/chat/completions", timeout=30,
                           headers={"traceparent": PARENT},
                           json={"model": "any", "messages": [{"role": "user", "content": "hi"}]})
    assert reply.status_code == 200, reply.text
    assert decision_spans(exporter) == []  # not a decision
    [call] = standin.calls()
    assert call["traceparent"] == PARENT
