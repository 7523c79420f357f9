"""The systemone backend gives what the example server gives its own clients: the read key
holds everything sent upstream, a 422 is the caller's, scores past 26 levels are read, a
stage's questions are read jointly as one body."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from policies.types import DecisionRequest, Option
from router.backends.knobs import SystemOneKnobs
from router.backends.options import SystemOneOptions
from router.backends.systemone import SystemOneBackend
from router.errors import UnprocessableRequest
from router.routing.registry import PolicyRegistry
from router.routing.service import RoutingService
from router.settings import Settings
from router.store.cache import MemoryCache
from router.store.metrics import Metrics
from standins.systemone_server import SystemOneStandin
from tests.router.backends.standins import STATE, intent_request, small_reader
from tests.router.routing.test_service import ListLog, RecordingSlow

FOUR = ["card_arrival", "exchange_rate", "pin_blocked", "age_limit"]


@pytest.fixture
def standin(banking77_dir: Path) -> Iterator[SystemOneStandin]:
    with SystemOneStandin(reader=small_reader(banking77_dir)) as server:
        yield server


def service_over(backend: SystemOneBackend, slow: RecordingSlow) -> tuple[RoutingService, MemoryCache]:
    cache = MemoryCache(max_entries=100, ttl_s=60)
    service = RoutingService(
        backend=backend, cache=cache, registry=PolicyRegistry(), slow=slow,  # type: ignore[arg-type]
        log=ListLog(), metrics=Metrics(), settings=Settings())  # type: ignore[arg-type]
    return service, cache


def noul(qid: str, state: str = STATE) -> DecisionRequest:
    return DecisionRequest(qid, "Does this need a reply now?", (Option("yes"), Option("no")),
                           state, kind="noul")


async def test_the_question_id_is_in_the_read_key(standin: SystemOneStandin) -> None:
    """The id is prompt text upstream: the same question under another id is another read."""
    backend = SystemOneBackend(standin.url)
    service, _ = service_over(backend, RecordingSlow())
    await service.route([noul("urgent")], namespace="t")
    await service.route([noul("needs_reply_now")], namespace="t")
    assert [list(b["questions"]) for b in standin.stats.bodies] == [["urgent"], ["needs_reply_now"]]
    await service.route([noul("urgent")], namespace="t")  # the same id again: from the cache
    assert standin.stats.requests == 2
    first, other = intent_request(FOUR), intent_request(FOUR[:3])
    beside = backend.read_inputs(first, [first, noul("urgent")])
    assert beside != backend.read_inputs(first, [first])  # co-questions of a joint read count
    assert backend.read_inputs(first, [first]) == backend.read_inputs(
        dataclasses.replace(first), [dataclasses.replace(first)])  # and nothing else
    assert backend.read_inputs(other, [other]) != backend.read_inputs(first, [first])
    await backend.aclose()


async def test_an_upstream_422_is_the_callers_error(standin: SystemOneStandin) -> None:
    """A 300-character id makes the server's answer template overflow the canvas: 422 with the
    server's reason, nothing cached, no slow model called."""
    backend = SystemOneBackend(standin.url)
    slow = RecordingSlow()
    service, cache = service_over(backend, slow)
    with pytest.raises(UnprocessableRequest, match="answer template is .* tokens; the canvas holds 63") as info:
        await service.route([noul("x" * 300)], namespace="t")
    assert info.value.status_code == 422
    assert slow.calls == [] and len(cache) == 0
    await backend.aclose()


async def test_scores_past_26_levels_are_read_grouped(standin: SystemOneStandin) -> None:
    levels = tuple(Option(str(i)) for i in range(30))
    request = DecisionRequest("stars", "How many stars?", levels, STATE, kind="score")
    backend = SystemOneBackend(standin.url)
    [scores] = await backend.read([request])
    assert scores.options == tuple(str(i) for i in range(30))
    assert math.isclose(sum(scores.proba), 1.0, abs_tol=1e-9)
    assert all(len(q["criteria"]) <= 26 for b in standin.stats.bodies
               for q in b["questions"].values())
    await backend.aclose()


async def test_a_stage_is_read_jointly_as_the_server_reads_it(standin: SystemOneStandin) -> None:
    """Two questions about one state go up as one body, and come back with the probabilities
    the server gives that body directly; one question per request gives other ones."""
    questions = [intent_request(FOUR, question_id="intent"), noul("urgent")]
    joint = SystemOneBackend(standin.url)
    together = await joint.read(questions)
    assert standin.stats.requests == 1
    body = standin.stats.bodies[0]
    assert list(body["questions"]) == ["intent", "urgent"]
    async with httpx.AsyncClient() as client:
        direct = (await client.post(f"{standin.url}/v1/systemone", json=body)).json()["answers"]
    assert together[1].proba[0] == pytest.approx(direct["urgent"]["noul"])
    assert together[0].as_dict() == pytest.approx(direct["intent"]["probabilities"])
    split = SystemOneBackend(standin.url, SystemOneOptions(joint=False))
    apart = await split.read(questions)
    assert standin.stats.requests == 4
    assert apart[1].proba[0] != pytest.approx(together[1].proba[0])
    for b in (joint, split):
        await b.aclose()


async def test_auto_samples_and_engine_knobs_are_forwarded(standin: SystemOneStandin) -> None:
    backend = SystemOneBackend(standin.url, SystemOneOptions(think=16, chunk_prompt="shared"))
    await backend.read([intent_request(FOUR, extension=SystemOneKnobs(samples_auto=True))])
    body: dict[str, Any] = standin.stats.bodies[0]
    assert (body["samples"], body["think"], body["chunk_prompt"]) == ("auto", 16, "shared")
    await backend.aclose()
