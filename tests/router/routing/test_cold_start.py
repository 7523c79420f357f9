"""The shadow cold start over real HTTP: ``policy.default`` names a policy whose file is not
written yet. The server starts in shadow mode (every decision answered by the slow model), and
once ``slotgate tune`` writes the file the reload that loads it makes it the default."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest

from router.backends.mock import MockBackend
from router.http.state import app_state
from router.routing.reload import reload_now
from router.settings import Settings
from standins.llm import StandinHandle
from tests.live import LiveServer
from tests.router.monitoring.conftest import watched_policy
from tests.router.monitoring.test_live import body, sure


def test_a_default_policy_not_written_yet_starts_in_shadow_and_is_picked_up_when_written(
        tmp_path: Path, standin: StandinHandle, caplog: pytest.LogCaptureFixture) -> None:
    backend = MockBackend(sure)
    policy = watched_policy(backend_fingerprint=backend.fingerprint)
    path = tmp_path / "policies" / "intents.json"
    settings = Settings(
        policy={"files": [path], "default": policy.name, "shadow": True},
        slow={"model": "openai/standin", "api_base": standin.api_base, "api_key": "sk-test"},
        log={"decision_log_path": tmp_path / "log.jsonl"})
    with caplog.at_level(logging.WARNING, logger="slotgate"), \
            LiveServer(settings, backend=backend) as server:
        assert any(f"policy.default names {policy.name!r}, not loaded yet" in r.getMessage()
                   for r in caplog.records)
        before = httpx.post(f"{server.url}/v1/chat/completions", json=body("my card"),
                            timeout=60)
        assert before.status_code == 200, before.text
        facts = before.json()["slotgate"]
        assert facts["route"] == "slow" and facts["policy_id"] != policy.policy_id
        path.parent.mkdir()
        policy.write(path)  # what `slotgate tune --out` does
        assert reload_now(app_state(server.app).service.registry, "test")
        after = httpx.post(f"{server.url}/v1/chat/completions", json=body("my card is late"),
                           timeout=60).json()["slotgate"]
        # decided by the policy now, in shadow: the slow model still answers
        assert after["policy_id"] == policy.policy_id and after["shadow"] is True
        assert after["route"] == "slow"
