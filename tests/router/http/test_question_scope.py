"""A guarantee only for the question it was tuned on, through both wires: a yes/no policy tuned
on "is this message about a card?" and the README's 77-intent policy (the json_schema named
"intent") serve their own questions with ``guarantee: "accuracy"``, and each hostile question
that shares their options (an enum named ``is_french``, a System One noul "Is the customer
angry?", a property asking which intent the message does NOT express, a score question whose
levels are the intents) is unscoped: ``policy_id: "fallback"``, no guarantee."""

from __future__ import annotations

import csv
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from policies.file import PolicyFile
from policies.rules import ThresholdRule
from policies.scope import Question, scope_signature
from policies.types import DecisionRequest
from router.backends.mock import MockBackend
from router.http.app import create_app
from router.settings import Settings

CARD = Question.asked("about_card", instructions="Is this message about a card?")
INTENT = Question.asked("intent")  # the json_schema named "intent", no description
MESSAGE = "my card has not arrived yet"


def confident(request: DecisionRequest) -> list[float]:
    """A sure read of the first option, whatever is asked (what a card model says of anger)."""
    n = len(request.options)
    return [0.97] + [0.03 / (n - 1)] * (n - 1)


def write_policy(path: Path, question: Question, options: list[str], fingerprint: str) -> Path:
    PolicyFile(name=path.stem, signature=scope_signature(options, question),
               question=question.as_dict(), options=options, backend_fingerprint=fingerprint,
               calibrator={"kind": "none"}, rule=ThresholdRule(0.9).to_dict(),
               target_accuracy=0.95, delta=0.05, bound=0.95, coverage=0.8, n_tune=1000,
               n_calibration=0, data_hash="0" * 64).write(path)
    return path


@pytest.fixture(scope="module")
def intents(banking77_dir: Path) -> list[str]:
    with (banking77_dir / "train.csv").open(newline="", encoding="utf-8") as f:
        return sorted({row["category"] for row in csv.DictReader(f)})


@pytest.fixture
async def client(tmp_path: Path, intents: list[str]) -> AsyncIterator[httpx.AsyncClient]:
    backend = MockBackend(confident)
    files = [write_policy(tmp_path / "card.json", CARD, ["yes", "no"], backend.fingerprint),
             write_policy(tmp_path / "banking77.json", INTENT, intents, backend.fingerprint)]
    # Unscoped decisions are served unverified: no slow model is needed to see who decided.
    settings = Settings(policy={"files": files, "default": "banking77", "unscoped": "unverified"},
                        log={"decision_log_path": tmp_path / "log.jsonl"})
    app = create_app(settings, backend=backend)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            yield http


async def openai(client: httpx.AsyncClient, json_schema: dict[str, Any],
                 *, system: str | None = None) -> dict[str, Any]:
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": MESSAGE}]
    reply = await client.post("/v1/chat/completions", json={
        "model": "any", "messages": messages,
        "response_format": {"type": "json_schema", "json_schema": json_schema}})
    assert reply.status_code == 200, reply.text
    facts: dict[str, Any] = reply.json()["slotgate"]
    return facts


async def systemone(client: httpx.AsyncClient, question: dict[str, Any], *,
                    question_id: str = "q") -> dict[str, Any]:
    reply = await client.post("/v1/systemone", json={"state": MESSAGE, "questions": {
        question_id: question}})
    assert reply.status_code == 200, reply.text
    facts: dict[str, Any] = reply.json()["diagnostics"]["routes"][question_id]
    return facts


def guaranteed_by(facts: dict[str, Any], name: str) -> None:
    assert facts["route"] in ("fast", "cache") and facts["guarantee"] == "accuracy", facts
    assert facts["policy_id"].startswith(f"{name}@"), facts
    # The receipt states the promise behind this answer, on both wires alike.
    receipt = facts["receipt"]
    assert receipt["guarantee"] == "accuracy" and receipt["answered_by"] == "fast tier"
    assert (receipt["target_accuracy"], receipt["delta"]) == (0.95, 0.05)
    assert receipt["question"].startswith("scope-v2:") and receipt["watch"] == "clear"
    assert receipt["why"].startswith(f"accepted by policy {name}@")


def unscoped(facts: dict[str, Any]) -> None:
    assert facts["policy_id"] == "fallback" and facts["guarantee"] is None, facts
    assert facts["route"] != "fast" and facts["note"].startswith("unscoped"), facts
    receipt = facts["receipt"]
    assert receipt["guarantee"] is None and receipt["why"].startswith("unscoped: ")
    assert receipt["answered_by"] == "fast tier (unverified)"


async def test_each_policy_guarantees_its_own_question(client: httpx.AsyncClient,
                                                       intents: list[str]) -> None:
    guaranteed_by(await openai(client, {"name": "about_card", "description":
                                        "Is this message about a card?", "schema": {
                                            "type": "string", "enum": ["yes", "no"]}}), "card")
    # The README's first example: the 77 intents under the schema named "intent".
    guaranteed_by(await openai(client, {"name": "intent", "schema": {
        "type": "string", "enum": intents}}), "banking77")
    # The same question as an object property (an object named by the question, whose name
    # adds no word), and as a System One choice with no text.
    guaranteed_by(await openai(client, {"name": "intent", "schema": {
        "type": "object", "properties": {"intent": {"type": "string", "enum": intents}}}}),
        "banking77")
    guaranteed_by(await systemone(client, {"type": "choice", "criteria": dict.fromkeys(intents)},
                                  question_id="intent"), "banking77")
    unscoped(await systemone(client, {"type": "choice", "criteria": dict.fromkeys(intents)}))


async def test_a_yes_no_enum_named_is_french_is_not_the_card_question(
        client: httpx.AsyncClient) -> None:
    unscoped(await openai(client, {"name": "is_french", "schema": {
        "type": "string", "enum": ["yes", "no"]}}))
    # The card question's name with another description, or another system message, neither.
    unscoped(await openai(client, {"name": "about_card", "description": "Is this in French?",
                                   "schema": {"type": "string", "enum": ["yes", "no"]}}))
    unscoped(await openai(client, {"name": "about_card", "description":
                                   "Is this message about a card?", "schema": {
                                       "type": "string", "enum": ["yes", "no"]}},
                          system="Answer yes when the customer writes in French."))


async def test_a_system_one_noul_is_the_customer_angry_is_not_the_card_question(
        client: httpx.AsyncClient) -> None:
    """A noul always has the options yes/no: that surface cannot opt out by its options."""
    angry = {"type": "noul", "instructions": "Is the customer angry?"}
    unscoped(await systemone(client, angry))
    unscoped(await systemone(client, angry, question_id="about_card"))
    # Even the card question's own id and text, asked as a noul: the policy was tuned on a
    # choice between "yes" and "no", a noul is read and prompted otherwise.
    unscoped(await systemone(client, {"type": "noul", "instructions":
                                      "Is this message about a card?"}, question_id="about_card"))


async def test_which_intent_the_message_does_not_express_is_not_the_intent_question(
        client: httpx.AsyncClient, intents: list[str]) -> None:
    unscoped(await openai(client, {"name": "reply", "schema": {
        "type": "object", "properties": {"intent": {
            "type": "string", "enum": intents,
            "description": "Which intent does the message NOT express?"}}}}))
    unscoped(await openai(client, {"name": "not_intent", "schema": {
        "type": "string", "enum": intents}}))


async def test_a_score_whose_levels_are_the_intents_is_not_the_intent_question(
        client: httpx.AsyncClient, intents: list[str]) -> None:
    unscoped(await systemone(client, {"type": "score", "criteria": intents}))
    # The intent question's own id, asked as a score.
    unscoped(await systemone(client, {"type": "score", "criteria": intents},
                             question_id="intent"))
