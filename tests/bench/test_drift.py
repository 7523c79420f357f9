"""bench/drift.py: the shifted stream is built as documented, and a tiny replay stays quiet
unshifted and detects a shift (the BANKING77 run through the live proxy: `python -m bench.drift
--quick`, docs/monitoring.md)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bench.drift import delay, main, mapie_alarm_row, replay, shifted_order
from tests.bench.test_watch import world


def test_shifted_stream_has_unshifted_rows_first_and_no_row_twice() -> None:
    order = shifted_order(1000, 1500, n_pre=200, n_post=600, share=0.3, seed=1)
    assert len(order) == 800 == len(set(order.tolist()))
    assert np.all(order[:200] < 1000)  # before the shift: the unshifted pool only
    assert abs(np.mean(order[200:] >= 1000) - 0.3) < 0.06
    with pytest.raises(ValueError, match="too few rows"):
        shifted_order(100, 150, n_pre=50, n_post=100, share=0.9, seed=0)
    assert delay(None, 200, 600) == 601 and delay(150, 200, 600) == 0 and delay(249, 200, 600) == 50


def test_a_tiny_replay_has_no_false_alarm_unshifted_and_detects_the_shift() -> None:
    """What the quick run checks on BANKING77 (`python -m bench.drift --quick`), on the small
    world of tests/bench/test_watch.py: unshifted replays stay quiet, shifted ones alarm, and
    MAPIE's RiskMonitoring on the same audit labels is no faster."""
    rows, settings, n_known = world()
    quiet = [replay(rows, np.random.default_rng(r).permutation(n_known)[:2000],
                    replace(settings, seed=r)) for r in range(10)]
    assert sum(run["alarm_row"] is not None for run in quiet) <= 1  # alpha 0.05
    delays, mapie = [], []
    for r in range(10):
        order = shifted_order(n_known, len(rows.texts), n_pre=500, n_post=1500, share=0.3,
                              seed=r)
        run = replay(rows, order, replace(settings, seed=r))
        delays.append(delay(run["alarm_row"], 500, 1500))
        mapie.append(delay(mapie_alarm_row(run, rows, order, 0.95), 500, 1500))
    # The weighted test's stakes are sized for breaks of 1 to 4 points (``WEIGHTED_GAPS``):
    # a 30% shift takes it some 850 decisions (853.5 here).
    assert np.median(delays) <= 900 and np.median(mapie) >= np.median(delays)


@pytest.mark.bench_smoke
def test_quick_run_meets_the_targets(tmp_path: Path, banking77_dir: Path) -> None:
    result = main(["--quick", "--data", str(banking77_dir), "--work", str(tmp_path),
                   "--out", str(tmp_path / "drift.json")])
    assert result["replays"] >= 100 and result["false_alarm_rate"] <= 0.05
    assert result["accepted_accuracy_after_shift_no_action"] < result["target"]
    # escalate_all escalates at the traffic detector's trip (no alarm is needed for it)
    assert result["escalation_delay_median"] <= 200 and result["false_escalation_rate"] <= 0.05
    # One live run: at most a quarter of the wrong answers served after the shift get through.
    assert (result["wrong_accepted_after_shift_with_action"]
            <= 0.25 * result["wrong_accepted_after_shift_no_action"])
    assert result["live_traffic_trip_delay"] is not None and result["live_all_answers_valid"]
    assert (tmp_path / "drift.json").is_file()
