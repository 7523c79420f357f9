"""A served policy for the operator page's tests: slotgate under uvicorn on loopback with one
watched policy, an admin key and a client API key, a drift alarm standing from its decision log,
and a client that signs in as a browser would (a form post, then the cookie)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from router.backends.mock import MockBackend
from router.settings import Settings
from tests.live import LiveServer
from tests.router.monitoring.conftest import watched_policy
from tests.router.monitoring.test_cost import PROMISE
from tests.router.monitoring.test_live import body, sure

ADMIN_KEY = "admin-key-2f6b0c41d9e8"
CLIENT_KEY = "client-key-77aa10"
ALARM_DETAIL = "the confidence-drop martingale reached 3.70 (log) in a test"
COST_DETAIL = "cost promise broken: 90 of 200 decisions escalated in a test"


def serve(tmp_path: Path, *, admin: bool = True, alarm: bool = True, cost: bool = False,
          **settings: Any) -> tuple[LiveServer, str]:
    """The server and its policy's id; ``alarm``: a drift alarm is logged before it starts
    (re-armed at start-up, as after a restart); ``cost``: the policy carries a cost promise
    (``on_cost_alarm: serve_unverified``) and a breach of it is logged the same way."""
    backend = MockBackend(sure)
    promise = {"cost_promise": PROMISE, "on_cost_alarm": "serve_unverified"} if cost else {}
    policy = watched_policy(backend_fingerprint=backend.fingerprint, name="intents",
                            on_alarm="alert_only", **promise)
    policy.write(tmp_path / "policy.json")
    log = tmp_path / "decisions.jsonl"
    logged = [("drift", ALARM_DETAIL)] if alarm else []
    logged += [("cost", COST_DETAIL)] if cost else []
    log.write_text("".join(json.dumps({"type": "alarm", "policy_id": policy.policy_id,
                                       "kind": kind, "decision": 0, "time": 1.0,
                                       "detail": detail}) + "\n" for kind, detail in logged))
    return LiveServer(Settings(
        policy={"files": [tmp_path / "policy.json"], "default": policy.name},
        log={"decision_log_path": log}, feedback={"default_role": "trusted"},
        api_key_hashes=[hashlib.sha256(CLIENT_KEY.encode()).hexdigest()],
        admin_key_hashes=[hashlib.sha256(ADMIN_KEY.encode()).hexdigest()] if admin else [],
        **settings), backend=backend), policy.policy_id


def decide(server: LiveServer, text: str) -> dict[str, Any]:
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body(text), timeout=30,
                          headers={"authorization": f"Bearer {CLIENT_KEY}"})
    assert response.status_code == 200, response.text
    facts: dict[str, Any] = response.json()["slotgate"]
    return facts


@contextmanager
def signed_in(server: LiveServer) -> Iterator[httpx.Client]:
    """A client holding a session cookie, signed in with the admin key."""
    with httpx.Client(base_url=server.url, timeout=10) as client:
        response = client.post("/operator/login", data={"key": ADMIN_KEY})
        assert response.status_code == 303, response.text
        yield client


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None, page
    return found.group(1)
