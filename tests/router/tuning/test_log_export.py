"""`slotgate export-log`: decision log + feedback -> predictions file -> `slotgate tune` reads it;
``export_predictions`` itself (router/tuning/log_export.py)."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from policies.scope import Question, scope_signature
from router.cli.app import app
from router.settings import LogSettings, Settings
from router.store.decision_log import JsonlDecisionLog
from router.tuning.log_export import export_predictions
from router.tuning.predictions import PredictionsError, read_predictions

OPTIONS = ["yes", "no"]


def write_log(path: Path, n: int) -> None:
    """n logged decisions (a fixed seed) of which every other one got feedback."""
    rng = random.Random(7)

    async def fill() -> None:
        log = JsonlDecisionLog(path)
        for i in range(n):
            p = round(rng.uniform(0.5, 1.0), 4)
            await log.append({"decision_id": f"d{i}", "options": OPTIONS, "proba": [p, 1 - p],
                              "signature": "sig", "fingerprint": "fp", "text": f"t{i}"})
            if i % 2 == 0:
                await log.add_feedback(f"d{i}", "yes" if rng.random() < p else "no", trusted=True)
        await log.aclose()

    asyncio.run(fill())


def test_export_log_writes_predictions_from_the_configured_log(tmp_path: Path) -> None:
    log = tmp_path / "var" / "decisions.jsonl"
    write_log(log, 40)
    config = tmp_path / "slotgate.yaml"
    config.write_text(f"log:\n  decision_log_path: {log}\n")
    out = tmp_path / "preds.jsonl"
    result = CliRunner().invoke(app, ["export-log", "--config", str(config), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "wrote 40 predictions" in result.output
    preds = read_predictions(out)
    assert len(preds.ids) == 40 and int(preds.labelled.sum()) == 20

    labelled = tmp_path / "labelled.jsonl"
    result = CliRunner().invoke(app, ["export-log", "--log", str(log), "--out", str(labelled),
                                      "--labelled-only"])
    assert result.exit_code == 0 and "wrote 20 predictions" in result.output


def test_export_log_bad_input_exits_2_naming_the_problem(tmp_path: Path) -> None:
    out = tmp_path / "p.jsonl"
    result = CliRunner().invoke(app, ["export-log", "--log", str(tmp_path / "none.jsonl"),
                                      "--out", str(out)])
    assert result.exit_code == 2 and "file not found" in result.output and not out.exists()
    result = CliRunner().invoke(app, ["export-log", "--log", str(tmp_path / "none.jsonl"),
                                      "--out", str(tmp_path / "missing" / "p.jsonl")])
    assert result.exit_code == 2 and "--out" in result.output


def test_feedback_export_tune_round_trip(tmp_path: Path) -> None:
    """Production traffic recalibrates: the exported labels tune a policy for the logged question."""
    import json

    log = tmp_path / "decisions.jsonl"
    write_log(log, 1200)
    preds = tmp_path / "p.jsonl"
    runner = CliRunner()
    result = runner.invoke(app, ["export-log", "--log", str(log), "--out", str(preds),
                                 "--labelled-only"])
    assert result.exit_code == 0, result.output
    policy = tmp_path / "policy.json"
    result = runner.invoke(app, ["tune", "--preds", str(preds), "--out", str(policy),
                                 "--target-accuracy", "0.7"])
    assert result.exit_code == 0, result.output
    tuned = json.loads(policy.read_text())
    assert tuned["signature"] == "sig" and tuned["backend_fingerprint"] == "fp"
    assert tuned["n_tune"] + tuned["n_calibration"] == 600 and tuned["bound"] >= 0.7


def test_audit_labels_fill_in_where_no_human_label_exists(tmp_path: Path) -> None:
    log_path = tmp_path / "decisions.jsonl"
    write_log(log_path, 10)  # feedback on d0, d2, ..., d8
    records = [json.loads(line) for line in log_path.read_text().splitlines()]
    human = {r["decision_id"]: r["label"] for r in records if r["type"] == "feedback"}
    other = {"yes": "no", "no": "yes"}
    audit = {"d0": other[human["d0"]], "d1": "no", "d2": other[human["d2"]], "d3": "yes"}

    async def write_audits() -> None:
        log = JsonlDecisionLog(log_path)
        for decision_id, label in audit.items():
            await log.add_event({"type": "audit", "decision_id": decision_id, "label": label,
                                 "policy_id": "p@1"})
        await log.aclose()

    asyncio.run(write_audits())
    out = tmp_path / "preds.jsonl"
    result = CliRunner().invoke(app, ["export-log", "--log", str(log_path), "--out", str(out),
                                      "--audit-labels", "--labelled-only"])
    assert result.exit_code == 0 and "wrote 7 predictions" in result.output, result.output
    preds = read_predictions(out)
    labels = dict(zip(preds.ids, preds.labels, strict=True))
    assert (labels["d1"], labels["d3"]) == ("no", "yes")  # from the audits
    assert (labels["d0"], labels["d2"]) == (human["d0"], human["d2"])  # the humans' win
    plain = tmp_path / "plain.jsonl"
    result = CliRunner().invoke(app, ["export-log", "--log", str(log_path), "--out", str(plain),
                                      "--labelled-only"])
    assert "wrote 5 predictions" in result.output  # audits are not labels unless asked


INTENTS = ["lost_card", "card_arrival", "exchange_rate"]


def logged(i: int, *, proba: list[float] | None = None, signature: str = "sig-a",
           options: list[str] | None = None) -> dict[str, Any]:
    """A decision record as the service logs it."""
    return {"decision_id": f"d{i}", "time": 1.0 + i, "namespace": "default",
            "signature": signature, "fingerprint": "fp", "options": options or INTENTS,
            "proba": proba if proba is not None else [0.7, 0.2, 0.1], "text": f"message {i}",
            "answer": "lost_card", "route": "fast", "policy_id": "p@1", "escalated": False}


async def test_export_joins_feedback_into_predictions(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    log = JsonlDecisionLog(path)
    await log.append(logged(0, proba=[0.6, 0.3, 0.1]))
    await log.append(logged(1, proba=[0.1, 0.8, 0.1]))
    await log.append(logged(2))
    await log.append(logged(3) | {"proba": None, "route": "slow"})  # no fast read: left out
    await log.add_feedback("d0", "card_arrival", trusted=True)
    await log.add_feedback("d0", "exchange_rate", trusted=True)  # a correction: the latest label wins
    await log.add_feedback("d1", "card_arrival", trusted=True)
    await log.aclose()
    out = tmp_path / "out" / "preds.jsonl"
    settings = Settings(log=LogSettings(decision_log_path=path))
    assert export_predictions(settings, out) == 3
    preds = read_predictions(out)
    assert preds.ids == ["d0", "d1", "d2"] and preds.options == tuple(INTENTS)
    assert preds.labels == ["exchange_rate", "card_arrival", None]
    assert preds.y_true.tolist() == [2, 1, -1]
    assert preds.proba[0].tolist() == [0.6, 0.3, 0.1]
    assert preds.signatures == ["sig-a"] * 3 and preds.fingerprints == ["fp"] * 3
    assert export_predictions(path, out, labelled_only=True) == 2


def logged_questions(path: Path) -> None:
    """A log of two questions: three decisions over the intents, one yes/no."""

    async def fill() -> None:
        log = JsonlDecisionLog(path)
        for i in range(3):
            await log.append(logged(i) | {"question_id": "intent"})
        await log.append(logged(3, signature="sig-b", options=["yes", "no"], proba=[0.9, 0.1])
                         | {"question_id": "angry"})
        await log.aclose()

    asyncio.run(fill())


def test_export_of_several_questions_names_them_as_policy_files_do(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    logged_questions(path)
    intent = scope_signature(INTENTS, Question.asked("intent"))
    angry = scope_signature(["yes", "no"], Question.asked("angry"))
    with pytest.raises(PredictionsError) as info:
        export_predictions(path, tmp_path / "p.jsonl")
    message = str(info.value)
    assert info.value.field == "signature" and f"{intent} (question 'intent' over 3" in message
    assert angry in message and "sig-a" not in message
    # Each listed signature (what `slotgate tune --question ID` writes) or the logged request's
    # own exports its question.
    out = tmp_path / "p.jsonl"
    assert export_predictions(path, out, signature=angry) == 1
    assert read_predictions(out).options == ("yes", "no")
    assert read_predictions(out).signatures == ["sig-b"]  # the one logged question
    assert export_predictions(path, out, signature=intent) == 3
    assert export_predictions(path, out, signature="sig-a") == 3
    with pytest.raises(PredictionsError, match="no logged decision answers scope-v2:"):
        export_predictions(path, out, signature=angry + "0")


def test_export_log_as_written_exports_the_default_policys_question(tmp_path: Path) -> None:
    """`slotgate export-log --out prod.jsonl` with ./slotgate.yaml naming a tuned default policy
    and a log of two questions: that policy's question is exported, the other one named."""
    from tests.router.routing.test_registry import policy_file

    log = tmp_path / "d.jsonl"
    logged_questions(log)
    policy_path = tmp_path / "policy.json"
    policy_file("banking77", options=tuple(INTENTS), question=Question.asked("intent")
                ).write(policy_path)
    config = tmp_path / "slotgate.yaml"
    config.write_text(f"log:\n  decision_log_path: {log}\npolicy:\n  files: [{policy_path}]\n"
                      "  default: banking77\n")
    out = tmp_path / "prod.jsonl"
    result = CliRunner().invoke(app, ["export-log", "--config", str(config), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "wrote 3 predictions" in result.output
    assert "the default policy 'banking77' answers it" in result.output
    assert scope_signature(["yes", "no"], Question.asked("angry")) in result.output
    assert read_predictions(out).options == tuple(INTENTS)
    policy_path.unlink()  # no default policy: the choice is the person's, the error lists it
    result = CliRunner().invoke(app, ["export-log", "--config", str(config), "--out", str(out)])
    assert result.exit_code == 2 and "choose one with --signature: scope-v2:" in result.output


async def test_the_redis_stream_is_read_whole_in_chunks(redis_url: str, tmp_path: Path) -> None:
    from router.store.log_reader import read_stream
    from router.store.redis_log import RedisStreamDecisionLog

    log = RedisStreamDecisionLog(redis_url, "s", jsonl=tmp_path / "d.jsonl")
    for i in range(5):
        await log.append({"decision_id": f"d{i}", "options": OPTIONS, "proba": [0.6, 0.4],
                          "signature": "sig", "answer": "yes"})
    await log.add_feedback("d3", "no", trusted=True)
    assert await log.flush()
    await log.aclose()
    records = list(read_stream(redis_url, "s", chunk=2))
    assert [(r.type, r.decision_id) for r in records] == [  # type: ignore[union-attr]
        *(("decision", f"d{i}") for i in range(5)), ("feedback", "d3")]
    out = tmp_path / "p.jsonl"
    assert export_predictions([], out, redis_stream=(redis_url, "s"), labelled_only=True) == 1
    assert read_predictions(out).labels == ["no"]
