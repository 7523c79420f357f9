"""``slotgate tune --cost-share``: the promise is written into the policy file and shown beside
the accuracy promise, and ``slotgate eval`` counts the blocks over its share; bad values and a pair no rule keeps exit 2 naming the flag, writing
nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from policies.evaluation import block_shares
from policies.file import load_policy
from router.cli.app import app
from tests.router.cli.test_tune_command import synthetic_rows, write_jsonl


def invoke(*args: object) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args])


def test_tune_writes_and_shows_the_cost_promise(tmp_path: Path) -> None:
    preds = write_jsonl(tmp_path / "p.jsonl", synthetic_rows(2000))
    out = tmp_path / "policy.json"
    result = invoke("tune", "--question", "q", "--preds", preds, "--out", out,
                    "--target-accuracy", 0.8, "--cost-share", 0.5, "--cost-block", 300,
                    "--cost-delta", 0.1, "--on-cost-alarm", "serve_unverified")
    assert result.exit_code == 0, result.stderr
    policy = load_policy(out)
    cost = policy.cost_promise
    assert cost is not None and (cost.share, cost.block, cost.delta) == (0.5, 300, 0.1)
    assert cost.block_bound <= 0.1 and policy.on_cost_alarm == "serve_unverified"
    assert "slow share <= 0.5 in each block of 300" in result.stdout
    assert "coverage: both promises / accuracy alone" in result.stdout
    shown = invoke("eval", "--preds", preds, "--policy", out)
    assert shown.exit_code == 0, shown.stderr
    assert "blocks of 300 rows (in file order) over the slow share 0.5" in shown.stdout
    report = json.loads(invoke("eval", "--preds", preds, "--policy", out, "--json").stdout)
    blocks = report["cost_promise"]
    assert (blocks["block"], blocks["blocks"]) == (300, 6)  # 2,000 rows: six whole blocks
    assert 0 <= blocks["blocks_over"] <= 6 and blocks["worst_block_share"] >= blocks["slow_share"] - 0.05


def test_block_shares_cut_the_rows_in_order_and_count_the_blocks_over_the_share() -> None:
    escalated = np.array([True] * 6 + [False] * 4 + [True, False] * 5 + [True] * 3)
    got = block_shares(escalated, share=0.5, block=10)
    assert (got["blocks"], got["blocks_over"], got["worst_block_share"]) == (2, 1, 0.6)
    assert got["slow_share"] == pytest.approx(14 / 23)
    assert block_shares(escalated[:5], share=0.5, block=10)["worst_block_share"] is None


@pytest.mark.parametrize(("flag", "value"), [("--cost-share", "1.5"), ("--cost-block", "0"),
                                             ("--cost-delta", "0"),
                                             ("--on-cost-alarm", "panic")])
def test_bad_cost_flags_name_the_flag(tmp_path: Path, flag: str, value: str) -> None:
    preds = write_jsonl(tmp_path / "p.jsonl", synthetic_rows(40))
    out = tmp_path / "x.json"
    extra = [] if flag == "--cost-share" else ["--cost-share", "0.5"]
    result = invoke("tune", "--question", "q", "--preds", preds, "--out", out, *extra,
                    flag, value)
    assert result.exit_code == 2 and flag in result.stderr and not out.exists()


def test_a_pair_no_rule_keeps_is_refused_naming_the_flag(tmp_path: Path) -> None:
    preds = write_jsonl(tmp_path / "p.jsonl", synthetic_rows(1000))
    out = tmp_path / "x.json"
    result = invoke("tune", "--question", "q", "--preds", preds, "--out", out,
                    "--target-accuracy", 0.95, "--cost-share", 0.05)
    assert result.exit_code == 2 and "--cost-share" in result.stderr
    assert "cost_delta 0.05" in result.stderr and not out.exists()


@pytest.mark.parametrize(("flag", "value"), [("--cost-block", "500"), ("--cost-delta", "0.1")])
def test_a_block_or_delta_without_a_share_is_refused(tmp_path: Path, flag: str,
                                                     value: str) -> None:
    preds = write_jsonl(tmp_path / "p.jsonl", synthetic_rows(40))
    out = tmp_path / "x.json"
    result = invoke("tune", "--question", "q", "--preds", preds, "--out", out, flag, value)
    assert result.exit_code == 2 and f"{flag}: belongs to a cost promise" in result.stderr
    assert not out.exists()
