"""The systemone backend against the System One stand-in (a real BANKING77 model behind the
example server's validation): request bodies, answer parsing, retries by status, Retry-After,
the concurrency cap, auth, and errors mapped into router.errors."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from policies.types import DecisionRequest, Option
from router.backends.options import SystemOneOptions
from router.backends.systemone import SystemOneBackend
from router.errors import (
    BackendMalformed,
    BackendRejected,
    BackendTimeout,
    BackendUnavailable,
    ConfigError,
    UnprocessableRequest,
)
from router.settings import FastBackendSettings
from standins.harness import Reply
from standins.systemone_server import SystemOneStandin
from tests.conftest import free_port
from tests.router.backends.standins import intent_names, intent_request, small_reader

FOUR = ["card_arrival", "exchange_rate", "pin_blocked", "age_limit"]


def make(url: str, *, api_key: str | None = None, timeout_s: float = 10.0,
         max_concurrency: int = 8, **options: Any) -> SystemOneBackend:
    return SystemOneBackend(url, SystemOneOptions(**options), api_key=api_key,
                            timeout_s=timeout_s, max_concurrency=max_concurrency)


@pytest.fixture
def standin(banking77_dir: Path) -> Iterator[SystemOneStandin]:
    with SystemOneStandin(reader=small_reader(banking77_dir)) as server:
        yield server


@pytest.fixture
async def backend(standin: SystemOneStandin) -> AsyncIterator[SystemOneBackend]:
    b = make(standin.url)
    yield b
    await b.aclose()


async def test_body_carries_question_context_samples_and_seed(
    standin: SystemOneStandin, backend: SystemOneBackend
) -> None:
    request = intent_request(FOUR, context="You triage a bank's support inbox.", samples=2, seed=7)
    [scores] = await backend.read([request])
    body = standin.stats.bodies[0]
    assert list(body["questions"]) == ["intent"]
    question = body["questions"]["intent"]
    assert question["type"] == "choice"
    assert list(question["criteria"]) == FOUR  # order kept
    assert question["instructions"] == request.instructions
    assert body["instructions"] == request.context
    assert (body["samples"], body["seed"], body["state"]) == (2, 7, request.state)
    assert scores.options == tuple(FOUR)
    assert math.isclose(sum(scores.proba), 1.0, abs_tol=1e-9)
    assert scores.top[0] == "card_arrival"  # the real model reads the message


async def test_question_id_is_made_acceptable_to_the_example_server(
    standin: SystemOneStandin, backend: SystemOneBackend
) -> None:
    [scores] = await backend.read([intent_request(FOUR, question_id="bank:intent\nv2")])
    assert list(standin.stats.bodies[0]["questions"]) == ["bank_intent v2"]
    assert scores.options == tuple(FOUR)


async def test_noul_and_score_questions(standin: SystemOneStandin, backend: SystemOneBackend) -> None:
    noul = DecisionRequest("lost", "Is the card lost?", (Option("no"), Option("yes")),
                           "I lost my card", kind="noul")
    score = DecisionRequest("urgency", "How urgent?", (Option("low"), Option("mid"), Option("high")),
                            "I lost my card", kind="score")
    noul_scores, score_scores = await backend.read([noul, score])
    types = sorted(q["type"] for b in standin.stats.bodies for q in b["questions"].values())
    assert types == ["noul", "score"]
    assert noul_scores.options == ("no", "yes") and len(score_scores.proba) == 3
    for s in (noul_scores, score_scores):
        assert math.isclose(sum(s.proba), 1.0, abs_tol=1e-9)


async def test_one_option_is_answered_without_a_call(
    standin: SystemOneStandin, backend: SystemOneBackend
) -> None:
    [scores] = await backend.read([intent_request(["card_arrival"])])
    assert scores.proba == (1.0,) and standin.stats.requests == 0


async def test_the_standin_enforces_the_26_option_cap(standin: SystemOneStandin) -> None:
    lying = make(standin.url, max_options=40)
    with pytest.raises(UnprocessableRequest, match="at most 26 alternatives"):
        await lying.read([intent_request(intent_names_30(standin))])
    assert standin.stats.requests == 1  # 422 is never retried
    await lying.aclose()


def intent_names_30(standin: SystemOneStandin) -> list[str]:
    return list(standin.reader.intents[:30])


@pytest.mark.parametrize(
    ("faults", "error", "calls"),
    [
        ([Reply(500, {"error": {"message": "boom", "type": "server_error"}})], None, 2),
        ([Reply(502, {"error": {"message": "upstream 500"}})] * 2, BackendUnavailable, 2),
        ([Reply(400, {"error": {"message": "invalid body: x"}})], BackendRejected, 1),
        ([Reply(422, {"detail": [{"loc": ["body", "state"], "msg": "Field required"}]})],
         UnprocessableRequest, 1),
        ([Reply(401, {"error": {"message": "missing or wrong bearer token"}})], BackendRejected, 1),
        ([Reply(504, "gateway timeout")], BackendTimeout, 1),
        ([Reply(501, "not implemented")], BackendUnavailable, 1),
    ],
)
async def test_retries_follow_the_status(
    standin: SystemOneStandin, backend: SystemOneBackend, faults: list[Reply],
    error: type[Exception] | None, calls: int,
) -> None:
    standin.faults.extend(faults)
    if error is None:
        [scores] = await backend.read([intent_request(FOUR)])
        assert scores.options == tuple(FOUR)
    else:
        with pytest.raises(error):
            await backend.read([intent_request(FOUR)])
    assert standin.stats.requests == calls


async def test_retry_after_is_honoured_on_429_503_529(
    standin: SystemOneStandin, backend: SystemOneBackend
) -> None:
    standin.faults.extend([
        Reply(429, {"error": {"message": "slow down"}}, {"retry-after": "0.2"}),
        Reply(503, {"detail": {"error_type": "api_error"}}, {"retry-after": "0.2"}),
        Reply(529, {"detail": {"error_type": "overloaded_error"}}, {"retry-after": "0.2"}),
    ])
    start = time.monotonic()
    [scores] = await backend.read([intent_request(FOUR)])
    assert time.monotonic() - start >= 0.6
    assert standin.stats.requests == 4 and scores.options == tuple(FOUR)


async def test_retry_after_past_the_budget_gives_up_at_once(standin: SystemOneStandin) -> None:
    b = make(standin.url, max_retry_wait_s=1.0)
    standin.faults.append(Reply(529, {"detail": "overloaded"}, {"retry-after": "30"}))
    start = time.monotonic()
    with pytest.raises(BackendUnavailable, match="Retry-After"):
        await b.read([intent_request(FOUR)])
    assert time.monotonic() - start < 1.0 and standin.stats.requests == 1
    await b.aclose()


@pytest.mark.parametrize(
    ("body", "text"),
    [
        ({"error": {"message": "question 'intent': at most 26 alternatives",
                    "type": "validation_error"}}, "at most 26 alternatives"),
        ({"detail": "Too many choices. Must have at most 128 choices."}, "Too many choices"),
        ({"detail": [{"type": "missing", "loc": ["body", "state"], "msg": "Field required"}]},
         "body.state: Field required"),
        ({"detail": {"error_type": "api_usage_error", "message": "Unknown model: x"}},
         "Unknown model: x"),
    ],
)
async def test_all_three_error_dialects_are_read(
    standin: SystemOneStandin, backend: SystemOneBackend, body: dict[str, object], text: str
) -> None:
    status = 422 if "loc" in str(body) else 400
    standin.faults.append(Reply(status, body))
    error = UnprocessableRequest if status == 422 else BackendRejected
    with pytest.raises(error, match=text.replace(".", r"\.")):
        await backend.read([intent_request(FOUR)])


async def test_server_down_is_unavailable_and_slow_is_timeout(standin: SystemOneStandin) -> None:
    down = make(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(BackendUnavailable):
        await down.read([intent_request(FOUR)])
    assert await down.ready() is False
    await down.aclose()
    standin.delay_s = 0.5
    slow = make(standin.url, timeout_s=0.1)
    with pytest.raises(BackendTimeout):
        await slow.read([intent_request(FOUR)])
    await slow.aclose()


@pytest.mark.parametrize(
    "reply",
    [
        Reply(200, "this is not json"),
        Reply(200, {"answers": {}}),
        Reply(200, {"answers": {"intent": {"type": "choice", "probabilities": {"card_arrival": 1.0}}}}),
        Reply(200, {"answers": {"intent": {"type": "choice", "probabilities": {
            "card_arrival": "high", "exchange_rate": 0, "pin_blocked": 0, "age_limit": 0}}}}),
    ],
)
async def test_unreadable_answers_are_malformed(
    standin: SystemOneStandin, backend: SystemOneBackend, reply: Reply
) -> None:
    standin.faults.append(reply)
    with pytest.raises(BackendMalformed):
        await backend.read([intent_request(FOUR)])


async def test_concurrency_cap_holds_at_the_server(standin: SystemOneStandin) -> None:
    standin.delay_s = 0.05
    b = make(standin.url, max_concurrency=3)
    requests = [intent_request(FOUR, state=f"my card number {i} has not arrived") for i in range(12)]
    results = await asyncio.gather(b.read(requests[:6]), b.read(requests[6:]))
    assert sum(len(r) for r in results) == 12
    assert standin.stats.max_in_flight == 3
    await b.aclose()


async def test_bearer_auth(banking77_dir: Path) -> None:
    with SystemOneStandin(reader=small_reader(banking77_dir), api_key="s3cret") as server:
        good = make(server.url, api_key="s3cret")
        bad = make(server.url, api_key="wrong")
        await good.read([intent_request(FOUR)])
        with pytest.raises(BackendRejected, match="bearer"):
            await bad.read([intent_request(FOUR)])
        assert server.stats.auth_headers == ["Bearer s3cret", "Bearer wrong"]
        assert await good.ready()
        # /health needs no key: readiness checks the key itself, once
        assert await bad.ready() is False and await bad.ready() is False
        assert server.stats.auth_headers[2:] == ["Bearer s3cret", "Bearer wrong"]
        await good.aclose()
        await bad.aclose()


async def test_grouped_read_covers_every_option_within_the_cap(
    standin: SystemOneStandin, backend: SystemOneBackend, banking77_dir: Path
) -> None:
    names = intent_names(banking77_dir)
    [scores] = await backend.read([intent_request(names)])
    bodies = standin.stats.bodies
    assert len(bodies) == 4  # 3 groups + the question over them, in parallel
    criteria = [list(b["questions"]["intent"]["criteria"]) for b in bodies]
    assert all(2 <= len(c) <= 26 for c in criteria)
    assert sorted(n for c in criteria if not c[0].startswith("group_") for n in c) == sorted(names)
    assert scores.options == tuple(names)
    assert math.isclose(sum(scores.proba), 1.0, abs_tol=1e-9) and min(scores.proba) > 0
    assert scores.top[0] == "card_arrival"


async def test_chained_read_reads_one_group(standin: SystemOneStandin, banking77_dir: Path) -> None:
    names = intent_names(banking77_dir)
    b = make(standin.url, grouping="chained")
    [scores] = await b.read([intent_request(names)])
    assert standin.stats.requests == 2
    nonzero = [p for p in scores.proba if p > 0]
    assert 2 <= len(nonzero) <= 26 and math.isclose(sum(scores.proba), 1.0, abs_tol=1e-9)
    await b.aclose()


def test_from_settings_and_options_checked() -> None:
    settings = FastBackendSettings(kind="systemone", url="http://127.0.0.1:1",
                                   options={"dialect": "openjev", "samples": 4})
    b = SystemOneBackend.from_settings(settings)
    assert (b.max_options, b.model, b.options.samples) == (128, "openjev-latest", 4)
    with pytest.raises(ValueError, match="canvas: not an option of this backend"):
        FastBackendSettings(kind="systemone", url="http://x", options={"canvas": 64})
    with pytest.raises(ValueError, match="samples"):
        FastBackendSettings(kind="systemone", url="http://x", options={"samples": 0})
    with pytest.raises(ConfigError, match="fast.url"):
        SystemOneBackend.from_settings(FastBackendSettings(kind="systemone"))


def test_the_app_factory_builds_it() -> None:
    from router.backends.factory import build_backend

    backend = build_backend(FastBackendSettings(kind="systemone", url="http://127.0.0.1:1",
                                                options={"grouping": "chained"}))
    assert isinstance(backend, SystemOneBackend) and backend.options.grouping == "chained"
