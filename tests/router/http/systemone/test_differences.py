"""Differences from the vLLM example server, each checked against the server's code
(mmastrac/djev structured_server.py at 28b1e26): matched, or marked deliberate in
docs/proxy.md's differences table. Every row here is tested twice: slotgate's
behaviour over HTTP, and the table's word for it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import pytest

from policies.types import DecisionRequest
from router.backends.mock import MockBackend
from router.backends.options import SystemOneOptions
from router.backends.systemone import SystemOneBackend
from router.http.app import create_app
from router.settings import Settings
from standins.systemone_server import SystemOneStandin
from tests.conftest import ROOT
from tests.router.http.systemone.test_e2e import MemoryLog, RecordingSlow, confident
from tests.router.http.systemone.test_spans import INVOICE, SPANS, serving
from tests.router.http.systemone.test_spans import upstream as upstream  # noqa: PLC0414 - a fixture

SCHEMA = {"questions": [{"id": "urgent", "type": "noul",
                         "instructions": "Does the customer need a reply within the hour?"}]}
STATE = '{"ticket": "Everything is down and we have a demo at noon."}'


@pytest.fixture
def asked() -> list[DecisionRequest]:
    """Every request the fast backend read, in order."""
    return []


@pytest.fixture
async def client(asked: list[DecisionRequest]) -> AsyncIterator[httpx.AsyncClient]:
    def handler(request: DecisionRequest) -> Sequence[float]:
        asked.append(request)
        return confident(request)

    settings = Settings.model_validate({"policy": {"fallback_threshold": 0.9}})
    app = create_app(settings, backend=MockBackend(handler), slow=RecordingSlow(),
                     decision_log=MemoryLog())
    async with app.router.lifespan_context(app), httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://test"
    ) as c:
        yield c


def difference(what: str) -> dict[str, str]:
    """The docs/proxy.md differences-table row whose first cell starts with ``what``."""
    text = (ROOT / "docs/proxy.md").read_text()
    table = text.split("## Differences from the vLLM example server", 1)[1]
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith(what):
            return dict(zip(("what", "server", "slotgate", "deliberate"), cells))
    raise AssertionError(f"docs/proxy.md has no differences row for {what}")


async def test_the_servers_readme_chat_call_needs_no_model(client: httpx.AsyncClient) -> None:
    """Its README's curl names no model: the server answers 200 with ``dgemma-structured``."""
    r = await client.post("/v1/chat/completions", json={"messages": [
        {"role": "system", "content": json.dumps(SCHEMA)}, {"role": "user", "content": STATE}]})
    assert r.status_code == 200, r.text
    reply = r.json()
    assert reply["model"] == "dgemma-structured"
    content = json.loads(reply["choices"][0]["message"]["content"])
    assert content["answers"]["urgent"]["label"] == "yes"
    assert "`model` optional" in difference("the chat variant")["slotgate"]


async def test_an_ordinary_chat_still_needs_a_model(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/chat/completions",
                          json={"messages": [{"role": "user", "content": "hello"}]})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "model"
    assert r.json()["error"]["message"] == "model: Field required"


async def test_chat_variant_answers_carry_a_null_draw_spread_and_the_docs_say_why(
    client: httpx.AsyncClient,
) -> None:
    schema = {**SCHEMA, "samples": 3}
    r = await client.post("/v1/chat/completions", json={"messages": [
        {"role": "system", "content": json.dumps(schema)}, {"role": "user", "content": STATE}]})
    urgent = json.loads(r.json()["choices"][0]["message"]["content"])["answers"]["urgent"]
    assert urgent["stderr"] is None and urgent["agreement"] is None
    row = difference("`stderr`, `agreement`")
    assert row["slotgate"] == "always present, `null`" and row["deliberate"].startswith("yes: ")


async def test_samples_true_is_one_read_as_on_the_server(
    client: httpx.AsyncClient, asked: list[DecisionRequest],
) -> None:
    r = await client.post("/v1/systemone", json={"state": "s", "samples": True,
                                                 "questions": {"q": {"type": "noul"}}})
    assert r.status_code == 200, r.text
    assert asked[0].samples == 1
    assert r.json()["diagnostics"]["samples"] == {"n": 1, "policy": {"mode": "fixed", "n": 1}}
    refused = await client.post("/v1/systemone", json={"state": "s", "samples": False,
                                                       "questions": {"q": {"type": "noul"}}})
    assert refused.status_code == 422  # false is 0 to the server: not a positive count
    assert difference("`samples: true`")["deliberate"].startswith("matches")


@pytest.mark.parametrize(("seed", "expected"), [(7.9, 7), ("7", 7), (" -3 ", -3), (12, 12)])
async def test_seed_is_int_of_it_as_on_the_server(
    client: httpx.AsyncClient, asked: list[DecisionRequest], seed: Any, expected: int,
) -> None:
    r = await client.post("/v1/systemone", json={"state": "s", "seed": seed,
                                                 "questions": {"q": {"type": "noul"}}})
    assert r.status_code == 200, r.text
    assert asked[0].seed == expected


@pytest.mark.parametrize("seed", [True, None, "7.5", "seven", [7]])
async def test_seeds_int_refuses_or_nobody_means_are_422(
    client: httpx.AsyncClient, asked: list[DecisionRequest], seed: Any,
) -> None:
    r = await client.post("/v1/systemone", json={"state": "s", "seed": seed,
                                                 "questions": {"q": {"type": "noul"}}})
    assert r.status_code == 422 and r.json()["error"]["message"].startswith("seed: ")
    assert asked == []
    assert "a boolean seed is a 422" in difference("`seed`")["deliberate"]


@pytest.mark.parametrize("empty", [[], {}, None])
async def test_an_empty_ask_if_or_depends_on_is_no_condition(
    client: httpx.AsyncClient, empty: Any,
) -> None:
    r = await client.post("/v1/systemone", json={"state": "s", "questions": {
        "a": {"type": "noul"}, "b": {"type": "noul", "ask_if": empty, "depends_on": empty}}})
    assert r.status_code == 200, r.text
    assert r.json()["diagnostics"]["stages"] == [["a", "b"]]
    assert difference("empty `depends_on` / `ask_if`")["deliberate"] == "matches"


async def test_an_ask_subset_is_answered_where_the_servers_own_route_fails(
    client: httpx.AsyncClient, asked: list[DecisionRequest],
) -> None:
    """The server's /v1/systemone builds answers for every question, asked or not, and raises an
    uncaught KeyError on the first one not asked: the table must not say "matches"."""
    r = await client.post("/v1/systemone", json={"state": "s", "ask": ["b"], "questions": {
        "a": {"type": "noul"}, "b": {"type": "noul"}}})
    assert r.status_code == 200, r.text
    assert list(r.json()["answers"]) == ["b"] and [q.question_id for q in asked] == ["b"]
    row = difference("`ask`")
    assert row["deliberate"] != "matches" and "KeyError" in row["server"]


async def test_a_skip_on_an_escalated_answer_carries_a_note(client: httpx.AsyncClient) -> None:
    """'unsure' is read at 0.5 and escalated; the slow model answers the last option, 'no'."""
    r = await client.post("/v1/systemone", json={"state": "s", "questions": {
        "money": {"type": "noul", "instructions": "unsure"},
        "kind": {"type": "noul", "ask_if": {"money": ["yes"]}},
        "after": {"type": "noul", "ask_if": {"kind": ["yes"]}}}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["answers"]["money"]["route"] == "slow"
    skipped = body["diagnostics"]["skipped"]
    assert skipped["kind"] == {
        "because": "money", "was": "no", "wanted": ["yes"],
        "note": "ask_if was evaluated on an escalated answer: money = 'no' is the slow model's "
                "answer"}
    assert "note" not in skipped["after"]  # a cascade: its dependency was skipped, not escalated
    assert difference("a question skipped because")["deliberate"].startswith("yes: ")


async def test_a_skip_on_a_fast_answer_has_no_note(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/systemone", json={"state": "s", "questions": {
        "money": {"type": "noul", "instructions": "say no"},
        "kind": {"type": "noul", "ask_if": {"money": ["yes"]}}}})
    assert r.json()["diagnostics"]["skipped"]["kind"] == {
        "because": "money", "was": "no", "wanted": ["yes"]}


# The rows of the server's newer features (mmastrac/djev 28b1e26), each against the stand-in
# that follows it: what slotgate answers and what the server (stand-in) answers directly.

async def direct(upstream: SystemOneStandin, body: Any, **kw: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=upstream.url) as plain:
        if body is None:
            return await plain.post("/v1/systemone", **kw)
        return await plain.post("/v1/systemone", json=body)


def test_the_table_names_the_servers_revision() -> None:
    text = (ROOT / "docs/proxy.md").read_text().split("## Differences from the vLLM example", 1)[1]
    assert "mmastrac/djev" in text and "28b1e26" in text.split("|", 1)[0]


async def test_span_answers_are_the_servers_through_a_system_one_tier(
    upstream: SystemOneStandin,
) -> None:
    body = {"state": {"text": INVOICE}, "questions": SPANS}
    async with serving(SystemOneBackend(upstream.url), unscoped="unverified") as client:
        ours = (await client.post("/v1/systemone", json=body)).json()["answers"]
    theirs = (await direct(upstream, body)).json()["answers"]
    assert {qid: {k: v for k, v in a.items() if k != "route"} for qid, a in ours.items()} == theirs
    assert difference("`span` / `spans` questions")["deliberate"].startswith(
        "matches through a System One fast tier on `/v1/systemone`")


async def test_a_span_escalation_is_grounded_and_the_table_says_why_it_is_unscoped(
    upstream: SystemOneStandin,
) -> None:
    async with serving(SystemOneBackend(upstream.url)) as client:  # escalate: the slow model
        r = await client.post("/v1/systemone", json={"state": INVOICE, "questions": {
            "invoice_id": SPANS["invoice_id"]}})
    answer = r.json()["answers"]["invoice_id"]
    assert answer["route"] == "slow" and INVOICE[answer["start"]:answer["end"]] == answer["text"]
    row = difference("routing a span answer")
    assert row["deliberate"].startswith("yes: ") and "never guaranteed" in row["slotgate"]


async def test_the_servers_thought_is_passed_on(upstream: SystemOneStandin) -> None:
    body = {"state": "My card has not arrived.", "think": 4,
            "questions": {"late": {"type": "noul", "instructions": "Is it late?"}}}
    async with serving(SystemOneBackend(upstream.url), unscoped="unverified") as client:
        ours = (await client.post("/v1/systemone", json=body)).json()["diagnostics"]["thought"]
    assert ours == (await direct(upstream, body)).json()["diagnostics"]["thought"]
    assert difference("`think` and `diagnostics.thought`")["deliberate"].startswith("matches through a System One")


async def test_images_follow_the_servers_rules_and_go_to_the_slow_model_past_a_blind_tier(
    client: httpx.AsyncClient, upstream: SystemOneStandin, asked: list[DecisionRequest],
) -> None:
    bad = {"state": "s", "images": ["https://x/y.png"], "questions": {"q": {"type": "noul"}}}
    ours, theirs = await client.post("/v1/systemone", json=bad), await direct(upstream, bad)
    assert ours.status_code == theirs.status_code == 422
    assert ours.json()["error"]["message"] == theirs.json()["error"]["message"]
    r = await client.post("/v1/systemone", json={**bad, "images": ["data:image/png;base64,AA"]})
    assert r.json()["answers"]["q"]["route"] == "slow" and asked == []  # the mock reads no images
    assert "reads no images" in r.json()["diagnostics"]["routes"]["q"]["note"]
    assert "deliberate: the 400" in difference("images (")["deliberate"]


async def test_a_form_without_a_request_part_is_the_servers_400(
    client: httpx.AsyncClient, upstream: SystemOneStandin,
) -> None:
    headers = {"content-type": "multipart/form-data; boundary=zz"}
    raw = b'--zz\r\nContent-Disposition: form-data; name="other"\r\n\r\n{}\r\n--zz--\r\n'
    ours = await client.post("/v1/systemone", content=raw, headers=headers)
    theirs = await direct(upstream, None, content=raw, headers=headers)
    assert ours.status_code == theirs.status_code == 400
    assert ours.json()["error"]["message"] == theirs.json()["error"]["message"]
    empty = b"--zz--\r\n"
    ours = await client.post("/v1/systemone", content=empty, headers=headers)
    theirs = await direct(upstream, None, content=empty, headers=headers)
    assert ours.json()["error"]["message"] == theirs.json()["error"]["message"]
    assert difference("multipart without a `request` part")["deliberate"] == "matches"


def test_constrained_and_engine_samples_are_options_of_the_tier() -> None:
    plain = SystemOneBackend("http://127.0.0.1:9").fingerprint
    constrained = SystemOneBackend("http://127.0.0.1:9",
                                   SystemOneOptions(constrained=True)).fingerprint
    assert constrained != plain
    row = difference("`--constrained`, `--engine-samples`")
    assert row["server"].startswith("not at 28b1e26") and "fingerprint" in row["slotgate"]
