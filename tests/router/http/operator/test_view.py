"""The last decisions read from the decision log's end: newest first, at most the limit, other
records and damaged lines skipped, a line cut by the tail's start skipped, no file no rows."""

from __future__ import annotations

import json
from pathlib import Path

from router.http.operator.view import last_decisions


def decision(i: int) -> str:
    return json.dumps({"type": "decision", "decision_id": f"d{i:04d}", "time": float(i),
                       "route": "fast", "answer": "a", "probability": 0.9, "threshold": 0.8,
                       "policy_id": "p@1", "latency_ms": 1.5, "text": f"message {i}"})


def test_newest_first_at_most_the_limit_skipping_other_records_and_damage(
        tmp_path: Path) -> None:
    log = tmp_path / "decisions.jsonl"
    lines = [decision(i) for i in range(30)]
    lines.insert(25, json.dumps({"type": "feedback", "decision_id": "d0001", "label": "a"}))
    lines.insert(27, "{not json")
    log.write_text("\n".join(lines) + "\n")
    rows = last_decisions(log, limit=5)
    assert [r.decision_id for r in rows] == ["d0029", "d0028", "d0027", "d0026", "d0025"]
    assert rows[0].route == "fast" and rows[0].latency_ms == 1.5


def test_a_line_cut_by_the_tails_start_is_skipped(tmp_path: Path) -> None:
    log = tmp_path / "decisions.jsonl"
    log.write_text("".join(decision(i) + "\n" for i in range(10)))
    one_line = len(decision(9)) + 1
    rows = last_decisions(log, limit=20, tail_bytes=3 * one_line - 5)
    assert [r.decision_id for r in rows] == ["d0009", "d0008"]  # d0007 begins before the tail


def test_no_log_file_no_rows(tmp_path: Path) -> None:
    assert last_decisions(tmp_path / "missing.jsonl") == []
