"""The operator page over real HTTP (uvicorn on loopback, httpx): off without admin keys; the
sign-in takes an admin key once and answers with an HttpOnly, SameSite=Strict session cookie;
the page shows the policy's question, promise, live figures, alarm and last decisions, and a
cost promise with its breach and what the breach does, clearable by itself; a clear
without the session's CSRF token is refused and changes nothing; a clear with it does what
``slotgate alarms clear`` does (logged, shared through Redis, routed by the policy again)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import httpx

from calibration.sequences import rate_sequence
from router.cli.alarms import standing
from router.http.operator.render import share
from router.http.state import app_state
from router.store.alarm_board import RedisAlarmBoard
from router.store.records import AlarmRecord
from tests.conftest import free_port
from tests.router.http.operator.conftest import (
    ADMIN_KEY,
    ALARM_DETAIL,
    COST_DETAIL,
    csrf_of,
    decide,
    serve,
    signed_in,
)

T = TypeVar("T")


def test_without_admin_keys_the_page_is_off_and_says_how_to_turn_it_on(tmp_path: Path) -> None:
    server, _ = serve(tmp_path, admin=False)
    with server:
        page = httpx.get(f"{server.url}/operator", timeout=10)
        login = httpx.post(f"{server.url}/operator/login", data={"key": ADMIN_KEY}, timeout=10)
    assert page.status_code == 404 and "set admin_key_hashes" in page.text
    assert login.status_code == 404 and "set-cookie" not in login.headers


def test_the_admin_key_is_taken_once_for_an_http_only_strict_session_cookie(
        tmp_path: Path) -> None:
    server, policy_id = serve(tmp_path)
    with server:
        signed_out = httpx.get(f"{server.url}/operator", timeout=10)
        wrong = httpx.post(f"{server.url}/operator/login", data={"key": "not-the-key"},
                           timeout=10)
        # the client API key opens the API, not the page
        client_key = httpx.post(f"{server.url}/operator/login",
                                data={"key": "client-key-77aa10"}, timeout=10)
        right = httpx.post(f"{server.url}/operator/login", data={"key": ADMIN_KEY}, timeout=10)
        cookie = right.cookies.get("slotgate_operator")
        page = httpx.get(f"{server.url}/operator", cookies={"slotgate_operator": cookie or ""},
                         timeout=10)
        forged = httpx.get(f"{server.url}/operator", cookies={"slotgate_operator": "forged"},
                           timeout=10)
        # only the page's own paths are outside the API key check
        beside = httpx.get(f"{server.url}/operatorx", timeout=10)
    assert signed_out.status_code == 200 and 'name="key"' in signed_out.text
    assert policy_id not in signed_out.text  # nothing of the policies before signing in
    assert wrong.status_code == 401 and "not an admin key" in wrong.text
    assert client_key.status_code == 401 and "set-cookie" not in wrong.headers
    assert right.status_code == 303 and right.headers["location"] == "/operator"
    flags = {part.strip().lower() for part in right.headers["set-cookie"].split(";")[1:]}
    assert {"httponly", "samesite=strict", "path=/operator"} <= flags
    assert "secure" not in flags  # plain HTTP here: a Secure cookie would never come back
    assert page.status_code == 200 and policy_id in page.text
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert page.headers["cache-control"] == "no-store"
    assert forged.status_code == 200 and policy_id not in forged.text
    assert beside.status_code == 401


def test_the_page_shows_question_promise_live_figures_alarm_and_last_decisions(
        tmp_path: Path) -> None:
    server, policy_id = serve(tmp_path)
    with server:
        decisions = [decide(server, f"state {word}") for word in ("one", "two", "three")]
        labelled = httpx.post(f"{server.url}/v1/feedback", timeout=10,
                              json={"decision_id": decisions[0]["decision_id"], "label": "a"},
                              headers={"authorization": "Bearer client-key-77aa10"})
        assert labelled.status_code == 200, labelled.text
        with signed_in(server) as client:
            page = client.get("/operator").text
        watch = app_state(server.app).service.monitor.watches[policy_id]
        coverage = rate_sequence(watch.n_accepted, watch.n_decisions,
                                 alpha=watch.settings.alarm_alpha / 2)
        accuracy = watch.accuracy()
    assert "<code>pick</code>" in page and "3: a, b, c" in page  # the question and its options
    assert "at least\n  <strong>0.95</strong>" in page and "accepted\n  <strong>0.600</strong>" in page
    assert (f'data-figure="coverage">{share(coverage.mean)} [{share(coverage.lower)}, '
            f"{share(coverage.upper)}]") in page
    assert (f'data-figure="accuracy">{share(accuracy.mean)} [{share(accuracy.lower)}, '
            f"{share(accuracy.upper)}]") in page
    # no auditor: no weighted estimate yet; the trusted label is counted apart
    assert accuracy.n == 0 and "0 labels; 1 trusted labels apart" in page
    assert ALARM_DETAIL in page and 'action="/operator/alarms/clear"' in page
    assert all(d["decision_id"] in page for d in decisions)
    assert "state two" not in page  # the messages themselves are never shown


def test_a_broken_cost_promise_shows_beside_the_alarms_and_a_clear_ends_it(
        tmp_path: Path) -> None:
    server, policy_id = serve(tmp_path, alarm=False, cost=True)  # the breach stands alone
    with server:
        assert app_state(server.app).service.monitor.cost_alarm(policy_id) is not None
        with signed_in(server) as client:
            page = client.get("/operator").text
            cleared = client.post("/operator/alarms/clear",
                                  data={"policy_id": policy_id, "csrf": csrf_of(page)})
            after = client.get(cleared.headers["location"]).text
        breach_after = app_state(server.app).service.monitor.cost_alarm(policy_id)
    # the promise, from the file: share 0.3 of blocks of 200, at delta 0.05
    assert "more than <strong>0.3</strong> of a block of\n  <strong>200</strong>" in page
    assert "probability at most 0.05. If it breaks (on_cost_alarm: serve_unverified)" in page
    # the breach beside the other alarms, with what it does, and the clear button for it alone
    row = page.split('<tr data-alarm="cost">')[1].split("</tr>")[0]
    assert COST_DETAIL in row and "on_cost_alarm: serve_unverified: where the policy&#39;s" in row
    assert "fast answer is served marked unverified" in row
    assert "cost promise broken</span>" in page
    assert 'action="/operator/alarms/clear"' in page and "a broken cost promise (each" in page
    assert cleared.status_code == 303 and breach_after is None
    assert "a broken cost promise included" in after and COST_DETAIL not in after
    assert "None standing." in after and "alarms/clear" not in after
    assert standing(tmp_path / "decisions.jsonl", policy_id) == {}  # a restart re-arms none


def test_a_clear_without_the_sessions_csrf_token_is_refused_and_changes_nothing(
        tmp_path: Path) -> None:
    server, policy_id = serve(tmp_path)
    with server:
        with signed_in(server) as client, signed_in(server) as other:
            token = csrf_of(other.get("/operator").text)  # another session's token
            refused = [client.post("/operator/alarms/clear", data=form) for form in (
                {"policy_id": policy_id}, {"policy_id": policy_id, "csrf": "forged"},
                {"policy_id": policy_id, "csrf": token})]
        signed_out = httpx.post(f"{server.url}/operator/alarms/clear", timeout=10,
                                data={"policy_id": policy_id, "csrf": token})
        standing_alarms = set(app_state(server.app).service.monitor.watches[policy_id].alarms)
    assert [r.status_code for r in refused] == [403, 403, 403]
    assert "CSRF token" in refused[0].text
    assert signed_out.status_code == 401
    assert standing_alarms == {"drift"}
    assert standing(tmp_path / "decisions.jsonl", policy_id)  # no clear was logged


def test_a_clear_with_the_token_is_logged_and_shared_as_the_cli_does(
        tmp_path: Path, redis_url: str) -> None:
    server, policy_id = serve(tmp_path, cache={"redis_url": redis_url},
                              monitoring={"alarm_sync_s": 60})
    # the alarm as another replica shared it
    asyncio.run(on_board(redis_url, lambda board: board.post(AlarmRecord(
        policy_id=policy_id, kind="drift", decision=0, time=1.0, detail=ALARM_DETAIL))))
    with server:
        with signed_in(server) as client:
            token = csrf_of(client.get("/operator").text)
            unknown = client.post("/operator/alarms/clear",
                                  data={"policy_id": "other@000000000000", "csrf": token})
            cleared = client.post("/operator/alarms/clear",
                                  data={"policy_id": policy_id, "csrf": token})
            after = client.get(cleared.headers["location"]).text
        monitor = app_state(server.app).service.monitor
        standing_alarms = dict(monitor.watches[policy_id].alarms)
    assert unknown.status_code == 404 and "no watched policy &#39;other@000000000000&#39;" in unknown.text
    assert cleared.status_code == 303, cleared.text
    assert standing_alarms == {} and "Cleared the alarms of policy" in after
    assert "a broken cost promise included" not in after  # it has no cost promise
    # logged: `slotgate alarms list` reads no alarm standing, and a restart re-arms none
    assert standing(tmp_path / "decisions.jsonl", policy_id) == {}
    clears = [json.loads(line) for line in (tmp_path / "decisions.jsonl").read_text().splitlines()
              if '"clear"' in line]
    assert len(clears) == 1 and clears[0]["policy_id"] == policy_id
    assert clears[0]["detail"] == "cleared by an operator (the operator page)"
    # shared at once (not at the next sync, 60 s away), as `slotgate alarms clear
    # --redis-url` shares it: the clear stands on the board and the alarm it superseded is gone
    shared = asyncio.run(on_board(redis_url, lambda board: board.read([policy_id])))
    assert [r.kind for r in shared or []] == ["clear"]


def test_a_clear_redis_does_not_take_is_logged_and_the_page_says_it_was_not_shared(
        tmp_path: Path) -> None:
    nothing_there = f"redis://127.0.0.1:{free_port()}/0"
    server, policy_id = serve(tmp_path, cache={"redis_url": nothing_there})
    with server, signed_in(server) as client:
        token = csrf_of(client.get("/operator").text)
        cleared = client.post("/operator/alarms/clear", data={"policy_id": policy_id, "csrf": token})
    assert cleared.status_code == 503
    assert "cleared here and the clear is logged, but it was not shared" in cleared.text
    assert standing(tmp_path / "decisions.jsonl", policy_id) == {}


def test_signing_out_ends_the_session(tmp_path: Path) -> None:
    server, policy_id = serve(tmp_path, alarm=False)
    with server:
        with signed_in(server) as client:
            cookie = client.cookies["slotgate_operator"]
            page = client.get("/operator").text
            out = client.post("/operator/logout", data={"csrf": csrf_of(page)})
        again = httpx.get(f"{server.url}/operator", cookies={"slotgate_operator": cookie},
                          timeout=10)
    assert "None standing." in page and "alarms/clear" not in page  # no alarm, no button
    assert out.status_code == 303 and "max-age=0" in out.headers["set-cookie"].lower()
    assert again.status_code == 200 and 'name="key"' in again.text
    assert policy_id not in again.text  # the old cookie opens nothing


async def on_board(redis_url: str, action: Callable[[RedisAlarmBoard], Awaitable[T]]) -> T:
    board = RedisAlarmBoard(redis_url, ttl_s=60)
    try:
        return await action(board)
    finally:
        await board.aclose()
