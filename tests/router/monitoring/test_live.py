"""Monitoring in the live proxy (uvicorn on loopback, the stand-in LLM behind litellm): accepted
decisions are audited after the reply and logged, gauges are exported, feedback is counted once,
an alarm logged before a restart escalates every decision, and a re-tuned policy clears it."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from policies.file import load_policy
from policies.types import DecisionRequest
from router.backends.mock import MockBackend
from router.http.state import app_state
from router.monitoring.replay import replay_log
from router.settings import Settings
from standins.llm import StandinHandle
from tests.live import LiveServer
from tests.reliability.conftest import metric_value
from tests.router.monitoring.conftest import OPTIONS, spelled, watched_policy


def sure(request: DecisionRequest) -> Sequence[float]:
    """0.98 on "a" (the stand-in's rule answers "a" too: audits agree); 0.86 when the message
    says "unsure": accepted, less confident than every tuning row (drift)."""
    return (0.86, 0.07, 0.07) if "unsure" in request.state else (0.98, 0.01, 0.01)


def body(text: str) -> dict[str, Any]:
    return {"model": "any", "messages": [{"role": "user", "content": text}],
            "response_format": {"type": "json_schema", "json_schema": {
                "name": "pick", "schema": {"type": "string", "enum": list(OPTIONS)}}}}


def ask(server: LiveServer, text: str) -> dict[str, Any]:
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body(text), timeout=120)
    assert response.status_code == 200, response.text
    facts: dict[str, Any] = response.json()["slotgate"]
    return facts


def start(tmp_path: Path, standin: StandinHandle, *, log_name: str = "decisions.jsonl",
          redis_url: str | None = None, **policy_fields: Any) -> tuple[LiveServer, str]:
    backend = MockBackend(sure)
    policy = watched_policy(backend_fingerprint=backend.fingerprint, **policy_fields)
    policy.write(tmp_path / "policy.json")
    settings = Settings(
        policy={"files": [tmp_path / "policy.json"], "default": policy.name},
        slow={"model": "openai/standin", "api_base": standin.api_base, "api_key": "sk-test"},
        log={"decision_log_path": tmp_path / log_name},
        cache={"redis_url": redis_url}, monitoring={"alarm_sync_s": 0.1})
    return LiveServer(settings, backend=backend), policy.policy_id


def records(tmp_path: Path, kind: str) -> list[dict[str, Any]]:
    lines = (tmp_path / "decisions.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("type") == kind]


def test_audits_gauges_feedback_and_the_alarm_action(tmp_path: Path,
                                                     standin: StandinHandle) -> None:
    standin.clear()
    server, policy_id = start(tmp_path, standin, audit_rate=1.0)
    with server:
        ids = [ask(server, f"state {spelled(i)}")["decision_id"] for i in range(5)]
        monitor = app_state(server.app).service.monitor
        deadline = time.monotonic() + 60
        while monitor.audits.counts.done < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(standin.calls()) == 5  # every accepted decision, after its reply
        weighted = monitor.watches[policy_id].weighted
        assert weighted.whole.n == weighted.whole.labels == 5 and weighted.pending == 0
        feedback = httpx.post(f"{server.url}/v1/feedback",
                              json={"decision_id": ids[0], "label": "b"}, timeout=10)
        assert feedback.status_code == 200, feedback.text
        metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    audits = records(tmp_path, "audit")
    assert sorted(a["decision_id"] for a in audits) == sorted(ids)
    assert all(a["correct"] and a["policy_id"] == policy_id for a in audits)
    assert all(a["probability"] == 1.0 for a in audits)  # audit rate 1: every decision drawn
    # The replay weighs the logged audits as the proxy did (the feedback came after them).
    [replayed] = replay_log(tmp_path / "decisions.jsonl", [load_policy(tmp_path / "policy.json")])
    assert replayed.state["labels"] == 5 and replayed.unweighted_audits == 0
    assert replayed.state["accuracy"] == 1.0
    assert metric_value(metrics, "slotgate_audits_total", policy=policy_id, result="done") == 5
    assert metric_value(metrics, "slotgate_policy_labels", policy=policy_id) == 5  # not 6
    # five labels are too few to bound accuracy away from 0, but the gauges are there
    assert f'slotgate_policy_accuracy_lower_bound{{policy="{policy_id}"}} 0.0' in metrics
    assert metric_value(metrics, "slotgate_policy_accuracy_upper_bound", policy=policy_id) == 1
    assert metric_value(metrics, "slotgate_policy_alarm", policy=policy_id, kind="drift") == 0

    # An alarm in the log (raised before a restart) is re-armed: every decision escalates.
    with (tmp_path / "decisions.jsonl").open("a") as log:
        log.write(json.dumps({"type": "alarm", "policy_id": policy_id, "kind": "drift",
                              "decision": 5, "time": 0.0, "detail": "test"}) + "\n")
    server, _ = start(tmp_path, standin, audit_rate=1.0)
    with server:
        facts = ask(server, "state after the alarm")
        metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    assert facts["route"] == "slow" and facts["escalated"]
    assert metric_value(metrics, "slotgate_policy_alarm", policy=policy_id, kind="drift") == 1
    # A re-tuned policy (another id) starts clean.
    server, retuned = start(tmp_path, standin, data_hash="1" * 64)
    with server:
        assert retuned != policy_id and ask(server, "state after the re-tune")["route"] == "fast"


def test_a_drift_alarm_on_one_replica_escalates_on_the_other(
    tmp_path: Path, standin: StandinHandle, redis_url: str
) -> None:
    """Two replicas on one Redis. Replica A sees the drift (its traffic turns unsure) and alarms;
    replica B saw none of it, yet escalates its next confident decision, within the sync."""
    a, policy_id = start(tmp_path, standin, log_name="a.jsonl", redis_url=redis_url)
    b, _ = start(tmp_path, standin, log_name="b.jsonl", redis_url=redis_url)
    with a, b:
        assert ask(b, "a confident state before")["route"] == "fast"
        for i in range(200):
            ask(a, f"unsure state {spelled(i)}")
            if app_state(a.app).service.monitor.watches[policy_id].alarm is not None:
                break
        watch_b = app_state(b.app).service.monitor.watches[policy_id]
        deadline = time.monotonic() + 10
        while watch_b.alarm is None and time.monotonic() < deadline:
            time.sleep(0.05)
        facts = ask(b, "a confident state after")
    assert facts["route"] == "slow" and facts["escalated"]
    [shared] = [r for r in map(json.loads, (tmp_path / "b.jsonl").read_text().splitlines())
                if r.get("type") == "alarm"]
    assert shared["shared"] is True and shared["kind"] == "drift"


def test_editing_on_alarm_takes_effect_on_reload(tmp_path: Path, standin: StandinHandle) -> None:
    """An alarm stands and on_alarm is escalate_all: editing the file to alert_only and reloading
    (what SIGHUP or the file watch does) serves the fast answers again, without a restart."""
    server, policy_id = start(tmp_path, standin, on_alarm="escalate_all")
    with (tmp_path / "decisions.jsonl").open("a") as log:
        log.write(json.dumps({"type": "alarm", "policy_id": policy_id, "kind": "drift",
                              "decision": 5, "time": 1.0, "detail": "test"}) + "\n")
    with server:
        assert ask(server, "before the edit")["route"] == "slow"
        path = tmp_path / "policy.json"
        edited = json.loads(path.read_text()) | {"on_alarm": "alert_only"}
        path.write_text(json.dumps(edited))
        assert app_state(server.app).service.registry.reload()
        facts = ask(server, "after the edit")
    assert facts["route"] == "fast" and facts["policy_id"] == policy_id


def test_an_operator_clear_reaches_both_live_replicas_and_survives_a_restart(
    tmp_path: Path, standin: StandinHandle, redis_url: str
) -> None:
    """`slotgate alarms clear --policy ID --redis-url` while two replicas escalate on an alarm:
    both serve fast answers again within the sync, each logs the clear, and a restarted
    replica (its log holds the alarm, then the clear) is not re-armed."""
    from typer.testing import CliRunner

    from router.cli.app import app

    a, policy_id = start(tmp_path, standin, log_name="a.jsonl", redis_url=redis_url,
                         on_alarm="escalate_all")
    b, _ = start(tmp_path, standin, log_name="b.jsonl", redis_url=redis_url,
                 on_alarm="escalate_all")
    with a, b:
        for i in range(200):
            ask(a, f"unsure state {spelled(i)}")
            if app_state(a.app).service.monitor.watches[policy_id].alarm is not None:
                break
        watch_b = app_state(b.app).service.monitor.watches[policy_id]
        wait_for(lambda: watch_b.alarm is not None)
        assert ask(b, "confident, in alarm")["route"] == "slow"
        listed = CliRunner().invoke(app, ["alarms", "list", "--log", str(tmp_path / "b.jsonl"),
                                          "--redis-url", redis_url, "--json"])
        assert listed.exit_code == 0, listed.output
        assert {(r["kind"], r["source"]) for r in json.loads(listed.output)["alarms"]} == {
            ("drift", "log"), ("drift", "redis")}
        done = CliRunner().invoke(app, ["alarms", "clear", "--policy", policy_id, "--log",
                                        str(tmp_path / "ops.jsonl"), "--redis-url", redis_url])
        assert done.exit_code == 0, done.output
        assert "every replica clears" in done.output
        watch_a = app_state(a.app).service.monitor.watches[policy_id]
        wait_for(lambda: watch_a.alarm is None and watch_b.alarm is None)
        assert ask(a, "confident, cleared")["route"] == "fast"
        assert ask(b, "confident, cleared on b")["route"] == "fast"
    kinds = [r["kind"] for r in map(json.loads, (tmp_path / "b.jsonl").read_text().splitlines())
             if r.get("type") == "alarm"]
    assert kinds == ["drift", "clear"]
    again, _ = start(tmp_path, standin, log_name="b.jsonl", on_alarm="escalate_all")
    with again:  # restarted without Redis: only its log speaks, and the clear wins
        assert ask(again, "confident, after the restart")["route"] == "fast"


def wait_for(condition: Any, within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)
