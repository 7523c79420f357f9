"""One question identity through the OpenAI SDK, over real HTTP: a policy tuned on the intent
question keeps it however its whitespace, line endings, system-message split or option order
change, and loses it to any word added on the path to the answer (a description or title, the
object's name, an earlier user turn). Such a request, one field away from the policy, is a near
miss: counted in /metrics by policy and field, and logged once."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from pydantic import BaseModel

from policies.file import PolicyFile
from policies.rules import ThresholdRule
from policies.scope import Question, scope_signature
from policies.types import DecisionRequest
from router.backends.mock import MockBackend
from router.settings import Settings
from tests.live import LiveServer

INTENTS = ["card_arrival", "exchange_rate", "lost_or_stolen_card", "pin_blocked",
           "top_up_failed"]
NOT = "Which intent does the message NOT express?"
CONTEXT = "You sort banking messages.\nAnswer with the intent."
MESSAGE = "my card has not arrived yet"


def sure(request: DecisionRequest) -> list[float]:
    n = len(request.options)
    return [0.97] + [0.03 / (n - 1)] * (n - 1)


def write_policy(path: Path, question: Question) -> Path:
    PolicyFile(name=path.stem, signature=scope_signature(INTENTS, question),
               question=question.as_dict(), options=INTENTS, backend_fingerprint=BACKEND.fingerprint,
               calibrator={"kind": "none"}, rule=ThresholdRule(0.9).to_dict(),
               target_accuracy=0.95, delta=0.05, bound=0.95, coverage=0.8, n_tune=1000,
               n_calibration=0, data_hash="0" * 64).write(path)
    return path


BACKEND = MockBackend(sure)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, Any]]:
    folder = tmp_path_factory.mktemp("identity")
    files = [write_policy(folder / "intent.json", Question.asked("intent")),
             write_policy(folder / "intent_ctx.json", Question.asked("intent", context=CONTEXT))]
    settings = Settings(policy={"files": files, "unscoped": "unverified"},
                        log={"decision_log_path": folder / "log.jsonl"})
    with LiveServer(settings, backend=BACKEND) as running:
        client = openai.OpenAI(base_url=f"{running.url}/v1", api_key="x", max_retries=0,
                               timeout=20)
        yield running, client
        client.close()


def ask(client: Any, json_schema: dict[str, Any], *, system: tuple[str, ...] = (),
        before: tuple[str, ...] = ()) -> dict[str, Any]:
    messages = ([{"role": "system", "content": text} for text in system]
                + [{"role": "user", "content": text} for text in (*before, MESSAGE)])
    completion = client.chat.completions.create(
        model="any", messages=messages,
        response_format={"type": "json_schema", "json_schema": json_schema})
    facts: dict[str, Any] = completion.model_extra["slotgate"]
    return facts


def enum(options: list[str] = INTENTS, name: str = "intent", **schema: Any) -> dict[str, Any]:
    return {"name": name, "schema": {"type": "string", "enum": options, **schema}}


def covered_by(facts: dict[str, Any], name: str) -> bool:
    return bool(facts["policy_id"].startswith(f"{name}@") and facts["guarantee"] == "accuracy")


def unscoped(facts: dict[str, Any]) -> bool:
    return bool(facts["policy_id"] == "fallback" and facts["guarantee"] is None)


@pytest.mark.parametrize("system", [
    (CONTEXT,), (CONTEXT + "\n",), (CONTEXT.replace("\n", "\r\n"),), (CONTEXT.replace("\n", "\r"),),
    (CONTEXT.replace(" ", "  "),), (f"  {CONTEXT}  ",), tuple(CONTEXT.split("\n")),
], ids=["as-tuned", "trailing-newline", "crlf", "cr", "doubled-space", "padded", "two-messages"])
def test_the_context_policy_keeps_its_question_across_layout(
        server: tuple[LiveServer, Any], system: tuple[str, ...]) -> None:
    _, client = server
    assert covered_by(ask(client, enum(), system=system), "intent_ctx")


def test_any_option_order_is_the_same_question(server: tuple[LiveServer, Any]) -> None:
    _, client = server
    for options in (INTENTS[::-1], INTENTS[2:] + INTENTS[:2]):
        assert covered_by(ask(client, enum(options)), "intent")
        assert covered_by(ask(client, enum(options), system=(CONTEXT,)), "intent_ctx")


@pytest.mark.parametrize("json_schema", [
    # Around the property, in the object schema's description.
    {"name": "intent", "schema": {"type": "object", "description": NOT, "properties": {
        "intent": {"type": "string", "enum": INTENTS}}}},
    # In the object schema's title.
    {"name": "intent", "schema": {"type": "object", "title": NOT, "properties": {
        "intent": {"type": "string", "enum": INTENTS}}}},
    # In json_schema.description, while schema.description repeats the name.
    {"name": "intent", "description": NOT, "schema": {
        "type": "string", "enum": INTENTS, "description": "intent"}},
    # In the property's title.
    {"name": "intent", "schema": {"type": "object", "properties": {
        "intent": {"type": "string", "enum": INTENTS, "title": NOT}}}},
    # In the name of the object that holds the property.
    {"name": "intent_not_expressed", "schema": {"type": "object", "properties": {
        "intent": {"type": "string", "enum": INTENTS}}}},
], ids=["object-description", "object-title", "json-schema-description", "property-title",
        "object-name"])
def test_a_word_anywhere_on_the_path_is_another_question(
        server: tuple[LiveServer, Any], json_schema: dict[str, Any]) -> None:
    _, client = server
    assert unscoped(ask(client, json_schema))


def test_an_earlier_user_turn_is_part_of_the_question(server: tuple[LiveServer, Any]) -> None:
    _, client = server
    assert covered_by(ask(client, enum()), "intent")
    assert unscoped(ask(client, enum(), before=(NOT,)))
    assert unscoped(ask(client, enum(), system=(CONTEXT,), before=(NOT,)))


def test_the_object_that_only_names_the_question_is_the_same_question(
        server: tuple[LiveServer, Any]) -> None:
    _, client = server
    named = {"name": "intent", "schema": {"type": "object", "title": "Intent", "properties": {
        "intent": {"type": "string", "enum": INTENTS, "title": "Intent"}}}}
    assert covered_by(ask(client, named), "intent")


def test_sdk_parse_of_a_pydantic_model_asks_its_class_name(
        server: tuple[LiveServer, Any]) -> None:
    """``parse(response_format=Model)`` names the schema after the class: a word of the
    question (here "Intent", which only spells the property, so covered)."""
    _, client = server

    class Intent(BaseModel):
        intent: str

    schema = Intent.model_json_schema()
    schema["properties"]["intent"]["enum"] = INTENTS
    json_schema = {"name": "Intent", "schema": schema}
    assert covered_by(ask(client, json_schema), "intent")
    json_schema["name"] = "Reply"
    assert unscoped(ask(client, json_schema))


def near_misses(running: LiveServer) -> dict[tuple[str, str], float]:
    import httpx

    text = httpx.get(f"{running.url}/metrics", timeout=10).text
    counted = {}
    for labels, value in re.findall(r"slotgate_question_near_miss_total\{([^}]*)\} (\S+)", text):
        label = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        counted[(label["policy"], label["field"])] = float(value)
    return counted


def test_a_request_one_field_from_a_policy_is_a_counted_near_miss_logged_once(
        server: tuple[LiveServer, Any], caplog: pytest.LogCaptureFixture) -> None:
    """Four of the intent policy's five options (nothing else differs, and no other test of
    this module asks it): counted each time, logged the first time only, naming the option."""
    running, client = server
    before = near_misses(running)
    with caplog.at_level(logging.WARNING, logger="slotgate"):
        for _ in range(3):
            assert unscoped(ask(client, enum(INTENTS[:4])))
    after = near_misses(running)
    [(policy, field)] = [key for key in after if after[key] != before.get(key, 0.0)]
    assert policy.startswith("intent@") and field == "options"
    assert after[(policy, field)] - before.get((policy, field), 0.0) == 3
    logged = [r.getMessage() for r in caplog.records if "differs from policy" in r.getMessage()]
    assert len(logged) == 1 and "top_up_failed" in logged[0] and policy in logged[0], logged
    # A word added to the question's text: a near miss in its instructions.
    assert unscoped(ask(client, {"name": "intent", "description": NOT, "schema": {
        "type": "string", "enum": INTENTS}}))
    assert near_misses(running).get((policy, "instructions"), 0.0) >= 1
    # Far from every policy (another id and other options): no near miss.
    counted = near_misses(running)
    ask(client, enum(["yes", "no"], name="is_french"))
    assert near_misses(running) == counted


def test_the_example_servers_chat_variant_counts_near_misses_too(
        server: tuple[LiveServer, Any]) -> None:
    """The same question asked through the example server's chat call (a system message
    holding the questions): one option short of the intent policy is a near miss in options."""
    import json

    running, client = server
    questions = {"questions": [{"id": "intent", "type": "choice", "options": INTENTS[1:]}]}
    before = near_misses(running)
    client.chat.completions.create(model="any", messages=[
        {"role": "system", "content": json.dumps(questions)},
        {"role": "user", "content": json.dumps({"message": MESSAGE})}])
    after = near_misses(running)
    [(policy, field)] = [key for key in after if after[key] != before.get(key, 0.0)]
    assert policy.startswith("intent@") and field == "options"
