"""bench/guarantee's threshold choosers on synthetic calibrated confidences: MAPIE is asked for
accepted accuracy >= target (precision of "accept"), and both it and slotgate's bound keep the
promise on fresh rows; the outcome counts a violation only when accepted accuracy misses."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench import guarantee_methods as gm


def calibrated_rows(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Confidences whose accuracy is the confidence itself (perfectly calibrated)."""
    rng = np.random.default_rng(seed)
    confidence = rng.beta(6, 1, size=n)
    return confidence, rng.random(n) < confidence


@pytest.mark.parametrize("fixed_sequence", [False, True])
def test_mapie_and_slotgate_keep_the_promise_on_fresh_rows(fixed_sequence: bool) -> None:
    conf, correct = calibrated_rows(3000, seed=1)
    fresh_conf, fresh_correct = calibrated_rows(200_000, seed=2)
    scored = gm.Scored(conf, correct, fresh_conf, fresh_correct)
    mapie = gm.mapie_threshold(scored, target=0.9, delta=0.05, fixed_sequence=fixed_sequence)
    ours = gm.slotgate_threshold(scored, target=0.9, delta=0.05)
    assert mapie is not None and ours is not None
    for threshold in (mapie, ours):
        result = gm.outcome(scored, threshold, 0.9)
        assert result["accepted_accuracy"] >= 0.9 and not result["violated"]
        assert 0.0 < result["coverage"] < 1.0
    # Accepted accuracy (precision of "accept") at MAPIE's lambda, measured on the rows it saw,
    # is at least the target: the controller certified exactly that quantity.
    assert correct[conf >= mapie].mean() >= 0.9


def test_outcome_without_threshold_escalates_everything() -> None:
    conf, correct = calibrated_rows(100, seed=3)
    scored = gm.Scored(conf, correct, conf, correct)
    assert gm.outcome(scored, None, 0.9) == {"threshold": None, "coverage": 0.0,
                                             "accepted_accuracy": None, "violated": False,
                                             "tune_accepted_accuracy": None}
    missed = gm.outcome(scored, 0.0, 0.99)  # accept all: accuracy ~0.86 < 0.99
    assert missed["violated"] and missed["coverage"] == 1.0


def own_csv(banking77_dir: Path, path: Path, *, intents: int = 6, per_intent: int = 80) -> Path:
    """A user's labelled CSV with its own column names: BANKING77 rows of a few intents."""
    with (banking77_dir / "train.csv").open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    kept: dict[str, list[str]] = {}
    for row in rows:
        texts = kept.setdefault(row["category"], [])
        if len(texts) < per_intent:
            texts.append(row["text"])
    chosen = sorted(kept)[:intents]
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["utterance", "intent"])
        writer.writerows((text, name) for name in chosen for text in kept[name])
    return path


def last_json(output: str) -> dict[str, Any]:
    return json.loads(output.strip().splitlines()[-1])


def assert_sane(report: dict[str, Any], *, draws: int, targets: list[str]) -> None:
    """Every method's figures are rates over ``draws`` draws, its interval holds its rate, and
    slotgate's cross-fitted search kept a threshold in at least one draw."""
    assert report["draws"] == draws and sorted(report["targets"]) == targets
    for target, per in report["targets"].items():
        assert {"split", "cross-fitted", "MAPIE (cross-fitted rows)"} <= set(per) or (
            "cross-fitted" in per and "split" not in per), per.keys()  # --fit-once: no split
        for name, s in per.items():
            if name == "vs MAPIE":
                assert s["draws"] == draws and 0 <= s["draws_at_least_mapie"] <= draws
                continue
            rate = s["violation_rate"]
            assert rate * draws == pytest.approx(round(rate * draws)), (target, name)
            low, high = s["violation_rate_ci"]
            assert 0.0 <= low <= rate <= high <= 1.0, (target, name)
            assert 0.0 <= s["mean_coverage"] <= 1.0 and 0 <= s["draws_without_threshold"] <= draws
            accuracy = s["mean_accepted_accuracy"]
            assert accuracy is None or 0.0 <= accuracy <= 1.0
            if s["draws_without_threshold"] == draws:
                assert s["mean_coverage"] == 0.0 and rate == 0.0  # escalates all: no violation
    assert report["targets"]["0.90"]["cross-fitted"]["draws_without_threshold"] < draws


def test_any_labelled_csv_runs_and_saved_scores_rerun_without_fitting(
        tmp_path: Path, banking77_dir: Path, capsys: pytest.CaptureFixture[str],
        _results_elsewhere: Path) -> None:
    """`python -m bench.guarantee --data F.csv --text-column --label-column` on a user's own
    file writes under bench/results/local/, never over the recorded guarantee.json;
    --save-scores / --scores re-choose thresholds with no fit."""
    from bench import guarantee

    data = own_csv(banking77_dir, tmp_path / "mine.csv")
    targets = ["--targets", "0.9,0.95"]
    guarantee.main(["--data", str(data), "--text-column", "utterance", "--label-column",
                    "intent", "--fit-once", "--draws", "3",
                    "--labelled", "200", "--save-scores", str(tmp_path / "s.npz"), *targets])
    fitted = last_json(capsys.readouterr().out)
    assert not (_results_elsewhere / "guarantee.json").exists()
    report = json.loads((_results_elsewhere / "local" / "guarantee.json").read_text())
    assert report["pool_rows"] == 480 and report["classes"] == 6
    assert report["labelled_rows"] == 200 and str(data) in report["data"]
    assert_sane(report, draws=3, targets=["0.90", "0.95"])
    assert set(fitted) == {"0.90", "0.95"} and "cross-fitted" in fitted["0.90"]
    guarantee.main(["--scores", str(tmp_path / "s.npz"), *targets,
                    "--out", str(tmp_path / "again.json")])
    again = last_json(capsys.readouterr().out)
    for target, per in fitted.items():
        for name, s in per.items():  # held-back confidences come back to 3 significant digits
            assert again[target][name]["mean_coverage"] == pytest.approx(s["mean_coverage"],
                                                                          abs=0.01)


@pytest.mark.parametrize(("model", "named"), [("embeddings", "wordllama"), ("tfidf", "TF-IDF")])
def test_the_documented_runs_refit_every_draw_and_report_every_method(
        tmp_path: Path, banking77_dir: Path, model: str, named: str) -> None:
    """The README's runs (split and cross-fitted fits on every draw, MAPIE beside them) at two
    draws of 200 labelled rows."""
    from bench import guarantee

    data = own_csv(banking77_dir, tmp_path / "mine.csv")
    out = tmp_path / "report.json"
    guarantee.main(["--data", str(data), "--text-column", "utterance", "--label-column",
                    "intent", "--model", model, "--draws", "2", "--labelled", "200",
                    "--targets", "0.9", "--out", str(out)])
    report = json.loads(out.read_text())
    assert named in report["fast_model"] and report["fits"].startswith("every draw")
    assert_sane(report, draws=2, targets=["0.90"])
    assert {"split", "naive (split rows)", "MAPIE (split rows)"} <= set(report["targets"]["0.90"])


def test_a_missing_column_is_refused_naming_it(tmp_path: Path, banking77_dir: Path) -> None:
    from bench import guarantee

    data = own_csv(banking77_dir, tmp_path / "mine.csv")
    with pytest.raises(SystemExit, match="label"):
        guarantee.main(["--data", str(data), "--text-column", "utterance", "--model", "tfidf",
                        "--fit-once", "--draws", "1", "--out", str(tmp_path / "r.json")])
