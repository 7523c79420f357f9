"""A System One body of several stages through slotgate and a systemone fast backend: it
goes upstream whole, so a caller gets the probabilities the server gives its own
clients (every stage's prompt lists every question, later stages continue earlier answers); the
policy routes it stage by stage; a later stage whose earlier answer an escalation changed is not
routed on the server's read of it. Real HTTP to the System One stand-in, its real BANKING77 model."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from policies.types import DecisionRequest
from router.backends.options import SystemOneOptions
from router.backends.systemone import SystemOneBackend
from router.http.app import create_app
from router.routing.ports import SlowAnswer
from router.settings import Settings
from standins.systemone_server import SystemOneStandin
from tests.router.backends.standins import STATE, small_reader
from tests.router.http.systemone.test_e2e import MemoryLog

INTENTS = {"card_arrival": "a card that has not come", "exchange_rate": None, "pin_blocked": None}
STAGED: dict[str, Any] = {
    "state": STATE,
    "seed": 7,
    "samples": 1,
    "questions": {
        "intent": {"type": "choice", "instructions": "Which banking intent?", "criteria": INTENTS},
        "urgent": {"type": "noul", "instructions": "Does this need a reply today?",
                   "criteria": {"true": "the card has still not arrived",
                                "false": "a question about a transfer"},
                   "depends_on": ["intent"]},
        "chase": {"type": "noul", "instructions": "Should we chase the courier?",
                  "criteria": {"true": "the new card is late", "false": "the card came"},
                  "ask_if": {"intent": ["card_arrival"]}},
    },
}


class ScriptedSlow:
    """The slow model: a scripted answer per question id (else the first option); records asks."""

    available = True

    def __init__(self, answers: dict[str, str] | None = None) -> None:
        self.answers = answers or {}
        self.asked: list[str] = []

    async def ask(self, request: DecisionRequest) -> SlowAnswer:
        self.asked.append(request.question_id)
        answer = self.answers.get(request.question_id, request.option_names[0])
        return SlowAnswer(answer, "scripted", 1.0, 1)
    audit = ask  # one budget: audits and escalations alike

    async def aclose(self) -> None:
        return None


@pytest.fixture
def standin(banking77_dir: Path) -> Iterator[SystemOneStandin]:
    with SystemOneStandin(reader=small_reader(banking77_dir)) as server:
        yield server


async def slotgate(standin: SystemOneStandin, slow: ScriptedSlow, *, threshold: float = 0.0,
                   options: SystemOneOptions | None = None, shadow: bool = False,
                   log: MemoryLog | None = None,
                   redis_url: str | None = None) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings.model_validate(
        {"policy": {"fallback_threshold": threshold, "shadow": shadow},
         "cache": {"redis_url": redis_url}})
    # No start-up warm-up read: these tests count the requests the server gets.
    app = create_app(settings, backend=SystemOneBackend(standin.url, options), slow=slow,
                     decision_log=log or MemoryLog(), close_backend=True, warm_up=False)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://slotgate"
    ) as client:
        yield client


async def ask(client: httpx.AsyncClient, payload: dict[str, Any]) -> dict[str, Any]:
    response = await client.post("/v1/systemone", json=payload)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def direct(standin: SystemOneStandin, payload: dict[str, Any]) -> dict[str, Any]:
    """What a client calling the server itself gets."""
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{standin.url}/v1/systemone", json=payload)
    assert response.status_code == 200, response.text
    answers: dict[str, Any] = response.json()["answers"]
    return answers


def numbers(answer: dict[str, Any]) -> list[float]:
    return [answer["noul"]] if answer["type"] == "noul" else list(answer["probabilities"].values())


async def test_a_staged_body_gets_the_servers_own_answers(standin: SystemOneStandin) -> None:
    """Accepted fast answers of a depends_on/ask_if body equal a direct call's, from one upstream
    request; reading stage by stage gives other probabilities; the same body again is cached."""
    expected = await direct(standin, STAGED)
    served = standin.stats.requests
    async for client in slotgate(standin, ScriptedSlow()):
        body = await ask(client, STAGED)
        assert standin.stats.requests == served + 1  # the whole body, once
        upstream = standin.stats.bodies[-1]["questions"]
        assert upstream["urgent"]["depends_on"] == ["intent"]
        assert upstream["chase"]["ask_if"] == {"intent": ["card_arrival"]}
        assert expected["intent"]["choice"] == "card_arrival"  # so chase is asked, in stage 2
        assert body["diagnostics"]["stages"] == [["intent"], ["urgent", "chase"]]
        assert body["diagnostics"]["conditioning"] == "prefill"
        for qid in ("intent", "urgent", "chase"):
            assert body["answers"][qid]["route"] == "fast"
            assert numbers(body["answers"][qid]) == pytest.approx(numbers(expected[qid]), abs=1e-12)
        again = await ask(client, STAGED)
        assert standin.stats.requests == served + 1
        assert {a["route"] for a in again["answers"].values()} == {"cache"}
        assert numbers(again["answers"]["urgent"]) == pytest.approx(numbers(expected["urgent"]))
    async for client in slotgate(standin, ScriptedSlow(), options=SystemOneOptions(stages="router")):
        by_stage = await ask(client, STAGED)
        assert standin.stats.requests == served + 3  # one body per stage
        assert all("depends_on" not in q and "ask_if" not in q
                   for b in standin.stats.bodies[-2:] for q in b["questions"].values())
        assert numbers(by_stage["answers"]["urgent"]) != pytest.approx(numbers(expected["urgent"]))
        assert by_stage["diagnostics"]["conditioning"] is None


async def test_a_changed_earlier_answer_escalates_what_continued_it(
    standin: SystemOneStandin,
) -> None:
    """Every answer escalates (threshold 1). The slow model moves intent away from the server's
    card_arrival: chase is now skipped, and urgent, whose server read continued card_arrival,
    goes to the slow model without being routed on that read; the note says why."""
    slow, log = ScriptedSlow({"intent": "exchange_rate"}), MemoryLog()
    async for client in slotgate(standin, slow, threshold=1.0, log=log):
        body = await ask(client, STAGED)
    answers, diagnostics = body["answers"], body["diagnostics"]
    [logged] = [r for r in log.records if r.get("question_id") == "urgent"]
    assert logged["proba"] is None  # not routed on: no row to tune from
    assert answers["intent"]["answer"] == "exchange_rate" and answers["chase"] is None
    assert diagnostics["skipped"]["chase"] == {
        "because": "intent", "was": "exchange_rate", "wanted": ["card_arrival"],
        "note": "ask_if was evaluated on an escalated answer: intent = 'exchange_rate' is the "
                "slow model's answer"}
    assert slow.asked == ["intent", "urgent"]
    urgent = diagnostics["routes"]["urgent"]
    assert urgent["route"] == "slow" and urgent["raw_probability"] is None
    # No tuned policy covers it: unscoped, and the stale read is why the fixed bar judged nothing.
    assert urgent["note"].startswith("unscoped: ") and (
        "no fast read fits: the server's read continued intent = 'card_arrival', but the "
        "answer given is 'exchange_rate'") in urgent["note"]
    assert standin.stats.requests == 1


async def test_shadow_mode_still_judges_and_logs_a_stale_read(standin: SystemOneStandin) -> None:
    """Shadow mode serves the slow answer anyway, so the later stage's server read is judged
    and logged (a row to tune from), not dropped as in live routing."""
    log = MemoryLog()
    async for client in slotgate(standin, ScriptedSlow({"intent": "exchange_rate"}),
                                 shadow=True, log=log):
        body = await ask(client, STAGED)
    urgent = body["diagnostics"]["routes"]["urgent"]
    assert urgent["shadow"] and urgent["route"] == "slow"
    assert urgent["raw_probability"] is not None and urgent["note"].startswith("unscoped: ")
    assert "logged to tune on" in urgent["note"]
    [record] = [r for r in log.records if r.get("question_id") == "urgent"]
    assert record["proba"] is not None


async def test_an_agreeing_escalation_keeps_the_later_reads(standin: SystemOneStandin) -> None:
    """The slow model confirms card_arrival: the later stage's reads continued the answer given,
    so they are routed on (below threshold 1 they escalate for their own reason)."""
    slow = ScriptedSlow({"intent": "card_arrival"})
    async for client in slotgate(standin, slow, threshold=1.0):
        body = await ask(client, STAGED)
    routes = body["diagnostics"]["routes"]
    assert slow.asked == ["intent", "urgent", "chase"]
    for qid in ("urgent", "chase"):
        assert routes[qid]["raw_probability"] is not None
        assert "no fast read fits" not in (routes[qid]["note"] or "")


async def test_bodies_the_server_cannot_stage_are_staged_by_the_router(
    standin: SystemOneStandin,
) -> None:
    """A question past the server's 26 options is read grouped, in requests of its own, so the
    router runs the stages; so it does for dialects whose servers ignore dependencies."""
    wide = json.loads(json.dumps(STAGED))
    wide["questions"]["intent"]["criteria"] = {f"intent_{i}": None for i in range(30)}
    wide["questions"]["chase"]["ask_if"] = {"intent": ["intent_0"]}
    async for client in slotgate(standin, ScriptedSlow()):
        await ask(client, wide)
    assert standin.stats.requests > 1
    assert all("depends_on" not in q and "ask_if" not in q
               for b in standin.stats.bodies for q in b["questions"].values())
    assert not SystemOneOptions(dialect="openjev").server_runs_stages
    with pytest.raises(ValueError, match='stages: .*"server" needs the example dialect'):
        Settings.model_validate({"fast": {"kind": "systemone", "url": "http://x",
                                          "options": {"dialect": "jev", "stages": "server"}}})


async def test_the_chat_variant_is_staged_upstream_too(standin: SystemOneStandin) -> None:
    """The example server's chat variant (schema as the system message) takes the same path."""
    schema = {"questions": [
        {"id": "intent", "type": "choice", "instructions": "Which banking intent?",
         "options": [{"name": n, "description": d} for n, d in INTENTS.items()]},
        {"id": "urgent", "type": "noul", "instructions": "Does this need a reply today?",
         "depends_on": ["intent"]}], "samples": 1, "seed": 7}
    async for client in slotgate(standin, ScriptedSlow()):
        response = await client.post("/v1/chat/completions", json={
            "model": "dgemma", "messages": [
                {"role": "system", "content": json.dumps(schema)},
                {"role": "user", "content": json.dumps(STATE)}]})
    assert response.status_code == 200, response.text
    assert standin.stats.requests == 1
    assert standin.stats.bodies[0]["questions"]["urgent"]["depends_on"] == ["intent"]


async def test_the_servers_read_knobs_and_alone_are_forwarded(standin: SystemOneStandin) -> None:
    """auto_max, auto_threshold and sequential go upstream; a question marked alone is read on
    its own, as the server reads it, so the answers equal a direct call's."""
    payload: dict[str, Any] = {
        "state": STATE, "seed": 3, "samples": 1, "auto_max": 6, "auto_threshold": 0.3,
        "sequential": False,
        "questions": {
            "intent": {"type": "choice", "criteria": INTENTS},
            "urgent": {"type": "noul", "alone": True,
                       "criteria": {"true": "the card has still not arrived",
                                    "false": "a question about a transfer"}},
            "chase": {"type": "noul",
                      "criteria": {"true": "the new card is late", "false": "the card came"}},
        },
    }
    expected = await direct(standin, payload)
    async for client in slotgate(standin, ScriptedSlow()):
        body = await ask(client, payload)
    bodies = standin.stats.bodies[1:]
    assert sorted(list(b["questions"]) for b in bodies) == [["intent", "chase"], ["urgent"]]
    assert all((b["auto_max"], b["auto_threshold"], b["sequential"]) == (6, 0.3, False)
               for b in bodies)
    assert [b["questions"]["urgent"].get("alone") for b in bodies if "urgent" in b["questions"]] \
        == [True]
    for qid in ("intent", "urgent", "chase"):
        assert numbers(body["answers"][qid]) == pytest.approx(numbers(expected[qid]), abs=1e-12)


async def test_a_staged_body_the_server_refuses_is_the_callers_422(
    standin: SystemOneStandin,
) -> None:
    """A dependent question whose id overflows the canvas: the server's 422 and its reason, no
    slow call, nothing cached (the same body again goes upstream again)."""
    payload = json.loads(json.dumps(STAGED))
    payload["questions"]["u" * 300] = payload["questions"].pop("urgent")
    slow = ScriptedSlow()
    async for client in slotgate(standin, slow):
        for _ in range(2):
            response = await client.post("/v1/systemone", json=payload)
            assert response.status_code == 422, response.text
            assert "answer template is" in response.json()["error"]["message"]
    assert slow.asked == [] and standin.stats.requests == 2


async def test_a_question_the_server_skipped_is_cached_as_skipped_in_redis(
    standin: SystemOneStandin, redis_url: str
) -> None:
    """Through Redis (two app instances, as two replicas): the server skips chase (intent is not
    what it asks for); the same body again, on the other replica, makes no upstream call."""
    payload = json.loads(json.dumps(STAGED))
    payload["questions"]["chase"]["ask_if"] = {"intent": ["pin_blocked"]}
    bodies = []
    for _ in range(2):
        async for client in slotgate(standin, ScriptedSlow(), redis_url=redis_url):
            bodies.append(await ask(client, payload))
    assert standin.stats.requests == 1
    first, second = bodies
    assert first["answers"]["chase"] is None and second["answers"]["chase"] is None
    assert second["diagnostics"]["skipped"]["chase"]["because"] == "intent"
    assert {a["route"] for a in second["answers"].values() if a} == {"cache"}
