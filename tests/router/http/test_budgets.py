"""Per-key escalation budgets through real HTTP: the live server (uvicorn, the OpenAI SDK as
client, real litellm against the stand-in LLM), budgets counted in the tests' private Redis
and shared by two replicas; what a decision gets once its key's budget is spent, the budget
headers and the /metrics counters."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from router.backends.mock import MockBackend
from router.errors import ConfigError
from router.settings import load_settings
from router.store.budgets import KeyBudgets, RedisKeyBudgets
from standins.llm import StandinHandle
from tests.router.http.test_app import INTENTS, Recorder, Server, enum_format, settings_for

KEY_A, KEY_B = "budget-key-a-0123456789", "budget-key-b-0123456789"
HASH_A, HASH_B = (hashlib.sha256(k.encode()).hexdigest() for k in (KEY_A, KEY_B))


def budgeted(standin: StandinHandle, tmp_path: Path, redis_url: str | None,
             **budget: Any) -> Any:
    return settings_for(standin, tmp_path, api_key_hashes=[HASH_A, HASH_B],
                        cache={"redis_url": redis_url} if redis_url else {},
                        budget={"limit": 2, "window_s": 3600, **budget})


def decide(server: Server, key: str, text: str) -> httpx.Response:
    body = {"model": "m", "response_format": enum_format(INTENTS),
            "messages": [{"role": "user", "content": text}]}
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30,
                      headers={"authorization": f"Bearer {key}"})


def facts(reply: httpx.Response) -> dict[str, Any]:
    assert reply.status_code == 200, reply.text
    found: dict[str, Any] = reply.json()["slotgate"]
    return found


def remaining(reply: httpx.Response) -> str | None:
    return reply.headers.get("x-slotgate-budget-remaining")


def test_a_spent_budget_is_refused_with_retry_after_at_the_reset_on_every_replica(
        standin: StandinHandle, tmp_path: Path, redis_url: str) -> None:
    replicas = [budgeted(standin, tmp_path / name, redis_url, on_spent="refuse")
                for name in ("one", "two")]  # a decision log each, one Redis
    recorder = Recorder()
    with Server(replicas[0], backend=MockBackend(recorder)) as one, \
            Server(replicas[1], backend=MockBackend(recorder)) as two:
        first, second = decide(one, KEY_A, "where is my card 1"), decide(two, KEY_A, "card 2")
        refused = decide(one, KEY_A, "where is my card 3")
        # The SDK raises the 429 as a client would meet it (no retries configured).
        with pytest.raises(openai.RateLimitError) as caught:
            two.client(KEY_A).chat.completions.create(
                model="m", response_format=enum_format(INTENTS),  # type: ignore[arg-type]
                messages=[{"role": "user", "content": "where is my card 4"}])
        fast = decide(two, KEY_A, "sure: card arrival")
        other_key = decide(one, KEY_B, "where is my card 5")
        metrics = httpx.get(f"{one.url}/metrics").text
    assert [facts(r)["route"] for r in (first, second)] == ["slow", "slow"]
    assert [remaining(r) for r in (first, second)] == ["1", "0"]  # shared by both replicas
    assert refused.status_code == 429 and caught.value.status_code == 429
    error = refused.json()["error"]
    assert error["code"] == "budget_spent" and "escalation budget is spent" in error["message"]
    assert "2 per 3600 s" in error["message"]
    reset = int(refused.headers["x-slotgate-budget-reset"])
    assert 1 <= int(refused.headers["retry-after"]) <= 3600 and abs(
        int(refused.headers["retry-after"]) - reset) <= 1
    assert refused.headers["x-slotgate-budget-limit"] == "2"
    assert facts(fast)["route"] == "fast" and remaining(fast) == "0"  # fast answers go on
    assert facts(other_key)["route"] == "slow" and remaining(other_key) == "1"
    assert len(standin.calls()) == 3  # two for key A, one for key B
    namespace_a = f"key-{HASH_A[:16]}"
    assert f'slotgate_budget_spent_decisions_total{{namespace="{namespace_a}",on_spent="refuse"}} 1.0' \
        in metrics  # counted on the replica that refused it
    assert f'slotgate_budget_charged_units_total{{namespace="{namespace_a}"}}' in metrics


def test_a_spent_budget_serves_the_fast_answer_unverified_when_the_operator_says_so(
        standin: StandinHandle, tmp_path: Path, redis_url: str) -> None:
    settings = budgeted(standin, tmp_path, redis_url, on_spent="unverified", limit=1)
    with Server(settings, backend=MockBackend(Recorder())) as server:
        paid = decide(server, KEY_A, "where is my card 1")
        unpaid = decide(server, KEY_A, "where is my card 2")
    assert facts(paid)["route"] == "slow"
    served = facts(unpaid)
    assert served["route"] == "unverified" and served["guarantee"] is None
    assert "escalation budget is spent" in served["note"]
    assert json.loads(unpaid.json()["choices"][0]["message"]["content"]) in INTENTS
    assert len(standin.calls()) == 1


def test_a_spent_budget_asks_the_cheaper_model_uncounted(
        standin: StandinHandle, tmp_path: Path) -> None:
    """No Redis: the budget is this process's."""
    settings = budgeted(standin, tmp_path, None, on_spent="cheaper_model", limit=1,
                        cheaper_model="openai/standin-small")
    with Server(settings, backend=MockBackend(Recorder())) as server:
        replies = [decide(server, KEY_A, f"where is my card {i}") for i in range(3)]
    assert [facts(r)["route"] for r in replies] == ["slow"] * 3
    assert [c["body"]["model"] for c in standin.calls()] == [
        "standin", "standin-small", "standin-small"]
    assert "answered by budget.cheaper_model" in facts(replies[1])["note"]
    assert [remaining(r) for r in replies] == ["0", "0", "0"]


def test_budgets_count_per_window_in_process_and_start_again_in_the_next() -> None:
    now = [7_200.0 - 10]
    budgets = KeyBudgets(limit=3, window_s=3600, per_key={HASH_B: 1}, clock=lambda: now[0])

    async def run() -> list[tuple[float, float, float]]:
        seen = []
        for _ in range(2):
            state = await budgets.charge("key-x", 2)
            seen.append((state.used, state.remaining, state.reset_s))
        now[0] += 20  # into the next window
        state = await budgets.state("key-x")
        seen.append((state.used, state.remaining, state.reset_s))
        state = await budgets.charge(f"key-{HASH_B[:16]}", 1)
        seen.append((state.used, state.remaining, state.spent))
        return seen

    import asyncio

    assert asyncio.run(run()) == [(2, 1, 10), (4, 0, 10), (0, 3, 3590), (1, 0, True)]


def test_redis_budgets_are_one_budget_for_every_instance(redis_url: str) -> None:
    import asyncio

    async def run() -> tuple[float, float, bool]:
        one = RedisKeyBudgets(redis_url, limit=2.5, window_s=60)
        two = RedisKeyBudgets(redis_url, limit=2.5, window_s=60)
        try:
            await one.charge("key-a", 1.25)
            await two.charge("key-a", 1.25)
            state = await one.state("key-a")
            other = await two.state("key-b")
            return state.used, state.reset_s, other.spent
        finally:
            await one.aclose()
            await two.aclose()

    used, reset_s, other_spent = asyncio.run(run())
    assert used == 2.5 and 0 < reset_s <= 60 and not other_spent


@pytest.mark.parametrize(("budget", "field"), [
    ({"limit": 5, "on_spent": "cheaper_model"}, "budget.cheaper_model"),
    ({"limit": 5, "per_key": {"abc": 3}}, "budget.per_key"),
    ({"limit": 0}, "budget.limit"),
    ({"limit": 5, "on_spent": "shrug"}, "budget.on_spent"),
])
def test_bad_budget_settings_are_refused_naming_the_field(
        budget: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_settings(budget=budget)


def test_with_redis_unreachable_each_process_counts_on_its_own(
        caplog: pytest.LogCaptureFixture) -> None:
    import asyncio
    import logging

    from tests.conftest import free_port

    async def run() -> tuple[float, float]:
        budgets = RedisKeyBudgets(f"redis://127.0.0.1:{free_port()}/0", limit=2, window_s=60)
        try:
            await budgets.charge("key-a", 1)
            charged = await budgets.charge("key-a", 1)  # within retry_interval_s: no new try
            return charged.used, (await budgets.state("key-a")).remaining
        finally:
            await budgets.aclose()

    with caplog.at_level(logging.WARNING, logger="router.store.budgets"):
        used, left = asyncio.run(run())
    assert (used, left) == (2, 0)  # never unlimited
    assert [r.message for r in caplog.records if "redis unavailable" in r.message]
