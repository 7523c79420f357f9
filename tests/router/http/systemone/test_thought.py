"""``think`` through a System One fast tier (the stand-in over loopback HTTP): the server's
``diagnostics.thought`` reaches the client, and a thought budget is part of the question (its
signature, so its cache keys and the policy that covers it). The server flags that change what
a probability means are part of the tier's fingerprint."""

from __future__ import annotations

import pytest

from policies.types import DecisionRequest, Option
from router.backends.knobs import SystemOneKnobs
from router.backends.options import SystemOneOptions
from router.backends.systemone import SystemOneBackend
from standins.systemone_server import SystemOneStandin
from tests.router.http.systemone.test_spans import serving

BODY = {"state": "My card has not arrived yet.",
        "questions": {"urgent": {"type": "noul", "instructions": "Reply today?"}}}


@pytest.fixture
def upstream(systemone_standin: SystemOneStandin) -> SystemOneStandin:
    return systemone_standin


async def test_the_servers_thought_reaches_the_client_and_think_is_in_the_cache_key(
    upstream: SystemOneStandin,
) -> None:
    async with serving(SystemOneBackend(upstream.url), unscoped="unverified") as client:
        before = upstream.stats.requests
        plain = (await client.post("/v1/systemone", json=BODY)).json()
        thinking = (await client.post("/v1/systemone", json={**BODY, "think": 16})).json()
        again = (await client.post("/v1/systemone", json={**BODY, "think": 16})).json()
    assert plain["diagnostics"]["thought"] is None
    thought = thinking["diagnostics"]["thought"]
    assert thought["tokens"] == 15 and thought["closed"] is True  # 45 bytes, under 16 tokens
    assert thought["text"].startswith("The state reads: My card")
    assert upstream.stats.bodies[before + 1]["think"] == 16
    # Two reads for two budgets; the third answer is the second's read, from the cache.
    assert upstream.stats.requests == before + 2
    assert again["answers"]["urgent"]["noul"] == thinking["answers"]["urgent"]["noul"]
    assert again["diagnostics"]["thought"] is None  # a cached read keeps no thought


def test_a_thought_budget_is_part_of_the_questions_signature() -> None:
    def request(**engine: int) -> DecisionRequest:
        return DecisionRequest("q", "Reply today?", (Option("yes"), Option("no")), "state",
                               extension=SystemOneKnobs(engine=tuple(engine.items())))

    assert request().signature() == request(steps=2).signature()  # a read knob, not the question
    assert request(think=0).signature() == request().signature()
    assert request(think=16).signature() != request().signature()
    assert request(think=16).signature() != request(think=32).signature()


def test_constrained_and_engine_samples_change_the_tiers_fingerprint() -> None:
    def fingerprint(**options: bool) -> str:
        return SystemOneBackend("http://127.0.0.1:9", SystemOneOptions(**options)).fingerprint

    plain = fingerprint()
    assert fingerprint(constrained=False) == plain  # unset flags keep every fingerprint
    assert len({plain, fingerprint(constrained=True), fingerprint(engine_samples=True)}) == 3
