"""The slow path through the REAL litellm against standins/llm.py on loopback: an answer end to
end, every failure translated into the error tree, passthrough and streaming, and the provider key
never in an error or a log line. The prompt and retry rules without HTTP: test_slow.py."""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

import pytest
from pydantic import SecretStr

from policies.types import DecisionRequest, Option
from router.errors import (
    InvalidRequest,
    SlowPathError,
    SlowPathRateLimited,
    SlowPathTimeout,
    SlowPathUnavailable,
)
from router.routing.slow import SlowPath, _litellm
from router.settings import SlowPathSettings
from standins.llm import StandinHandle, start_standin

KEY = "sk-test-PROVIDERKEY-0123456789abcdef"
OPTIONS = ("lost_card", "card_arrival", "exchange_rate")


@pytest.fixture
def llm(standin: StandinHandle) -> StandinHandle:
    standin.set_mode("ok")
    standin.clear()
    return standin


def slow_path(handle: StandinHandle, **kw: Any) -> SlowPath:
    options: dict[str, Any] = {"model": "openai/standin", "api_base": handle.api_base,
                               "api_key": SecretStr(KEY), "timeout_s": 5.0, **kw}
    return SlowPath(SlowPathSettings(**options))


def request(state: str = "when will my card_arrival happen?") -> DecisionRequest:
    return DecisionRequest(question_id="intent", instructions="Which intent?", state=state,
                           options=tuple(Option(o) for o in OPTIONS), context="Banking support.")


async def test_decide_answers_with_an_enforced_option(llm: StandinHandle) -> None:
    answer = await slow_path(llm).ask(request())
    assert answer.answer == "card_arrival" and answer.attempts == 1
    assert answer.model == "openai/standin" and answer.latency_ms > 0
    [call] = llm.calls()
    body = call["body"]
    schema = body["response_format"]["json_schema"]
    assert body["response_format"]["type"] == "json_schema" and schema["strict"] is True
    assert schema["schema"]["properties"]["answer"]["enum"] == list(OPTIONS)
    assert body["messages"][-1] == {"role": "user", "content": request().state}
    assert "exchange_rate" in body["messages"][0]["content"]  # options listed in the system prompt
    assert call["authorization"] == f"Bearer {KEY}"  # the key goes upstream, nowhere else


async def test_rate_limit_is_translated_with_retry_after_and_not_retried(llm: StandinHandle) -> None:
    llm.set_mode("ratelimit", retry_after_s=3)
    with pytest.raises(SlowPathRateLimited) as info:
        await slow_path(llm).ask(request())
    assert info.value.retry_after_s == 3.0 and info.value.status_code == 429
    assert len(llm.calls()) == 1


async def test_stall_past_the_timeout_is_a_timeout(llm: StandinHandle) -> None:
    llm.set_mode("stall", stall_s=5)
    start = time.monotonic()
    with pytest.raises(SlowPathTimeout) as info:
        await slow_path(llm, timeout_s=0.5).ask(request())
    assert time.monotonic() - start < 2.0
    assert info.value.status_code == 504
    llm.set_mode("ok")


async def test_server_error_and_stopped_server_are_unavailable(llm: StandinHandle) -> None:
    llm.set_mode("fail500")
    with pytest.raises(SlowPathUnavailable):
        await slow_path(llm).ask(request())
    assert len(llm.calls()) == 1  # no hidden retries
    gone = start_standin()
    gone.stop()
    with pytest.raises(SlowPathUnavailable) as info:
        await slow_path(gone).ask(request())
    assert info.value.status_code == 503


async def test_passthrough_returns_an_openai_shaped_completion(llm: StandinHandle) -> None:
    body = {"model": "openai/standin", "messages": [{"role": "user", "content": "hello"}],
            "temperature": 0.2}
    result = await slow_path(llm).complete(body)
    assert result["object"] == "chat.completion"
    assert result["choices"][0]["message"]["content"] == "echo: hello"
    [call] = llm.calls()
    assert call["body"]["temperature"] == 0.2 and "response_format" not in call["body"]


async def test_unknown_fields_reach_the_upstream_body_not_litellm(llm: StandinHandle) -> None:
    body = {"model": "openai/standin", "messages": [{"role": "user", "content": "hi"}],
            "top_k": 5, "mock_response": "mocked", "chat_template_kwargs": {"x": 1}}
    result = await slow_path(llm).complete(body)
    assert result["choices"][0]["message"]["content"] == "echo: hi"  # not litellm's mock
    sent = llm.calls()[0]["body"]
    assert sent["top_k"] == 5 and sent["mock_response"] == "mocked"
    assert sent["chat_template_kwargs"] == {"x": 1}


async def test_passthrough_model_litellm_cannot_route_is_the_callers_400(
        llm: StandinHandle) -> None:
    """An allowed alias without a provider prefix: litellm refuses it before any call; that is
    a 400 naming ``model`` (not a 502 blaming the upstream), streaming or not. A decision's model
    is the operator's, so there it stays a slow-path error."""
    slow = slow_path(llm, allowed_models=["my-alias"])
    body = {"model": "my-alias", "messages": [{"role": "user", "content": "x"}]}
    with pytest.raises(InvalidRequest) as caught:
        await slow.complete(body)
    assert caught.value.field == "model" and caught.value.status_code == 400
    assert "my-alias" in caught.value.message
    with pytest.raises(InvalidRequest):
        async for _ in slow.stream({**body, "stream": True}):
            pass
    assert llm.calls() == []
    with pytest.raises(SlowPathError):
        await slow_path(llm, model="my-alias").ask(request())


async def test_stream_passes_chunks_through_as_they_arrive(llm: StandinHandle) -> None:
    """The stand-in holds its last chunk until the test has the first: a slow path that buffered
    the stream would only pass the first chunk on once the gate timed out."""
    gate = threading.Event()
    llm.state.last_chunk_gate = gate
    body = {"model": "openai/standin", "stream": True,
            "messages": [{"role": "user", "content": "stream these words please"}]}
    events: list[bytes] = []
    llm.state.gate_waits.clear()
    try:
        async for event in slow_path(llm).stream(body):
            gate.set()  # we have a chunk: the stand-in may end the stream
            events.append(event)
    finally:
        llm.state.last_chunk_gate = None
        gate.set()
    assert llm.state.gate_waits == [True]  # the first chunk came while the last was held back
    assert all(e.startswith(b"data: ") and e.endswith(b"\n\n") for e in events)
    assert events[-1] == b"data: [DONE]\n\n"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "echo: stream these words please"
    assert len(chunks) >= 4 and all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert llm.calls()[0]["body"]["stream"] is True


async def test_stream_failure_before_the_first_chunk_raises(llm: StandinHandle) -> None:
    llm.set_mode("ratelimit", retry_after_s=2)
    body = {"model": "openai/standin", "stream": True, "messages": [{"role": "user", "content": "x"}]}
    with pytest.raises(SlowPathRateLimited):
        async for _ in slow_path(llm).stream(body):
            pass


async def test_stream_cut_midway_ends_with_an_error_event(llm: StandinHandle) -> None:
    llm.set_mode("cut", times=1)
    body = {"model": "openai/standin", "stream": True,
            "messages": [{"role": "user", "content": "a message long enough for many chunks"}]}
    events = [e async for e in slow_path(llm).stream(body)]
    assert len(events) >= 2 and events[0].startswith(b"data: {")
    last = json.loads(events[-1][6:])
    assert set(last) == {"error"} and last["error"]["type"] in {"upstream_error", "server_error"}
    assert b"data: [DONE]\n\n" not in events  # a cut stream never claims to be complete
    assert KEY not in last["error"]["message"]


@pytest.mark.parametrize("mode", ["fail500", "ratelimit", "malformed", "stall"])
async def test_provider_key_never_in_errors_or_logs(
        llm: StandinHandle, mode: str, caplog: pytest.LogCaptureFixture) -> None:
    llm.set_mode(mode, stall_s=3)
    with caplog.at_level(logging.DEBUG), pytest.raises(SlowPathError) as info:
        await slow_path(llm, timeout_s=0.3).ask(request())
    llm.set_mode("ok")
    error = info.value
    seen = [str(error), repr(error), error.message, caplog.text,
            str(error.__cause__), repr(error.__cause__)]
    assert not any(KEY in s for s in seen)


async def test_a_key_inside_a_foreign_message_is_masked_and_dropped(llm: StandinHandle) -> None:
    slow = slow_path(llm)
    with pytest.raises(SlowPathError) as info:
        slow._raise_translated(ValueError(f"upstream said: bad key {KEY} / Bearer abc.def"))
    assert KEY not in info.value.message and "abc.def" not in info.value.message
    assert "***" in info.value.message and info.value.__cause__ is None


async def test_aclose_closes_the_clients_litellm_cached_for_this_loop(llm: StandinHandle) -> None:
    slow = slow_path(llm)
    litellm = _litellm()  # imported as slotgate imports it (no cost-map download)
    from litellm.caching.evicted_client_closer import running_loop_token

    cache = litellm.in_memory_llm_clients_cache
    suffix = f"-{running_loop_token()}"
    await slow.ask(request())
    mine = [cache.cache_dict[k] for k in cache.cache_dict
            if isinstance(k, str) and k.endswith(suffix)]
    assert mine  # litellm keeps a client per loop...
    await slow.aclose()
    assert not [k for k in cache.cache_dict if isinstance(k, str) and k.endswith(suffix)]
    assert all(getattr(c, "is_closed", lambda: True)() for c in mine)  # ...and never closes it
    assert (await slow.ask(request())).answer == "card_arrival"  # a later call gets a new one
    await slow.aclose()


def test_whether_the_slow_model_takes_images_is_litellms_word_unless_set(
        llm: StandinHandle) -> None:
    assert slow_path(llm, model="openai/gpt-4o").supports_images()
    assert not slow_path(llm).supports_images()  # a model litellm does not know
    assert slow_path(llm, vision=True).supports_images()
    assert not slow_path(llm, model="openai/gpt-4o", vision=False).supports_images()
