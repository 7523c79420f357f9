"""A cost check's evidence outlives a restart: its wealth, counts, blocks and a standing breach
go into the watch checkpoint beside the watch's own entry and are resumed exactly; a damaged
entry is discarded with one warning naming the file, the policy and the field, and nothing of
it is taken; an entry saved against another cost promise starts afresh with one warning saying
why; a checkpoint without the cost entry still resumes its watches, and one with it still reads
where cost checks are unknown. A restart re-arms a breach its decision log holds, unless an
operator's clear came after it."""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from router.monitoring import checkpoint
from router.monitoring.cost import CostSettings, CostWatch
from router.monitoring.monitor import Monitor
from router.monitoring.startup import restore_from_log
from router.store.records import AlarmRecord, encode
from tests.router.monitoring.conftest import watched_policy
from tests.router.monitoring.states import changed
from tests.router.monitoring.test_cost import feed, promised

POLICY = promised(on_cost_alarm="serve_unverified")
PID = POLICY.policy_id


def broken() -> CostWatch:
    """A check that found the promise broken: 4 full blocks, 30 decisions into the fifth."""
    settings = CostSettings.of(POLICY)
    assert settings is not None
    check = CostWatch(settings)
    for escalated in np.random.default_rng(0).uniform(size=830) < 0.4:
        check.take(bool(escalated), now=1000.0)
    assert check.alarm is not None and check.blocks_over >= 1
    return check


def saved(**changes: Any) -> dict[str, Any]:
    """The broken check's state with ``changes`` applied (``"test.wealth"`` reaches inside)."""
    return changed(broken().state(), changes)


def started(path: Path) -> Monitor:
    monitor = Monitor()
    monitor.watch(POLICY)
    monitor.keep_checkpoints(path)
    return monitor


def fresh_watch_state() -> dict[str, Any]:
    monitor = Monitor()
    monitor.watch(POLICY)
    return monitor.watches[PID].state()


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


async def test_the_evidence_and_a_standing_breach_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "decisions.jsonl.watch.json"
    first = started(path)
    feed(first, POLICY, 0.4, 830, seed=0)
    before = first.costs.checks[PID].state()
    assert before["alarm"] is not None and before["in_block"] == 30
    await first.aclose()
    saved_file = json.loads(path.read_text())
    assert saved_file["cost"][PID] == before and "decisions" in saved_file[PID]

    again = started(path)
    check = again.costs.checks[PID]
    assert check.state() == before
    alarm = again.cost_alarm(PID)
    assert alarm is not None and alarm.on_cost_alarm == "serve_unverified"
    feed(again, POLICY, 0.4, 170, seed=1)  # the fifth block fills where it stopped
    assert check.blocks == 5 and check.n_decisions == 1000
    await again.aclose()


async def test_evidence_short_of_a_breach_goes_on_compounding(tmp_path: Path) -> None:
    """Split in two processes, a stream past the cap breaks the promise at the same decision as
    in one."""
    path = tmp_path / "decisions.jsonl.watch.json"
    settings = CostSettings.of(POLICY)
    assert settings is not None
    one = CostWatch(settings)
    stream = np.random.default_rng(3).uniform(size=2000) < 0.4
    for escalated in stream:
        one.take(bool(escalated))
    assert one.alarm is not None
    first = started(path)
    check = first.costs.checks[PID]
    for escalated in stream[:one.alarm.decision - 1]:
        check.take(bool(escalated))
    assert check.alarm is None
    await first.aclose()
    again = started(path)
    check = again.costs.checks[PID]
    breach = check.take(bool(stream[one.alarm.decision - 1]))
    assert breach is not None and breach.decision == one.alarm.decision
    await again.aclose()


DAMAGE: list[tuple[str, dict[str, Any], str]] = [
    ("a zero wealth", {"test.wealth": [0.0] * 6}, "cost.test.wealth"),
    ("a scale its bets cannot reach", {"test.log_scale": 1e308}, "cost.test.log_scale"),
    ("a negative escalation count", {"escalated": -1}, "cost.escalated"),
    ("a count as a string", {"escalated": "300"}, "cost.escalated"),
    ("fewer escalations than its blocks past the share hold", {"escalated": 31},
     "cost.escalated"),
    ("blocks out of step with the test", {"blocks": 9}, "cost.blocks"),
    ("more blocks past the share than blocks", {"blocks_over": 5}, "cost.blocks_over"),
    ("more escalations in the block than decisions", {"escalated_in_block": 31},
     "cost.escalated_in_block"),
    ("a raised test without its breach", {"alarm": None}, "cost.alarm"),
    ("a breach in the future", {"alarm.time": time.time() + 10 * 86_400}, "cost.alarm.time"),
    ("a breach at a negative decision", {"alarm.decision": -1}, "cost.alarm.decision"),
    ("a breach without words", {"alarm.detail": 7}, "cost.alarm.detail"),
    ("a missing field", {"test": {"n": 3}}, "cost.test.wealth"),
]


@pytest.mark.parametrize(("case", "changes", "field"), DAMAGE, ids=[d[0] for d in DAMAGE])
async def test_a_damaged_entry_is_discarded_with_one_warning_naming_the_file_and_field(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, case: str, changes: dict[str, Any],
        field: str) -> None:
    path = tmp_path / "decisions.jsonl.watch.json"
    path.write_text(json.dumps({PID: fresh_watch_state(), "cost": {PID: saved(**changes)}}))
    with caplog.at_level(logging.WARNING, logger="slotgate.monitoring"):
        monitor = started(path)
    [message] = warnings(caplog)
    assert str(path) in message and PID in message and "cost check starts afresh" in message
    assert re.search(rf"(?<![\w.]){re.escape(field)}(?!\w)", message), message
    check = monitor.costs.checks[PID]
    fresh = CostWatch(check.settings)
    assert check.state() == fresh.state() and monitor.cost_alarm(PID) is None  # nothing taken
    feed(monitor, POLICY, 0.2, 5, seed=0)
    await monitor.aclose()
    assert json.loads(path.read_text())["cost"][PID]["test"]["n"] == 5  # it saves again


@pytest.mark.parametrize(("cost", "words"), [
    ({PID: [1, 2]}, f"policy {PID}: cost.the entry must be a JSON object, got list"),
    ([1, 2], "cost must be a JSON object, got list; the cost checks start afresh"),
])
async def test_an_entry_or_section_that_is_no_object_is_discarded(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, cost: Any, words: str) -> None:
    path = tmp_path / "decisions.jsonl.watch.json"
    path.write_text(json.dumps({PID: fresh_watch_state(), "cost": cost}))
    with caplog.at_level(logging.WARNING, logger="slotgate.monitoring"):
        monitor = started(path)
    [message] = warnings(caplog)
    assert str(path) in message and words in message
    assert monitor.costs.checks[PID].n_decisions == 0
    await monitor.aclose()


@pytest.mark.parametrize(("name", "value", "why"), [
    ("share", 0.25, "share 0.25 -> 0.3"),
    ("block", 100, "block 100 -> 200"),
    ("live_cap", 0.3, "live_cap 0.3 -> 0.247"),
    ("alpha", 0.01, "alpha 0.01 -> 0.05"),
    ("version", 0, "format 0 -> 1"),
])
async def test_an_entry_saved_against_another_promise_starts_afresh_with_one_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str, value: Any,
        why: str) -> None:
    path = tmp_path / "decisions.jsonl.watch.json"
    path.write_text(json.dumps({"cost": {PID: saved(**{name: value})}}))
    with caplog.at_level(logging.WARNING, logger="slotgate.monitoring"):
        monitor = started(path)
    [message] = warnings(caplog)
    assert PID in message and "another cost promise" in message and why in message
    assert monitor.costs.checks[PID].n_decisions == 0 and monitor.cost_alarm(PID) is None
    await monitor.aclose()


async def test_a_checkpoint_without_the_cost_entry_resumes_its_watches_quietly(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "decisions.jsonl.watch.json"
    first = started(path)
    feed(first, POLICY, 0.4, 300, seed=0)
    await first.aclose()
    states = json.loads(path.read_text())
    del states["cost"]  # as a slotgate without cost checks wrote it
    path.write_text(json.dumps(states))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="slotgate.monitoring"):
        again = Monitor()
        again.watch(POLICY)
        assert again.keep_checkpoints(path) == 1
    assert not warnings(caplog)
    assert again.watches[PID].n_decisions == 300 and again.costs.checks[PID].n_decisions == 0
    await again.aclose()


async def test_a_checkpoint_with_the_cost_entry_reads_where_cost_checks_are_unknown(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The watches' reader alone (no cost checks given) takes the watch and skips the cost
    entry; a policy without a cost promise writes no cost entry."""
    path = tmp_path / "decisions.jsonl.watch.json"
    first = started(path)
    feed(first, POLICY, 0.4, 300, seed=0)
    await first.aclose()
    again = Monitor()
    again.watch(POLICY)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="slotgate.monitoring"):
        assert checkpoint.resume(path, again.watches) == 1
    assert not warnings(caplog) and again.watches[PID].n_decisions == 300
    plain = Monitor()
    plain.watch(watched_policy())
    checkpoint.write(path, plain.watches, plain.costs)
    assert "cost" not in json.loads(path.read_text())


async def test_a_retired_policys_cost_check_leaves_the_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "decisions.jsonl.watch.json"
    monitor = started(path)
    other = promised(data_hash="2" * 64)
    monitor.watch(other)
    feed(monitor, POLICY, 0.4, 50, seed=0)
    monitor.retire_others([other.policy_id])
    await monitor.aclose()
    assert list(json.loads(path.read_text())["cost"]) == [other.policy_id]


async def test_a_restart_re_arms_a_breach_the_decision_log_holds(tmp_path: Path) -> None:
    log = tmp_path / "decisions.jsonl"
    breach = AlarmRecord(policy_id=PID, kind="cost", decision=300, time=time.time() - 60,
                         detail="cost promise broken: 140 of 300 decisions escalated",
                         on_alarm="serve_unverified")
    log.write_bytes(encode(breach) + b"\n")
    monitor = Monitor()
    monitor.watch(POLICY)
    assert restore_from_log(monitor, log) == 1
    alarm = monitor.cost_alarm(PID)
    assert alarm is not None and alarm.detail == breach.detail
    assert monitor.costs.checks[PID].n_decisions == 0  # the breach, not evidence, came back
    await monitor.aclose()

    clear = AlarmRecord(policy_id=PID, kind="clear", decision=0, time=time.time(), detail="x")
    with log.open("ab") as f:
        f.write(encode(clear) + b"\n")
    again = Monitor()
    again.watch(POLICY)
    assert restore_from_log(again, log) == 0  # the clear wins, over the checkpoint's too
    assert again.cost_alarm(PID) is None and again.costs.checks[PID].alarm is None
    await again.aclose()
