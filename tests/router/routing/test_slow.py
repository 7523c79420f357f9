"""The slow path's own rules with an injected completion function (no HTTP, no litellm call):
the prompt and the enforced options, the caller's conversation, the corrective retry, passthrough
arguments and refusals, no slow model, and the one concurrency cap. The same path through the
real litellm over loopback: test_slow_litellm.py."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import SecretStr

from policies.types import DecisionRequest, Option
from router.errors import (
    Forbidden,
    InvalidRequest,
    NoSlowModel,
    SlowPathInvalidAnswer,
    TooManyRequests,
)
from router.routing.backpressure import ConcurrencyLimit
from router.routing.slow import SlowPath, parse_answer
from router.settings import SlowPathSettings

KEY = "sk-test-PROVIDERKEY-0123456789abcdef"
OPTIONS = ("lost_card", "card_arrival", "exchange_rate")


class ScriptedCompletion:
    """Answers each call with the next scripted content (the last one repeats), recording every
    call's keyword arguments; ``gate`` (when set) holds every call until it opens."""

    def __init__(self, *contents: str | None, gate: asyncio.Event | None = None) -> None:
        self.contents = list(contents)
        self.calls: list[dict[str, Any]] = []
        self.gate = gate

    async def __call__(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        if self.gate is not None:
            await self.gate.wait()
        content = self.contents.pop(0) if len(self.contents) > 1 else self.contents[0]
        message = SimpleNamespace(content=content)
        body = {"object": "chat.completion", "model": kwargs["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}
        return SimpleNamespace(choices=[SimpleNamespace(message=message)],
                               model_dump=lambda: body)


def slow_path(completion: ScriptedCompletion, **kw: Any) -> SlowPath:
    limit = kw.pop("limit", None)
    options: dict[str, Any] = {"model": "openai/standin", "api_base": "http://upstream.test/v1",
                               "api_key": SecretStr(KEY), "timeout_s": 5.0, **kw}
    return SlowPath(SlowPathSettings(**options), completion=completion, limit=limit)


def request(state: str = "when will my card arrive?", **kw: Any) -> DecisionRequest:
    return DecisionRequest(question_id="intent", instructions="Which intent?", state=state,
                           options=tuple(Option(o) for o in OPTIONS), context="Banking support.",
                           **kw)


async def test_decide_enforces_the_options_and_sends_the_state() -> None:
    completion = ScriptedCompletion('{"answer": "card_arrival"}')
    answer = await slow_path(completion).ask(request())
    assert (answer.answer, answer.attempts, answer.model) == ("card_arrival", 1, "openai/standin")
    [call] = completion.calls
    schema = call["response_format"]["json_schema"]
    assert call["response_format"]["type"] == "json_schema" and schema["strict"] is True
    assert schema["schema"]["properties"]["answer"]["enum"] == list(OPTIONS)
    system, user = call["messages"]
    assert system["role"] == "system" and "Banking support." in system["content"]
    assert all(f"- {o}" in system["content"] for o in OPTIONS)
    assert user == {"role": "user", "content": request().state}
    # The operator's upstream and key go with every call; litellm must not retry on its own.
    assert call["api_base"] == "http://upstream.test/v1" and call["api_key"] == KEY
    assert call["max_retries"] == 0 and call["num_retries"] == 0
    assert call["timeout"] == pytest.approx(5.0, abs=0.05)  # what is left of slow.timeout_s


async def test_decide_shows_the_callers_conversation_when_there_is_one() -> None:
    turns = (("system", "be terse"), ("user", "exchange_rate?"))
    completion = ScriptedCompletion('"exchange_rate"')
    answer = await slow_path(completion).ask(request(turns=turns))
    assert answer.answer == "exchange_rate"
    assert completion.calls[0]["messages"][1:] == [
        {"role": "system", "content": "be terse"}, {"role": "user", "content": "exchange_rate?"}]


async def test_wrong_option_gets_one_corrective_retry() -> None:
    completion = ScriptedCompletion('{"answer": "not-an-option"}', '{"answer": "lost_card"}')
    answer = await slow_path(completion).ask(request())
    assert (answer.answer, answer.attempts) == ("lost_card", 2)
    first, second = completion.calls
    assert second["messages"][:-2] == first["messages"]
    assert second["messages"][-2] == {"role": "assistant", "content": '{"answer": "not-an-option"}'}
    correction = second["messages"][-1]["content"]
    assert "not valid" in correction and all(json.dumps(o) in correction for o in OPTIONS)


async def test_no_valid_option_after_the_retry_is_an_invalid_answer() -> None:
    completion = ScriptedCompletion("I would rather not say")
    with pytest.raises(SlowPathInvalidAnswer) as info:
        await slow_path(completion).ask(request())
    assert info.value.status_code == 502 and "corrective retry" in info.value.message
    assert "rather not say" in info.value.message and len(completion.calls) == 2


async def test_no_model_configured_is_the_one_no_slow_model_error() -> None:
    completion = ScriptedCompletion('"lost_card"')
    slow = SlowPath(SlowPathSettings(), completion=completion)
    assert slow.available is False
    with pytest.raises(NoSlowModel) as info:
        await slow.ask(request())
    assert info.value.status_code == 503
    assert info.value.message == str(NoSlowModel("escalation"))
    assert "escalation unavailable" in info.value.message
    assert "SLOTGATE_SLOW_MODEL" in info.value.message
    with pytest.raises(NoSlowModel, match="passthrough unavailable"):
        await slow.complete({"messages": [{"role": "user", "content": "hi"}]})
    assert completion.calls == []


async def test_passthrough_keeps_openai_fields_as_arguments_and_the_rest_in_the_body() -> None:
    completion = ScriptedCompletion("echo")
    body = {"messages": [{"role": "user", "content": "hi"}], "temperature": 0.2,
            "top_k": 5, "mock_response": "mocked", "stream": False}
    result = await slow_path(completion).complete(body)
    assert result["choices"][0]["message"]["content"] == "echo"
    [call] = completion.calls
    assert call["model"] == "openai/standin"  # the configured model when the body names none
    assert call["temperature"] == 0.2 and "stream" not in call
    # litellm's own keywords (mock_response, ...) are never reachable by a client.
    assert "mock_response" not in call and "top_k" not in call
    assert call["extra_body"] == {"top_k": 5, "mock_response": "mocked"}


@pytest.mark.parametrize(("body", "error", "field"), [
    ({"model": "gpt-4o"}, Forbidden, "model"),
    ({"messages": []}, InvalidRequest, "messages"),
])
async def test_passthrough_refuses_models_off_the_list_and_empty_chats(
        body: dict[str, Any], error: type[Exception], field: str) -> None:
    completion = ScriptedCompletion("echo")
    full = {"model": "openai/standin", "messages": [{"role": "user", "content": "hi"}], **body}
    with pytest.raises(error) as info:
        await slow_path(completion, allowed_models=["openai/other"]).complete(full)
    assert getattr(info.value, "field", None) == field
    assert completion.calls == []


async def test_passthrough_maps_the_alias_any_to_the_configured_model() -> None:
    """The README's client sends model="any"; a plain chat from it reaches the slow model."""
    completion = ScriptedCompletion("echo")
    await slow_path(completion).complete(
        {"model": "any", "messages": [{"role": "user", "content": "x"}]})
    assert completion.calls[0]["model"] == "openai/standin"


async def test_passthrough_allows_listed_models() -> None:
    completion = ScriptedCompletion("echo")
    await slow_path(completion, allowed_models=["openai/other"]).complete(
        {"model": "openai/other", "messages": [{"role": "user", "content": "x"}]})
    assert completion.calls[0]["model"] == "openai/other"


async def test_one_cap_covers_decisions_and_passthrough() -> None:
    """One ConcurrencyLimit for the slow model: a passthrough holding its only slot makes a
    decision wait, and with no room to wait the next caller gets 429 at once."""
    gate = asyncio.Event()
    completion = ScriptedCompletion('"lost_card"', gate=gate)
    rejected: list[int] = []
    limit = ConcurrencyLimit("slow path", capacity=1, max_waiting=1,
                             on_reject=lambda: rejected.append(1))
    slow = slow_path(completion, limit=limit)
    passthrough = asyncio.create_task(
        slow.complete({"messages": [{"role": "user", "content": "hi"}]}))
    decision = asyncio.create_task(slow.ask(request()))
    await asyncio.sleep(0.01)
    assert len(completion.calls) == 1  # the decision waits for the passthrough's slot
    with pytest.raises(TooManyRequests) as info:
        await slow.ask(request("another"))
    assert "slow path queue is full" in info.value.message and rejected == [1]
    gate.set()
    await passthrough
    assert (await decision).answer == "lost_card"
    assert len(completion.calls) == 2


def test_parse_answer_accepts_only_options() -> None:
    assert parse_answer('{"answer": "b"}', ["a", "b"]) == "b"
    assert parse_answer('"a"', ["a", "b"]) == "a"
    assert parse_answer(" a ", ["a", "b"]) == "a"
    assert parse_answer('{"answer": "c"}', ["a", "b"]) is None
    assert parse_answer("not json {", ["a", "b"]) is None
    assert parse_answer(None, ["a"]) is None
    assert parse_answer('{"answer": 1}', ["1"]) is None


@pytest.mark.parametrize("streamed", [False, True], ids=["passthrough", "streamed passthrough"])
async def test_a_passthrough_that_never_gets_a_slot_is_refused_at_its_deadline(
    streamed: bool,
) -> None:
    """slow.timeout_s is one budget for the wait for a slot and the call, for passthrough as for
    escalations: a passthrough that waits past it behind a held slot gets the queue's 429, streamed
    or not: neither a 504 from the call's backstop firing mid-wait nor an unbounded wait for the
    slot."""
    gate = asyncio.Event()
    rejected: list[int] = []
    limit = ConcurrencyLimit("slow path", capacity=1, max_waiting=10,
                             on_reject=lambda: rejected.append(1))
    slow = slow_path(ScriptedCompletion("hello", gate=gate), limit=limit, timeout_s=0.2)
    body = {"messages": [{"role": "user", "content": "hi"}]}
    holder = asyncio.create_task(slow.complete(body))
    await asyncio.sleep(0.01)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(TooManyRequests, match="no free slot before the deadline") as info:
        async with asyncio.timeout(2.0):  # a wait with no end fails here instead of hanging
            if streamed:
                async for _ in slow.stream({**body, "stream": True}):
                    pass
            else:
                await slow.complete(body)
    assert 0.15 < loop.time() - t0 < 0.45  # at its deadline, before the call's backstop (0.45)
    assert info.value.retry_after_s >= 1 and rejected == [1]
    gate.set()
    await asyncio.gather(holder, return_exceptions=True)
