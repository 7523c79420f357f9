"""The policy file: JSON round trip, a runnable policy, and load errors that name the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from calibration.calibrators import make_calibrator
from policies.file import POLICY_VERSION, PolicyFile, PolicyFileError, load_policy
from policies.policy import Policy
from policies.rules import ThresholdRule
from policies.scope import Question, scope_signature
from policies.types import OptionScores


def make_policy(**overrides: Any) -> PolicyFile:
    rng = np.random.default_rng(0)
    proba = rng.dirichlet(np.ones(3) * 0.5, size=200)
    y_true = np.array([rng.choice(3, p=p) for p in proba])
    calibrator = make_calibrator("temperature").fit(proba, y_true)
    fields: dict[str, Any] = {
        "name": "intents", "backend_fingerprint": "abc123", "calibrator": calibrator.to_dict(),
        "rule": ThresholdRule(0.8).to_dict(), "threshold": 0.8, "target_accuracy": 0.95,
        "delta": 0.05, "bound": 0.951, "coverage": 0.6, "n_tune": 100, "n_calibration": 100,
        "data_hash": "0" * 64,
    }
    fields.update(overrides)
    return PolicyFile(**fields)


def test_round_trip_keeps_every_field_and_the_decisions(tmp_path: Path) -> None:
    policy = make_policy()
    path = tmp_path / "policy.json"
    policy.write(path)
    loaded = load_policy(path)
    assert loaded == policy
    assert loaded.policy_id == policy.policy_id and loaded.policy_id.startswith("intents@")
    scores = OptionScores(("a", "b", "c"), (0.7, 0.2, 0.1))
    assert Policy.from_file(loaded).decide(scores) == Policy.from_file(
        policy).decide(scores)


def test_decide_answers_the_raw_argmax_with_its_calibrated_probability() -> None:
    runtime = Policy.from_file(make_policy())
    scores = OptionScores(("a", "b", "c"), (0.5, 0.3, 0.2))
    verdict, calibrated = runtime.decide(scores)
    assert verdict.index == 0
    assert verdict.probability == pytest.approx(calibrated[0])
    assert sum(calibrated) == pytest.approx(1.0)
    assert verdict.accept == (calibrated[0] >= 0.8)


def write(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


@pytest.mark.parametrize(("change", "field"), [
    ({"version": POLICY_VERSION + 1}, "version"),
    ({"delta": 1.5}, "delta"),
    ({"calibrator": {"kind": "magic"}}, "calibrator"),
    ({"rule": {"kind": "threshold", "threshold": 3}}, "rule.threshold.threshold"),
    ({"calibrator": {"kind": "isotonic", "state": {"x_thresholds_": [0.1, 0.5],
                                                   "y_thresholds_": [0.2]}}},
     "calibrator.isotonic.state"),
    ({"threshold": 0.5}, "threshold"),  # a top-level copy that disagrees with the rule
    ({"data_hash": "not-a-hash"}, "data_hash"),
    ({"surprise": 1}, "surprise"),
    ({"audit_rate": 1.5}, "audit_rate"),
    ({"on_alarm": "panic"}, "on_alarm"),
    ({"reference": {"n": 2, "accept_share": 0.5, "confidence": [0.2, 1.7]}}, "reference.confidence"),
])
def test_load_names_the_bad_field(tmp_path: Path, change: dict[str, Any], field: str) -> None:
    data = json.loads(make_policy().model_dump_json())
    data.update(change)
    with pytest.raises(PolicyFileError) as info:
        load_policy(write(tmp_path, data))
    assert info.value.field == field
    assert f"'{field}'" in str(info.value) and "policy.json" in str(info.value)


def test_missing_field_is_named(tmp_path: Path) -> None:
    data = json.loads(make_policy().model_dump_json())
    del data["target_accuracy"]
    with pytest.raises(PolicyFileError, match="'target_accuracy'"):
        load_policy(write(tmp_path, data))


@pytest.mark.parametrize(("text", "message"), [
    ("{not json", "not a readable JSON file"),
    ("[1, 2]", "JSON object"),
    ('{"format": "other"}', "'format'"),
])
def test_unreadable_files_are_refused(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(PolicyFileError, match=message):
        load_policy(write(tmp_path, text))


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(PolicyFileError, match="nope.json: policy file not found"):
        load_policy(tmp_path / "nope.json")


def test_monitoring_fields_default_for_older_files_and_leave_the_policy_id_alone(
        tmp_path: Path) -> None:
    policy = make_policy()
    data = json.loads(policy.model_dump_json())
    for field in ("audit_rate", "on_alarm", "alarm_alpha", "reference"):
        del data[field]  # a file written before monitoring existed
    old = load_policy(write(tmp_path, data))
    default_action = PolicyFile.model_fields["on_alarm"].default
    assert (old.audit_rate, old.on_alarm, old.reference) == (0.0, default_action, None)
    watched = make_policy(audit_rate=0.1, on_alarm="alert_only",
                          reference={"n": 2, "accept_share": 0.5, "confidence": [0.4, 0.9]})
    assert watched.policy_id == old.policy_id == policy.policy_id
    retuned = make_policy(threshold=0.7, rule=ThresholdRule(0.7).to_dict())
    assert retuned.policy_id != policy.policy_id  # a re-tune is a new policy


VERSION_1 = {
    "format": "slotgate/policy", "version": 1, "name": "intents", "backend_fingerprint": "abc123",
    "calibrator": {"kind": "temperature", "state": {"temperature_": 1.5},
                   "options": {"min_temperature": 0.01, "max_temperature": 100.0}},
    "rule": {"kind": "budget", "max_escalation": 0.2, "window": 500,
             "base": {"kind": "threshold", "threshold": 0.8, "per_option": {}}},
    "threshold": 0.8, "target_accuracy": 0.95, "delta": 0.05, "bound": 0.951, "coverage": 0.6,
    "n_tune": 100, "n_calibration": 100, "data_hash": "0" * 64,
    "created_at": "2026-11-01T00:00:00Z", "options": ["a", "b", "c"],
}


# A version 2 file: the threshold in the rule only, no recorded id layout.
VERSION_2 = {key: value for key, value in VERSION_1.items() if key != "threshold"} | {"version": 2}
# A version 3 file: its id layout recorded, its question not (scoped by its options alone).
VERSION_3 = VERSION_2 | {"version": 3, "id_layout": "v1",
                         "signature": "scope-v1:" + "0" * 64}


@pytest.mark.parametrize("data", [VERSION_1, VERSION_2, VERSION_3],
                         ids=["version 1", "version 2", "version 3"])
def test_older_files_are_upgraded_on_load_and_keep_their_id(tmp_path: Path,
                                                            data: dict[str, Any]) -> None:
    policy = load_policy(write(tmp_path, data))
    # The id slotgate gave this file when it was written; alarms are keyed by it.
    ids = {1: "intents@dbc708b84ab7", 2: "intents@dbc708b84ab7", 3: "intents@7b4469c0eae3"}
    assert policy.policy_id == ids[data["version"]]
    assert policy.threshold == 0.8 and policy.version == POLICY_VERSION == 4
    # No question recorded: it can be evaluated, the router refuses to serve it.
    assert policy.question is None and policy.question_unrecorded
    rewritten = tmp_path / "again.json"
    policy.write(rewritten)
    stored = json.loads(rewritten.read_text())
    assert "threshold" not in stored  # stored once, in the rule
    assert stored["version"] == 4 and stored["id_layout"] == "v1"  # how its id is hashed
    assert stored["question"] is None
    assert load_policy(rewritten).policy_id == policy.policy_id
    runnable = Policy.from_file(rewritten)
    assert runnable.policy_id == policy.policy_id and runnable.file_ == policy
    assert runnable.params_.budget_window == 500 and runnable.params_.max_escalation is None
    window = runnable.escalation_window()
    assert window is not None  # the budget rule's: the caller owns it


def test_typed_parts_run_without_a_second_build() -> None:
    policy = make_policy()
    assert policy.calibrator.kind == "temperature" and policy.rule.kind == "threshold"
    runtime = Policy.from_file(policy)
    assert runtime.rule_.to_dict() == policy.rule.model_dump()
    assert runtime.calibrator_.to_dict() == policy.calibrator.model_dump()


def recorded(question: Question, options: list[str], **overrides: Any) -> PolicyFile:
    return make_policy(options=options, question=question.as_dict(),
                       signature=scope_signature(options, question), **overrides)


def test_a_recorded_question_round_trips_and_names_the_scope(tmp_path: Path) -> None:
    question = Question.asked("intent", instructions="Which intent does it express?")
    policy = recorded(question, ["a", "b", "c"])
    policy.write(tmp_path / "p.json")
    loaded = load_policy(tmp_path / "p.json")
    assert loaded == policy and not loaded.question_unrecorded
    assert loaded.question is not None and loaded.question.question() == question
    # Another question, the same options: another policy id.
    other = recorded(Question.asked("is_french"), ["a", "b", "c"])
    assert other.policy_id != policy.policy_id


def test_a_question_that_disagrees_with_the_signature_is_refused(tmp_path: Path) -> None:
    data = json.loads(recorded(Question.asked("intent"), ["a", "b", "c"]).model_dump_json())
    data["question"]["instructions"] = "Which intent does it NOT express?"  # hand-edited
    with pytest.raises(PolicyFileError, match="signature") as info:
        load_policy(write(tmp_path, data))
    assert info.value.field == "signature"
    data = json.loads(recorded(Question.asked("intent"), ["a", "b", "c"]).model_dump_json())
    data["question"] = None  # a question's scope without the question
    with pytest.raises(PolicyFileError, match="question") as info:
        load_policy(write(tmp_path, data))
    assert info.value.field == "question"
