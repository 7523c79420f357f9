"""A record on the shared alarm board is parsed once into an ``AlarmRecord``: a malformed one is
refused with an error naming the field, and a record stored under another policy's or another
kind's key is refused as well (a replica must never latch what its key does not name)."""

from __future__ import annotations

import re

import pytest

from router.store.alarm_board import alarm_key, parse_record
from router.store.records import AlarmRecord, encode

RECORD = AlarmRecord(policy_id="p@1", kind="drift", decision=7, time=12.5, detail="drift: x")
KEY = alarm_key("p@1", "drift")


def test_a_posted_record_reads_back_as_itself() -> None:
    assert parse_record(encode(RECORD), KEY) == RECORD
    clear = RECORD.model_copy(update={"kind": "clear"})
    assert parse_record(encode(clear), alarm_key("p@1", "clear")) == clear


def test_a_record_without_its_type_field_reads() -> None:
    blob = b'{"policy_id": "p@1", "kind": "drift", "decision": 7, "time": 12.5, "detail": "d"}'
    assert parse_record(blob, KEY).decision == 7


@pytest.mark.parametrize(("blob", "field"), [
    (b'{"policy_id": "p@1", "kind": "drift", "decision": "7", "time": 1, "detail": "d"}',
     "decision: Input should be a valid integer"),
    (b'{"policy_id": "p@1", "kind": "drift", "decision": true, "time": 1, "detail": "d"}',
     "decision: Input should be a valid integer"),
    (b'{"policy_id": "p@1", "kind": "drift", "decision": 7, "time": "1", "detail": "d"}',
     "time: Input should be a valid number"),
    (b'{"policy_id": "p@1", "kind": "drift", "decision": 7, "time": 1}',
     "detail: Field required"),
    (b'{"policy_id": 7, "kind": "drift", "decision": 7, "time": 1, "detail": "d"}',
     "policy_id: Input should be a valid string"),
    (b'{"policy_id": "p@1", "kind": "fire", "decision": 7, "time": 1, "detail": "d"}',
     "kind: Input should be 'drift', 'accuracy', 'cost' or 'clear'"),
    (b'{"type": "audit", "policy_id": "p@1", "kind": "drift", "decision": 7, "time": 1}',
     "type: Input should be 'alarm'"),
    (b"not json", "record: Invalid JSON"),
    (b"[1, 2]", "record: Input should be an object"),
])
def test_a_malformed_record_is_refused_naming_its_field(blob: bytes, field: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(field)):
        parse_record(blob, KEY)


def test_a_record_under_another_policys_or_kinds_key_is_refused() -> None:
    with pytest.raises(ValueError, match="^policy_id: 'p@1' is not the policy its key names"):
        parse_record(encode(RECORD), alarm_key("p@2", "drift"))
    with pytest.raises(ValueError, match="^kind: 'drift' is not the kind its key names"):
        parse_record(encode(RECORD), alarm_key("p@1", "accuracy"))
