"""Labels no client can weaponise: two replicas on one real Redis, uvicorn on loopback, two API
keys. A client key's wrong labels are logged (export-log reads them) but count nowhere, so they
cannot switch the fleet to the slow model; a trusted key's labels feed the accuracy alarm, once
per input (one message asked four times is one piece of evidence) and once per decision (the
same label posted twice), and the alarm they raise escalates on the other replica too; a
refused key may not label at all."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from policies.file import load_policy
from router.backends.mock import MockBackend
from router.cli.app import app as cli
from router.errors import ConfigError
from router.http.state import app_state
from router.monitoring.replay import replay_log
from router.settings import Settings, load_settings
from router.store.log_join import LabelJoin
from router.store.log_reader import parse_record
from router.store.records import AuditRecord, FeedbackRecord
from standins.llm import StandinHandle
from tests.live import LiveServer
from tests.router.monitoring.conftest import watched_policy
from tests.router.monitoring.test_live import body, sure, wait_for

CLIENT, TRUSTED, REFUSED = "client-key-1b7e", "auditor-key-90c2", "bot-key-4d11"
HASHES = {key: hashlib.sha256(key.encode()).hexdigest() for key in (CLIENT, TRUSTED, REFUSED)}


def start(tmp_path: Path, standin: StandinHandle, redis_url: str,
          log_name: str) -> tuple[LiveServer, str]:
    backend = MockBackend(sure)
    policy = watched_policy(backend_fingerprint=backend.fingerprint, on_alarm="escalate_all")
    policy.write(tmp_path / "policy.json")
    settings = Settings(
        policy={"files": [tmp_path / "policy.json"], "default": policy.name},
        slow={"model": "openai/standin", "api_base": standin.api_base, "api_key": "sk-test"},
        log={"decision_log_path": tmp_path / log_name}, cache={"redis_url": redis_url},
        monitoring={"alarm_sync_s": 0.1}, api_key_hashes=list(HASHES.values()),
        feedback={"roles": {HASHES[TRUSTED]: "trusted", HASHES[REFUSED]: "refused"}})
    return LiveServer(settings, backend=backend), policy.policy_id


def ask(server: LiveServer, key: str, text: str) -> dict[str, Any]:
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body(text),
                          headers={"authorization": f"Bearer {key}"}, timeout=60)
    assert response.status_code == 200, response.text
    facts: dict[str, Any] = response.json()["slotgate"]
    return facts


def label(server: LiveServer, key: str, decision_id: str, value: str) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/feedback", json={"decision_id": decision_id,
                                                         "label": value},
                      headers={"authorization": f"Bearer {key}"}, timeout=10)


def test_client_labels_are_logged_only_and_trusted_ones_count_once_per_input(
        tmp_path: Path, standin: StandinHandle, redis_url: str) -> None:
    a, policy_id = start(tmp_path, standin, redis_url, "a.jsonl")
    b, _ = start(tmp_path, standin, redis_url, "b.jsonl")
    with a, b:
        watch_a = app_state(a.app).service.monitor.watches[policy_id]
        watch_b = app_state(b.app).service.monitor.watches[policy_id]
        # The attack: one confident message four times (one read, three cache hits), a wrong
        # label on each. Logged, answered 200, counted nowhere.
        ids = [ask(a, CLIENT, "my card has not arrived yet")["decision_id"] for _ in range(4)]
        assert len(set(ids)) == 4
        for decision_id in ids:
            posted = label(a, CLIENT, decision_id, "b")
            assert posted.status_code == 200 and posted.json()["trusted"] is False
        assert watch_a.trusted.n == 0 and watch_a.alarm is None
        logged = [r for r in map(json.loads, (tmp_path / "a.jsonl").read_text().splitlines())
                  if r.get("type") == "feedback"]
        assert sorted(r["decision_id"] for r in logged) == sorted(ids)

        refused = label(a, REFUSED, ids[0], "b")
        assert refused.status_code == 403 and refused.json()["error"]["param"] == "authorization"

        # A trusted key labels the trusted tenant's same four decisions: one input, one label;
        # the same label posted twice on one decision counts once too.
        own = [ask(a, TRUSTED, "my card has not arrived yet")["decision_id"] for _ in range(4)]
        for decision_id in [*own, own[0]]:
            posted = label(a, TRUSTED, decision_id, "b")
            assert posted.status_code == 200 and posted.json()["trusted"] is True
        assert watch_a.trusted.n == 1 and watch_a.alarm is None

        # Wrong answers on distinct inputs are evidence: the alarm, then the fleet escalates.
        for word in ("lost", "stolen", "blocked", "frozen", "declined", "expired", "damaged"):
            decision_id = ask(a, TRUSTED, f"my card was {word}")["decision_id"]
            assert label(a, TRUSTED, decision_id, "b").status_code == 200
            if watch_a.alarm is not None:
                break
        assert watch_a.alarm is not None and watch_a.alarm.kind == "accuracy"
        wait_for(lambda: watch_b.alarm is not None)
        assert ask(b, CLIENT, "a confident question on the other replica")["route"] == "slow"


def test_a_role_for_something_that_is_not_a_key_hash_is_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError, match=r"feedback.roles.*not a sha256 hex digest"):
        load_settings(feedback={"roles": {"client-key-1b7e": "trusted"}})
    with pytest.raises(ConfigError, match="feedback"):
        load_settings(feedback={"roles": {HASHES[CLIENT]: "admin"}})
    settings = load_settings(feedback={"roles": {HASHES[CLIENT].upper(): "trusted"}})
    assert settings.feedback.role_of(f"key-{HASHES[CLIENT][:16]}") == "trusted"
    assert settings.feedback.role_of("default") == "logged"


def test_export_log_and_monitor_read_only_trusted_labels_unless_asked(
        tmp_path: Path, standin: StandinHandle, redis_url: str) -> None:
    """Two keys label through real HTTP: the trusted key's label is exported and replayed, the
    logged key's is in the log but poisons neither re-tuning nor the replayed accuracy, unless
    ``export-log --untrusted-labels`` asks for it; a label posted twice is one row's label."""
    server, policy_id = start(tmp_path, standin, redis_url, "a.jsonl")
    with server:
        mine = ask(server, TRUSTED, "my card has not arrived yet")["decision_id"]
        theirs = ask(server, CLIENT, "my card was stolen")["decision_id"]
        assert label(server, TRUSTED, mine, "a").json()["trusted"] is True
        for _ in range(2):  # the same wrong label posted twice
            assert label(server, CLIENT, theirs, "b").json()["trusted"] is False
    log = tmp_path / "a.jsonl"
    logged = [r for r in map(json.loads, log.read_text().splitlines())
              if r.get("type") == "feedback"]
    assert [(r["decision_id"], r["trusted"]) for r in logged] == [
        (mine, True), (theirs, False), (theirs, False)]

    out = tmp_path / "trusted.jsonl"
    result = CliRunner().invoke(cli, ["export-log", "--log", str(log), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert {r["id"]: r["label"] for r in map(json.loads, out.read_text().splitlines())} == {
        mine: "a", theirs: None}
    assert "1 human" in result.output
    assert "1 untrusted label(s) left out (--untrusted-labels includes them)" in result.output

    everything = tmp_path / "all.jsonl"
    result = CliRunner().invoke(cli, ["export-log", "--log", str(log), "--out", str(everything),
                                      "--untrusted-labels"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in everything.read_text().splitlines()]
    assert {r["id"]: r["label"] for r in rows} == {mine: "a", theirs: "b"}
    assert "2 human" in result.output and "including 1 untrusted" in result.output

    [series] = replay_log(log, [load_policy(tmp_path / "policy.json")])
    assert series.policy_id == policy_id
    assert [correct for _, correct, *_ in series.labels] == [True]  # the trusted label only


def test_a_feedback_record_without_the_trusted_field_counts_as_trusted() -> None:
    """Logs written before labels had roles: every label then fed the alarm and the export."""
    old = parse_record(b'{"type": "feedback", "decision_id": "d0", "label": "a", "time": 1.0}')
    assert isinstance(old, FeedbackRecord) and old.trusted is True
    labels = LabelJoin()
    labels.add(old)
    labels.add(FeedbackRecord(decision_id="d0", label="b", time=2.0, trusted=False))
    assert labels.label("d0") == ("a", "human") and labels.untrusted == 1
    everyone = LabelJoin(untrusted=True)
    everyone.add(old)
    everyone.add(FeedbackRecord(decision_id="d0", label="b", time=2.0, trusted=False))
    assert everyone.label("d0") == ("a", "human")  # joined, a trusted label still wins
    everyone.add(FeedbackRecord(decision_id="d1", label="b", time=2.0, trusted=False))
    everyone.add(AuditRecord(decision_id="d1", label="a", time=3.0))
    assert everyone.label("d1") == ("b", "human") and len(everyone) == 2
