"""`slotgate monitor` says what it shows: the accept share's window is the decisions it covers,
the drift panel's alarm line is labelled with the level it is drawn at, and no PNG is written
unless --plot names one."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from router.cli.app import app
from router.cli.monitor import write_plot
from router.monitoring.replay import replay_log
from tests.router.monitoring.conftest import watched_policy
from tests.router.monitoring.test_cli import write_log


def invoke(*args: object) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})


def test_the_accept_share_names_the_decisions_it_covers_and_no_plot_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = watched_policy()
    policy.write(tmp_path / "policy.json")
    write_log(tmp_path / "log.jsonl", policy.policy_id, n=600)
    monkeypatch.chdir(tmp_path)
    result = invoke("monitor", "--log", "log.jsonl", "--policy", "policy.json")
    assert result.exit_code == 0, result.output
    assert "accept share: last 600 / tuning rows" in result.stdout
    assert "last 1000" not in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.jsonl", "policy.json"]


def test_the_drift_alarm_line_is_labelled_with_its_level(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import calibration.plots

    policy = watched_policy(alarm_alpha=0.05)
    write_log(tmp_path / "log.jsonl", policy.policy_id, n=600)
    [series] = replay_log(tmp_path / "log.jsonl", [policy])
    drawn: list[Any] = []
    monkeypatch.setattr(calibration.plots, "save_figure",
                        lambda figure, path: drawn.append(figure) or path)
    write_plot(tmp_path / "m.png", [series])
    drift_ax = drawn[0].axes[2]
    [line] = [line for line in drift_ax.get_lines() if line.get_label().startswith("alarm level")]
    level = line.get_ydata()[0]
    assert level == pytest.approx(math.log(2 / 0.05))
    assert line.get_label() == f"alarm level log(2/alarm_alpha) = {level:.2f}"
