"""bench/watch.py: its streams are built as documented (no row twice where it says so, repeats
where it says so, whole intent blocks, the novel share), a replay counts wrong answers and slow
calls under each action, and (long) the quick run meets the issue's targets."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from bench.drift_data import Scored
from bench.watch import in_blocks, main, novel_order, replay, with_popular, with_repeats
from router.monitoring.watch import WatchSettings


def scored(n: int, *, confidence: float = 0.99, correct: bool = True,
           prefix: str = "t") -> Scored:
    return Scored([f"{prefix}{i}" for i in range(n)], [f"l{i % 7}" for i in range(n)],
                  [f"l{i % 7}" for i in range(n)], np.full(n, confidence),
                  np.ones(n, dtype=bool), np.full(n, correct))


def test_streams_have_the_documented_shape() -> None:
    rng = np.random.default_rng(0)
    rows = scored(500)
    order = with_repeats(rng, rows, n=300, repeats=100)
    values, counts = np.unique(order, return_counts=True)
    assert len(order) == 300 and counts.max() == 100 and len(values) == 201
    popular = with_popular(rng, rows, n=400, share=0.2)
    assert abs(np.bincount(popular).max() / 400 - 0.2) < 0.06
    blocks = in_blocks(rng, rows.labels)
    labels = [rows.labels[i] for i in blocks]
    assert sum(a != b for a, b in itertools.pairwise(labels)) == 6  # 7 blocks
    mixed = novel_order(rng, 3000, 1000, 500, np.full(2000, 0.25))
    assert len(set(mixed.tolist())) == 2500 and np.all(mixed[:500] < 3000)
    assert abs(np.mean(mixed[500:] >= 3000) - 0.25) < 0.04


def test_a_replay_counts_wrong_answers_and_slow_calls_per_action() -> None:
    reference = tuple(np.random.default_rng(1).uniform(0.9, 1.0, 1000).round(4))
    settings = WatchSettings("p", 0.95, audit_rate=0.1, reference=reference)
    rows = scored(3000, confidence=0.5, correct=False, prefix="u")  # after row 500: unsure and wrong
    good = scored(500)
    both = Scored(good.texts + rows.texts, good.labels + rows.labels,
                  good.answers + rows.answers, np.concatenate([good.confidence, rows.confidence]),
                  np.concatenate([good.accepted, rows.accepted]),
                  np.concatenate([good.correct, rows.correct]))
    order = np.arange(3500)
    none = replay(both, order, settings, "alert_only", 500)
    ladder = replay(both, order, settings, "audit_then_escalate", 500)
    escalate = replay(both, order, settings, "escalate_all", 500)
    assert none["wrong_after"] == 3000 and none["alarm_kind"] is not None
    assert escalate["wrong_after"] <= ladder["wrong_after"] < none["wrong_after"]
    assert ladder["escalated_from"] is not None and escalate["slow_after"] > none["slow_after"]


@pytest.mark.bench_smoke
@pytest.mark.timeout(1200)  # three models trained with the CLI, then 20 replays of each scenario
def test_quick_run_meets_the_targets(tmp_path: Path, banking77_dir: Path) -> None:
    result = main(["--quick", "--data", str(banking77_dir), "--work", str(tmp_path),
                   "--out", str(tmp_path / "watch.json")])
    for name, scenario in result.items():
        if scenario["kind"] == "benign":
            assert scenario["false_alarm_rate"] <= 0.1, name  # 20 replays: 0.05 +- noise
    novel = result["novel_25"]
    assert novel["detection_delay_median"] <= 2000
    assert (novel["wrong_accepted_after_shift_with_audit_then_escalate"]
            <= 0.25 * novel["wrong_accepted_after_shift_no_action"])
