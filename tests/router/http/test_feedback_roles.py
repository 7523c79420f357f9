"""Whose decisions a key may label over real HTTP (uvicorn on loopback, three API keys): a
trusted key labels any logged decision, whichever key asked it; any other key labels only its
own, and is told the id is not among its decisions."""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx

from router.backends.mock import MockBackend
from router.settings import Settings
from standins.llm import StandinHandle
from tests.live import LiveServer
from tests.router.monitoring.conftest import watched_policy
from tests.router.monitoring.test_live import body, sure

ALICE, BOB, AUDITOR = "alice-key-51c0", "bob-key-7e2a", "auditor-key-0f93"
HASHES = {key: hashlib.sha256(key.encode()).hexdigest() for key in (ALICE, BOB, AUDITOR)}


def serve(tmp_path: Path, standin: StandinHandle) -> LiveServer:
    backend = MockBackend(sure)
    policy = watched_policy(backend_fingerprint=backend.fingerprint)
    policy.write(tmp_path / "policy.json")
    return LiveServer(Settings(
        policy={"files": [tmp_path / "policy.json"], "default": policy.name},
        slow={"model": "openai/standin", "api_base": standin.api_base, "api_key": "sk-test"},
        log={"decision_log_path": tmp_path / "decisions.jsonl"},
        api_key_hashes=list(HASHES.values()), feedback={"roles": {HASHES[AUDITOR]: "trusted"}}),
        backend=backend)


def ask(server: LiveServer, key: str) -> str:
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body("where is my card"),
                          headers={"authorization": f"Bearer {key}"}, timeout=60)
    assert response.status_code == 200, response.text
    decision_id: str = response.json()["slotgate"]["decision_id"]
    return decision_id


def label(server: LiveServer, key: str, decision_id: str) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/feedback", json={"decision_id": decision_id, "label": "a"},
                      headers={"authorization": f"Bearer {key}"}, timeout=10)


def test_a_trusted_key_labels_any_decision_and_others_only_their_own(
        tmp_path: Path, standin: StandinHandle) -> None:
    with serve(tmp_path, standin) as server:
        alices = ask(server, ALICE)
        # Bob's key may not label Alice's decision: the 404 says it is not among his decisions.
        refused = label(server, BOB, alices)
        assert refused.status_code == 404, refused.text
        message = refused.json()["error"]["message"]
        assert f"no decision {alices!r} among this API key's decisions" in message, message
        # The auditor's trusted key labels it, and the label counts as trusted.
        taken = label(server, AUDITOR, alices)
        assert taken.status_code == 200, taken.text
        assert taken.json() == {"decision_id": alices, "label": "a", "correct": True,
                                "trusted": True}
        # Alice labels her own; an id nobody logged is unknown to the trusted key too.
        assert label(server, ALICE, alices).status_code == 200
        unknown = label(server, AUDITOR, "no-such-decision")
        assert unknown.status_code == 404, unknown.text
        assert "no decision 'no-such-decision' in the log" in unknown.json()["error"]["message"]
