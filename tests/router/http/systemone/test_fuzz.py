"""Property: whatever body arrives, the System One parser either returns a valid request or raises
its own SystemOneError; nothing else escapes to become a 500."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router.http.systemone.body import decode_body
from router.http.systemone.wire import SystemOneError, SystemOneRequest, parse_request

scalars = st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.floats(
    allow_nan=False, allow_infinity=False) | st.text(max_size=8)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=4),
    max_leaves=12,
)
ids = st.sampled_from(["a", "b", "c", "d:x", " ", "e\n"])
answers = st.sampled_from(["yes", "no", "x", "y", "low", "high", 1, True, None])
questions = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["noul", "choice", "score", "bool", "rank", 3, None]),
        "criteria": json_values
        | st.dictionaries(st.sampled_from(["true", "false", "x", "y", "z"]),
                          st.none() | st.text(max_size=4), max_size=3)
        | st.lists(st.sampled_from(["low", "high", "mid", 2, ""]), max_size=4),
        "instructions": json_values,
        "depends_on": st.lists(ids, max_size=3) | json_values,
        "ask_if": st.dictionaries(ids, st.lists(answers, max_size=3) | json_values, max_size=2),
        "policy": st.none() | st.text(max_size=3) | st.integers(),
    },
)
payloads = st.fixed_dictionaries(
    {},
    optional={
        "model": json_values,
        "state": json_values,
        "questions": st.dictionaries(ids, questions | json_values, max_size=4) | json_values,
        "instructions": json_values,
        "samples": st.sampled_from(["auto", 0, 1, 40, -3, "x", True, 2.0]),
        "seed": st.integers() | json_values,
        "ask": st.lists(ids, max_size=3) | json_values,
        "images": json_values,
        "policy": json_values,
    },
)

# Mostly-valid bodies, so the property also covers the reference checks and stage ordering.
good_ids = st.sampled_from(["a", "b", "c"])
good_questions = st.fixed_dictionaries(
    {"type": st.sampled_from(["noul", "choice", "score"])},
    optional={
        "criteria": st.sampled_from([{"x": None, "y": "why"}, ["low", "high"], {"true": "t"}]),
        "depends_on": st.lists(good_ids, max_size=2),
        "ask_if": st.dictionaries(good_ids, st.lists(answers, min_size=1, max_size=2), max_size=2),
    },
)
plausible = st.fixed_dictionaries(
    {"state": st.text(max_size=5) | json_values,
     "questions": st.dictionaries(good_ids, good_questions, min_size=1, max_size=3)},
    optional={"samples": st.sampled_from(["auto", 1, 40]), "ask": st.lists(good_ids, max_size=3)},
)


def check(payload: Any) -> None:
    try:
        parsed = parse_request(payload, max_questions=3, max_options=4)
    except SystemOneError as exc:
        assert exc.status_code in (400, 422) and exc.message
        return
    assert isinstance(parsed, SystemOneRequest)
    staged = [qid for stage in parsed.stages for qid in stage]
    assert sorted(staged) == sorted(q.id for q in parsed.questions)
    seen: set[str] = set()
    for stage in parsed.stages:  # every dependency is answered in an earlier stage
        for qid in stage:
            assert set(parsed.question(qid).dependencies) <= seen
        seen.update(stage)
    for q in parsed.questions:
        assert 2 <= len(q.options) <= 4


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payloads | plausible)
def test_structured_payloads_parse_or_fail_cleanly(payload: dict[str, Any]) -> None:
    check(payload)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_arbitrary_json_parses_or_fails_cleanly(payload: Any) -> None:
    check(payload)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200), st.sampled_from(
    ["application/json", None, "multipart/form-data; boundary=zz", "multipart/form-data"]))
def test_arbitrary_bytes_decode_or_fail_cleanly(raw: bytes, content_type: str | None) -> None:
    try:
        check(decode_body(raw, content_type=content_type)[0])
    except SystemOneError as exc:
        assert exc.status_code in (400, 422)


@settings(max_examples=100, deadline=None)
@given(payloads)
def test_json_round_trip_through_bytes(payload: dict[str, Any]) -> None:
    check(decode_body(json.dumps(payload).encode(), content_type="application/json")[0])
