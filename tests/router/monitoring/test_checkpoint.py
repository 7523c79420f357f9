"""A watch checkpoint is verified before it is trusted: each damaged one (nested too deep, a
wealth of zeros, NaN or infinite numbers, a wealth its bets could not reach, negative or
inconsistent counts, a clear in the future) is discarded with one warning naming the file and
the field, never a traceback, and the watch starts afresh and can be saved again; a state from
a long real run still resumes; a failed write leaves no temporary file; two processes cannot
share one checkpoint."""

from __future__ import annotations

import errno
import json
import logging
import math
import re
import time
from pathlib import Path
from typing import Any

import pytest

from router.errors import ConfigError
from router.monitoring.checkpoint import CheckpointInUse, check_unclaimed
from router.monitoring.monitor import Monitor
from router.monitoring.watch import PolicyWatch, WatchSettings
from tests.router.monitoring.conftest import DOUBTFUL, watched_policy
from tests.router.monitoring.states import changed

POLICY = watched_policy(on_alarm="alert_only", audit_rate=0.3)


def lived() -> PolicyWatch:
    """A watch that saw confident traffic, doubtful accepted traffic, audits (one still out)
    and trusted labels."""
    watch = PolicyWatch(WatchSettings.of(POLICY))
    out = []
    for i in range(60):
        watch.take(0.99 if i % 2 else 0.9, accepted=True, key=f"k{i}", now=0.0)
        draw, _ = watch.draw(0.99 if i % 2 else 0.9)
        if draw is not None:
            out.append(draw.ticket)
    for i, ticket in enumerate(out[:-1]):
        watch.audited(ticket, i % 4 != 0)
    for i in range(20):
        watch.label(i % 5 != 0)
    return watch


def saved(**changes: Any) -> dict[str, Any]:
    """The lived watch's state with ``changes`` applied (``"drift.wealth"`` reaches inside)."""
    return changed(lived().state(), changes)


def start(path: Path) -> tuple[Monitor, PolicyWatch]:
    monitor = Monitor()
    monitor.watch(POLICY)
    resumed = monitor.keep_checkpoints(path)
    assert resumed == 0
    return monitor, monitor.watches[POLICY.policy_id]


def warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.WARNING]


def strict(text: str) -> Any:
    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in a checkpoint")

    return json.loads(text, parse_constant=refuse)


DAMAGE: list[tuple[str, dict[str, Any], str]] = [
    ("a zero wealth", {"drift.wealth": [0.0, 0.0, 0.0]}, "drift.wealth"),
    ("a NaN scale", {"drift.log_scale": math.nan}, "drift.log_scale"),
    ("an infinite detector", {"traffic.detector": [math.inf] * 6}, "traffic.detector"),
    ("a scale of 1e308", {"drift.log_scale": 1e308}, "drift.log_scale"),
    ("a negative decision count", {"decisions": -5}, "decisions"),
    ("a negative label count", {"shortfall.n": -1}, "shortfall.n"),
    ("more distinct inputs than decisions", {"counted": 10**6}, "counted"),
    ("a count as a string", {"accepted": "60"}, "accepted"),
    ("more ranked confidences than bets", {"drift.ranked": {"9000": 10**6}}, "drift.ranked"),
    ("a drift wealth past the alarm level without an alarm",
     {"drift.wealth": [1 / 3] * 3, "drift.log_scale": 5.0}, "drift.alarm_at"),
    ("an accuracy sum above its count", {"trusted.sum": 1e9}, "trusted.sum"),
    ("a weighted test past its decisions", {"weighted.next_ticket": 3}, "weighted.whole.n"),
    ("a gauge sum no estimate reaches", {"weighted.gauge.sum": 1e9}, "weighted.gauge.sum"),
    ("a design sum past its stratum", {"weighted.design.sums": [5.0] * 9},
     "weighted.design.sums[0]"),
    ("a suspect test without its start", {"weighted.suspect": {"n": 0}},
     "weighted.suspect_from"),
    ("more lost audits than decisions", {"weighted.lost": 10**6}, "weighted.lost"),
    ("a trip with no tripped detector", {"traffic_tripped_at": 3}, "traffic_tripped_at"),
    ("a clear in the future", {"cleared_at": time.time() + 10 * 86_400}, "cleared_at"),
    ("a missing field", {"shortfall": {"n": 3}}, "shortfall.wealth"),
]


@pytest.mark.parametrize(("case", "changes", "field"), DAMAGE, ids=[d[0] for d in DAMAGE])
async def test_a_damaged_entry_is_discarded_with_one_warning_naming_the_file_and_field(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, case: str, changes: dict[str, Any],
        field: str) -> None:
    path = tmp_path / "decisions.jsonl.watch.json"
    path.write_text(json.dumps({POLICY.policy_id: saved(**changes)}))  # NaN and Infinity too
    with caplog.at_level(logging.WARNING, logger="slotgate.monitoring"):
        monitor, watch = start(path)
    [warning] = warnings(caplog)
    message = warning.getMessage()
    assert str(path) in message and not warning.exc_info
    assert re.search(rf"(?<![\w.]){re.escape(field)}(?!\w)", message), message
    fresh = PolicyWatch(WatchSettings.of(POLICY))
    assert watch.state() == fresh.state()
    assert watch.drift is not None and watch.drift.log_value == 0.0
    for i in range(5):  # the fresh watch runs on: no alarm at once, and it saves again
        watch.take(0.99, accepted=True, key=f"after {i}", now=0.0)
    assert not watch.alarms
    await monitor.aclose()
    assert strict(path.read_text())[POLICY.policy_id]["decisions"] == 5


async def test_a_checkpoint_of_another_format_starts_afresh_with_one_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "decisions.jsonl.watch.json"
    path.write_text(json.dumps({POLICY.policy_id: saved(version=3)}))
    with caplog.at_level(logging.WARNING, logger="slotgate.monitoring"):
        monitor, watch = start(path)
    [warning] = warnings(caplog)
    assert POLICY.policy_id in warning.getMessage() and "format 3" in warning.getMessage()
    assert "starts afresh" in warning.getMessage() and watch.n_decisions == 0
    await monitor.aclose()


async def test_a_file_nested_50000_deep_does_not_stop_the_start(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "decisions.jsonl.watch.json"
    path.write_text("[" * 50_000 + "]" * 50_000)
    with caplog.at_level(logging.WARNING, logger="slotgate.monitoring"):
        monitor, watch = start(path)
    [warning] = warnings(caplog)
    assert str(path) in warning.getMessage() and not warning.exc_info
    assert watch.n_decisions == 0
    await monitor.aclose()
    assert POLICY.policy_id in strict(path.read_text())


def test_a_long_real_run_still_resumes() -> None:
    """Through a drift alarm, the traffic detector's trip, an accuracy alarm and a run of
    right answers: every state on the way resumes exactly (rescaled wealths:
    ``tests/calibration/test_monitoring.py``)."""
    watch = PolicyWatch(WatchSettings.of(POLICY))
    stages = [(DOUBTFUL - 0.05, True, 400, 100), (0.3, False, 3000, 100),
              (0.999, True, 2000, 1000)]
    n = 0
    for confidence, accepted, decisions, labels in stages:
        for _ in range(decisions):
            n += 1
            watch.take(confidence, accepted=accepted, key=str(n), now=0.0)
            draw, _ = watch.draw(confidence) if accepted else (None, None)
            if draw is not None and n % 7:  # every seventh audit's label never comes
                watch.audited(draw.ticket, labels == 1000 or n % 3 != 0)
        for i in range(labels):
            watch.label(i % 3 != 0 if labels == 100 else True)
        copy_ = PolicyWatch(WatchSettings.of(POLICY))
        assert copy_.resume(json.loads(json.dumps(watch.state(), allow_nan=False)))
        assert copy_.state() == watch.state()
    assert {"drift", "accuracy"} <= set(watch.alarms) and watch.traffic_tripped


async def test_a_failed_write_leaves_no_temporary_file_and_keeps_the_last_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "decisions.jsonl.watch.json"
    monitor, _ = start(path)
    await monitor.aclose()
    before = path.read_text()

    def disk_full(self: Path, text: str, encoding: str | None = None) -> int:
        with self.open("w", encoding=encoding) as f:
            f.write(text[:10])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", disk_full)
    again = Monitor()
    again.watch(POLICY)
    again.keep_checkpoints(path)
    again.watches[POLICY.policy_id].take(0.99, accepted=True, key="one", now=0.0)
    with caplog.at_level(logging.WARNING, logger="slotgate.monitoring"):
        await again.aclose()
    assert "No space left" in caplog.text and str(path) in caplog.text
    assert path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name, path.name + ".lock"]


async def test_a_second_process_cannot_share_a_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "decisions.jsonl.watch.json"
    first = Monitor()
    first.watch(POLICY)
    first.keep_checkpoints(path)
    second = Monitor()
    second.watch(POLICY)
    with pytest.raises(CheckpointInUse, match="held by another slotgate process") as refused:
        second.keep_checkpoints(path)
    assert isinstance(refused.value, ConfigError) and str(path) in refused.value.message
    assert refused.value.field == "log.decision_log_path"
    with pytest.raises(CheckpointInUse):  # the check a server makes before it starts
        check_unclaimed(tmp_path / "decisions.jsonl")
    await first.aclose()  # its lock goes with it: the next process may take over
    check_unclaimed(tmp_path / "decisions.jsonl")
    assert second.keep_checkpoints(path) == 1
    await second.aclose()
