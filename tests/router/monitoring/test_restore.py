"""Restore at start-up reads the log through the typed reader: a damaged line (an alarm record
missing a field, a line of 100,000 '[') is skipped and counted in one warning, the valid alarm
is still re-armed, and ``serve`` starts (it once exited 3 on ``KeyError: 'decision'``)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from standins.llm import StandinHandle
from tests.router.monitoring.conftest import OPTIONS
from tests.router.monitoring.test_live import ask, start


def test_serve_starts_on_a_damaged_log_and_still_restores_the_valid_alarm(
        tmp_path: Path, standin: StandinHandle, caplog: pytest.LogCaptureFixture) -> None:
    standin.clear()
    server, policy_id = start(tmp_path, standin, options=list(OPTIONS))
    log = tmp_path / "decisions.jsonl"
    with log.open("w") as f:
        f.write(json.dumps({"type": "alarm", "policy_id": policy_id, "kind": "drift",
                            "time": 0.0, "detail": "no 'decision' field"}) + "\n")
        f.write("[" * 100_000 + "\n")
        f.write(json.dumps({"type": "alarm", "policy_id": policy_id, "kind": "drift",
                            "decision": 5, "time": 1.0, "detail": "valid"}) + "\n")
    with caplog.at_level(logging.WARNING), server:
        facts = ask(server, "a state")
    assert facts["route"] == "slow" and facts["escalated"]  # the valid alarm was re-armed
    summaries = [r.getMessage() for r in caplog.records if "damaged line" in r.getMessage()]
    assert len(summaries) == 1 and "2 damaged line(s) skipped" in summaries[0]
    assert not [r for r in caplog.records if r.exc_info]  # no traceback
