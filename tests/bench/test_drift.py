"""bench/drift.py: the shifted stream is built as documented, and (long) the quick run through
the live proxy meets the issue's targets."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.drift import delay, main, shifted_order


def test_shifted_stream_has_unshifted_rows_first_and_no_row_twice() -> None:
    order = shifted_order(1000, 1500, n_pre=200, n_post=600, share=0.3, seed=1)
    assert len(order) == 800 == len(set(order.tolist()))
    assert np.all(order[:200] < 1000)  # before the shift: the unshifted pool only
    assert abs(np.mean(order[200:] >= 1000) - 0.3) < 0.06
    with pytest.raises(ValueError, match="too few rows"):
        shifted_order(100, 150, n_pre=50, n_post=100, share=0.9, seed=0)
    assert delay(None, 200, 600) == 601 and delay(150, 200, 600) == 0 and delay(249, 200, 600) == 50


@pytest.mark.bench_smoke
def test_quick_run_meets_the_targets(tmp_path: Path, banking77_dir: Path) -> None:
    result = main(["--quick", "--data", str(banking77_dir), "--work", str(tmp_path),
                   "--out", str(tmp_path / "drift.json")])
    assert result["replays"] >= 100 and result["false_alarm_rate"] <= 0.05
    assert result["detection_delay_median"] <= 2000
    assert result["accepted_accuracy_after_shift_no_action"] < result["target"]
    # One live run (escalate_all after the alarm). The one-sided watch of issue 19.2 never
    # alarms on a sharper served model or repeated confident traffic, and pays for it here: it
    # detects this shift later (quick live run: 333 rows, was 172 with the two-sided test), so
    # 28% of the wrong answers still get through (21% in the full run), not the old 25%. The
    # 25% bar is now bench.watch's novel_25 target (tests/bench/test_watch.py).
    assert (result["wrong_accepted_after_shift_with_action"]
            <= 0.35 * result["wrong_accepted_after_shift_no_action"])
    assert result["mapie_detection_delay_median"] >= result["detection_delay_median"]
    assert result["live_alarm"] is not None and result["live_all_answers_valid"]
    assert (tmp_path / "drift.json").is_file()
