"""The one reader of decision logs: typed records back, damaged lines skipped and counted with
one summary warning, deep nesting refused without recursion, labels joined by one rule and a
decision repeated counted once."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from router.store.log_join import LabelJoin, alarms, distinct_decisions
from router.store.log_reader import DamagedRecord, ReadCounts, parse_record, read_log
from router.store.records import (
    AlarmRecord,
    AuditRecord,
    DecisionRecord,
    FeedbackRecord,
    encode,
)

DECISION = DecisionRecord(decision_id="d0", options=["a", "b"], proba=[0.9, 0.1], answer="a",
                          route="fast", policy_id="p@1", time=1.0, text="hello")


def test_every_record_kind_round_trips_through_the_one_encoder() -> None:
    records = [DECISION, FeedbackRecord(decision_id="d0", label="b", time=2.0),
               AuditRecord(decision_id="d0", policy_id="p@1", label="a", answer="a",
                           correct=True, time=3.0),
               AlarmRecord(policy_id="p@1", kind="drift", decision=4, time=4.0, detail="x")]
    assert [parse_record(encode(r)) for r in records] == records
    # decisions written before records had a type still read as decisions
    untyped = json.dumps({"decision_id": "old", "options": ["a", "b"]})
    assert isinstance(parse_record(untyped), DecisionRecord)


@pytest.mark.parametrize("line, why", [
    ("[" * 100_000, "not JSON"),  # deep nesting: orjson's depth limit, never a RecursionError
    ('{"type": "alarm", "policy_id": "p@1", "kind": "drift", "time": 0, "detail": "x"}',
     "'decision'"),  # the alarm record a `serve` start once died on (KeyError: 'decision')
    ('{"type": "decision", "decision_id": "d", "options": ["a", "b"], "proba": [1.0]}',
     "proba has 1 values for 2 options"),
    ('{"type": "feedback", "decision_id": "", "label": "a"}', "'decision_id'"),
    ("[1, 2, 3]", "not an object"),
    ('{"decision_id": "d", "opt', "not JSON"),  # a torn last line
])
def test_a_damaged_line_is_refused_naming_why(line: str, why: str) -> None:
    with pytest.raises(DamagedRecord) as info:
        parse_record(line)
    assert why in str(info.value) and not info.value.unknown_type


def test_read_log_skips_and_counts_damage_with_one_summary_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "d.jsonl"
    lines = [encode(DECISION).decode(), "[" * 100_000,
             '{"type": "alarm", "policy_id": "p@1", "kind": "drift"}', "",
             '{"type": "alarm_cleared", "policy_id": "p@1"}',  # a newer version's record
             encode(FeedbackRecord(decision_id="d0", label="a")).decode(), "not json"]
    path.write_text("\n".join(lines) + "\n")
    counts = ReadCounts()
    with caplog.at_level(logging.WARNING, logger="slotgate.log"):
        records = list(read_log(path, counts=counts))
    assert [r.type for r in records] == ["decision", "feedback"]
    assert (counts.records, counts.damaged, counts.unknown_type) == (2, 3, 1)
    [warning] = [r.getMessage() for r in caplog.records]
    assert "3 damaged line(s) skipped" in warning and "d.jsonl line 2: not JSON" in warning
    assert "1 record(s) of a type this version does not read" in warning
    assert list(read_log(tmp_path / "missing.jsonl")) == []


def test_labels_join_by_one_rule_and_a_doubled_log_counts_each_decision_once() -> None:
    audit = AuditRecord(decision_id="d0", label="b", time=5.0)
    human_late = FeedbackRecord(decision_id="d0", label="a", time=9.0)
    human_early = FeedbackRecord(decision_id="d0", label="b", time=1.0)
    labels = LabelJoin()
    for record in (DECISION, audit, human_late, human_early):  # the late label read first
        labels.add(record)
    assert labels.label("d0") == ("a", "human")  # a human label beats an audit; latest wins
    assert labels.audit("d0") == "b" and labels.label("d1") is None
    only_audit = LabelJoin()
    only_audit.add(audit)
    assert only_audit.label("d0") == ("b", "slow")
    assert only_audit.label("d0", audits=False) is None
    alarm = AlarmRecord(policy_id="p", kind="drift", decision=1, time=0.0, detail="x")
    doubled = [DECISION, alarm, DECISION.model_copy(update={"answer": "b"}), alarm]
    assert [d.answer for d in distinct_decisions(doubled)] == ["a"]  # the first record
    assert list(alarms(doubled)) == [alarm, alarm]


def test_the_services_trusted_record_is_the_validated_one() -> None:
    """``DecisionRecord.trusted`` skips validation on the request path (~20 us of 77 options):
    what it builds, and the line it writes, are what validation gives."""
    fields = DECISION.model_dump(exclude={"type"}) | {"probability": 0.93, "shadow": True}
    trusted = DecisionRecord.trusted(**fields)
    assert trusted == DecisionRecord(**fields) and encode(trusted) == encode(DecisionRecord(**fields))
    assert parse_record(encode(trusted)) == trusted and trusted.served_fast
    assert DecisionRecord.trusted(decision_id="x").options == []
    with pytest.raises(TypeError, match="bogus"):
        DecisionRecord.trusted(decision_id="x", bogus=1)
