"""The System One parser: every schema error the protocol notes list, the option shapes, stages."""

from __future__ import annotations

from typing import Any

import pytest

from router.http.systemone.body import decode_body
from router.http.systemone.wire import (
    InvalidBody,
    SystemOneError,
    SystemOneRequest,
    parse_request,
)


def parse(payload: Any, *, max_questions: int = 64, max_options: int = 1024) -> SystemOneRequest:
    return parse_request(payload, max_questions=max_questions, max_options=max_options)


def body(**questions: Any) -> dict[str, Any]:
    return {"model": "jev-latest", "state": {"ticket": "Everything is down"}, "questions": questions}


NOUL = {"type": "noul", "instructions": "Needs a reply within the hour?"}


def error_of(payload: Any, **limits: int) -> SystemOneError:
    with pytest.raises(SystemOneError) as info:
        parse(payload, **limits)
    return info.value


def test_minimal_request_from_the_protocol_notes() -> None:
    parsed = parse(body(urgent=NOUL))
    assert parsed.model == "jev-latest"
    assert parsed.state == '{"ticket": "Everything is down"}'
    (q,) = parsed.questions
    assert (q.id, q.kind, q.instructions) == ("urgent", "noul", "Needs a reply within the hour?")
    assert q.answer_names == ("yes", "no")
    assert (parsed.samples, parsed.seed, parsed.stages) == (1, 42, (("urgent",),))


def test_state_string_kept_as_is_and_json_keeps_non_ascii() -> None:
    assert parse({**body(u=NOUL), "state": "  raw text "}).state == "  raw text "
    assert parse({**body(u=NOUL), "state": {"msg": "café"}}).state == '{"msg": "café"}'
    assert parse({**body(u=NOUL), "state": 0}).state == "0"


@pytest.mark.parametrize("state", [None, "missing"])
def test_state_required(state: Any) -> None:
    payload = body(u=NOUL)
    if state == "missing":
        del payload["state"]
    else:
        payload["state"] = state
    err = error_of(payload)
    assert (err.status_code, err.error_type, err.message) == (422, "validation_error",
                                                            "state: required")


@pytest.mark.parametrize("questions", [None, {}, [], "x", [NOUL]])
def test_questions_must_be_a_non_empty_map(questions: Any) -> None:
    err = error_of({"state": "s", "questions": questions})
    assert err.message == "questions: needs a non-empty map of id -> question"
    assert err.status_code == 422


def test_question_count_limit() -> None:
    assert error_of(body(a=NOUL, b=NOUL, c=NOUL), max_questions=2).message == (
        "schema: at most 2 questions"
    )
    assert len(parse(body(a=NOUL, b=NOUL), max_questions=2).questions) == 2


def test_unknown_and_missing_type() -> None:
    assert error_of(body(x={"type": "rank"})).message == "question 'x': unknown type 'rank'"
    assert error_of(body(x={"type": 3})).message == "question 'x': unknown type '3'"
    assert error_of(body(x={"instructions": "?"})).message == "question 'x': type: required"
    assert error_of(body(x="noul")).message == "question 'x': needs an object with a type"


@pytest.mark.parametrize("alias", ["bool", "boolean", "noul"])
def test_bool_aliases_are_noul(alias: str) -> None:
    (q,) = parse(body(x={"type": alias})).questions
    assert q.kind == "noul" and q.answer_names == ("yes", "no")


def test_noul_criteria_become_option_descriptions() -> None:
    (q,) = parse(body(x={"type": "noul", "criteria": {"true": "urgent", "false": None}})).questions
    assert [(o.name, o.description) for o in q.options] == [("yes", "urgent"), ("no", None)]
    bad = error_of(body(x={"type": "noul", "criteria": ["yes", "no"]}))
    assert bad.message.startswith("question 'x': noul criteria must be")


def test_what_the_published_openapi_allows_is_read_as_the_server_reads_it() -> None:
    """Levels, descriptions and criteria values of any JSON type are text (the server str()s
    them), option names may be empty, ids are trimmed, other noul criteria keys are ignored."""
    (noul, choice, score) = parse(body(**{
        " urgent ": {"type": "noul", "criteria": {"true": 1, "false": None, "note": "x"}},
        "pick": {"type": "choice", "criteria": {"": "nothing", "a": 2.5, "b": {"k": 1}}},
        "stars": {"type": "score", "criteria": [1, 2.5, True, "four"]},
    })).questions
    assert noul.id == "urgent"
    assert [(o.name, o.description) for o in noul.options] == [("yes", "1"), ("no", None)]
    assert [(o.name, o.description) for o in choice.options] == [
        ("", "nothing"), ("a", "2.5"), ("b", "{'k': 1}")]
    assert score.answer_names == ("1", "2.5", "True", "four")


def test_choice_options_keep_order_and_descriptions() -> None:
    criteria = {"billing": "money things", "outage": None, "other": "anything else"}
    (q,) = parse(body(intent={"type": "choice", "criteria": criteria})).questions
    assert q.kind == "choice"
    assert [(o.name, o.description) for o in q.options] == list(criteria.items())


def test_seventy_seven_options_accepted_no_limit_of_26() -> None:
    criteria = {f"intent_{i}": None for i in range(77)}
    (q,) = parse(body(intent={"type": "choice", "criteria": criteria})).questions
    assert len(q.options) == 77
    levels = [f"level {i}" for i in range(40)]
    (s,) = parse(body(s={"type": "score", "criteria": levels})).questions
    assert s.answer_names == tuple(levels) and s.kind == "score"


def test_option_limit_is_the_setting() -> None:
    criteria = {f"o{i}": None for i in range(5)}
    err = error_of(body(intent={"type": "choice", "criteria": criteria}), max_options=4)
    assert err.message == "question 'intent': at most 4 alternatives"


@pytest.mark.parametrize(
    "question",
    [
        {"type": "choice", "criteria": {"only": None}},
        {"type": "choice", "criteria": {}},
        {"type": "score", "criteria": ["one level"]},
        {"type": "score", "criteria": []},
    ],
)
def test_needs_at_least_two_alternatives(question: dict[str, Any]) -> None:
    err = error_of(body(q=question))
    assert (err.status_code, err.message) == (422, "question 'q': needs at least two alternatives")


@pytest.mark.parametrize(
    ("question", "message"),
    [
        ({"type": "choice"}, "question 'q': choice criteria must map each option to a description"),
        ({"type": "choice", "criteria": ["a", "b"]}, "question 'q': choice criteria must map"),
        ({"type": "score"}, "question 'q': score criteria must be an ordered list of levels"),
        ({"type": "score", "criteria": ["a", "a", "b"]}, "question 'q': duplicate level 'a'"),
        ({"type": "noul", "depends_on": "a"}, "question 'q': depends_on must be a list"),
    ],
)
def test_criteria_shape_errors(question: dict[str, Any], message: str) -> None:
    assert error_of(body(q=question)).message.startswith(message)


def test_score_levels_sent_as_numbers_become_strings() -> None:
    (q,) = parse(body(s={"type": "score", "criteria": [1, 2, 3]})).questions
    assert q.answer_names == ("1", "2", "3")


@pytest.mark.parametrize("qid", ["a:b", "a\nb", "   ", "", "x\ry"])  # "x\r" is "x", trimmed
def test_bad_ids(qid: str) -> None:
    err = error_of({"state": "s", "questions": {qid: NOUL}})
    assert err.status_code == 422
    assert "ids must be non-empty after trimming, with no ':' or newline" in err.message


def test_instructions_question_text_and_context() -> None:
    parsed = parse({**body(a={"type": "noul", "instructions": None}, b={"type": "noul"},
                          c={"type": "noul", "instructions": {"k": 1}}), "instructions": "Be strict."})
    assert [q.instructions for q in parsed.questions] == ["null", "", '{"k": 1}']
    assert parsed.context == "Be strict."
    assert parse(body(a=NOUL)).context == ""


@pytest.mark.parametrize(("samples", "expected"),
                         [("auto", 1), (1, 1), (7, 7), (32, 32), (99, 32), (True, 1)])
def test_samples(samples: Any, expected: int) -> None:
    assert parse({**body(a=NOUL), "samples": samples}).samples == expected


@pytest.mark.parametrize("samples", [0, -1, "3", 1.5, False, None, "AUTO"])
def test_bad_samples(samples: Any) -> None:
    err = error_of({**body(a=NOUL), "samples": samples})
    assert err.message == 'schema: samples must be a positive count or "auto"'


def test_seed_and_policy() -> None:
    parsed = parse({**body(a={**NOUL, "policy": "p-q"}), "seed": 7, "policy": "p-top"})
    assert parsed.seed == 7 and parsed.policy == "p-top" and parsed.questions[0].policy == "p-q"
    assert parse({**body(a=NOUL), "seed": "7"}).seed == 7  # int() of it, as the server
    assert error_of({**body(a=NOUL), "seed": "7.5"}).message == (
        "seed: must be an integer (or a number or text int() takes)")
    assert error_of({**body(a=NOUL), "policy": 3}).message == "policy: must be a policy name"


def test_images_are_data_urls_or_content_type_and_base64_objects() -> None:
    parsed = parse({**body(a=NOUL), "images": [
        "data:image/png;base64,AAAA", {"content_type": "image/jpeg", "base64": "BBBB"}]})
    assert parsed.images == ("data:image/png;base64,AAAA", "data:image/jpeg;base64,BBBB")
    assert parsed.decision_request(parsed.questions[0]).images == parsed.images
    err = error_of({**body(a=NOUL), "images": ["data:image/png;base64,AAAA", "https://x/y.png"]})
    assert (err.message, err.field, err.status_code) == (
        "images[1]: a data:image/... URL or an object with content_type and base64",
        "images.1", 422)


def test_unknown_and_self_references() -> None:
    err = error_of(body(a={**NOUL, "depends_on": ["zz"]}))
    assert err.message == "question 'a': depends on unknown question 'zz'"
    err = error_of(body(a={**NOUL, "depends_on": ["a"]}))
    assert err.message == "question 'a': depends on unknown question 'a'"
    err = error_of(body(a=NOUL, b={**NOUL, "ask_if": {"nope": ["yes"]}}))
    assert err.message == "question 'b': depends on unknown question 'nope'"


@pytest.mark.parametrize("ask_if", ["a", {"a": []}, {"a": "yes"}, {"a": [None]}, {"a": [True]}])
def test_ask_if_shape(ask_if: Any) -> None:
    err = error_of(body(a=NOUL, b={**NOUL, "ask_if": ask_if}))
    assert err.message == "question 'b': ask_if must map a question id to a non-empty list of its answers"


def test_ask_if_values_checked_against_the_dependency_answers() -> None:
    choice = {"type": "choice", "criteria": {"billing": None, "outage": None}}
    score = {"type": "score", "criteria": ["low", "mid", "high"]}
    ok = parse(body(a=NOUL, c=choice, s=score,
                    b={**NOUL, "ask_if": {"a": ["yes"], "c": ["outage"], "s": ["mid", "high"]}}))
    assert ok.question("b").ask_if == (("a", ("yes",)), ("c", ("outage",)), ("s", ("mid", "high")))
    assert error_of(body(a=NOUL, b={**NOUL, "ask_if": {"a": ["true"]}})).message == (
        "question 'b': ask_if values for 'a' must be among ['yes', 'no']"
    )
    assert error_of(body(c=choice, b={**NOUL, "ask_if": {"c": ["refund"]}})).message == (
        "question 'b': ask_if values for 'c' must be among ['billing', 'outage']"
    )
    assert "must be among ['low', 'mid', 'high']" in error_of(
        body(s=score, b={**NOUL, "ask_if": {"s": ["2"]}})
    ).message


def test_cycles_rejected() -> None:
    err = error_of(body(a={**NOUL, "depends_on": ["b"]}, b={**NOUL, "ask_if": {"a": ["yes"]}},
                        c=NOUL))
    assert err.message == "schema: dependency cycle among a, b"
    assert err.status_code == 422


def test_stage_order_follows_dependencies_not_request_order() -> None:
    parsed = parse(body(
        d={**NOUL, "depends_on": ["b", "c"]},
        c={**NOUL, "ask_if": {"a": ["yes"]}},
        b={**NOUL, "depends_on": ["a"]},
        a=NOUL,
        e=NOUL,
        f={**NOUL, "depends_on": ["d", "a"]},
    ))
    assert parsed.stages == (("a", "e"), ("c", "b"), ("d",), ("f",))
    assert [q.id for q in parsed.questions] == ["d", "c", "b", "a", "e", "f"]


def test_ask_subset_must_include_its_dependencies() -> None:
    questions = {"a": NOUL, "b": {**NOUL, "depends_on": ["a"]}, "c": NOUL}
    parsed = parse({"state": "s", "questions": questions, "ask": ["a", "b"]})
    assert [q.id for q in parsed.questions] == ["a", "b"] and parsed.stages == (("a",), ("b",))
    assert error_of({"state": "s", "questions": questions, "ask": ["b"]}).message == (
        "schema: ask names 'b' but not everything it depends on ('a')"
    )
    assert error_of({"state": "s", "questions": questions, "ask": ["zz"]}).message == (
        "schema: ask must list question ids from this schema"
    )


def test_engine_knobs_are_validated_and_carried() -> None:
    parsed = parse({**body(a={**NOUL, "alone": True}), "steps": 4, "think": 0, "chunk_rows": 16,
                    "sequential": True, "auto_threshold": 0.2, "auto_max": 99})
    assert parsed.stages == (("a",),) and parsed.question("a").alone
    assert dict(parsed.engine) == {"steps": 4, "think": 0, "chunk_rows": 16, "sequential": True,
                                   "auto_threshold": 0.2, "auto_max": 32}  # clamped like steps


@pytest.mark.parametrize(("extra", "field", "message"), [
    ({"auto_max": "4"}, "auto_max", "schema: auto_max must be an integer"),
    ({"auto_max": True}, "auto_max", "schema: auto_max must be an integer"),
    ({"auto_threshold": "low"}, "auto_threshold", "schema: auto_threshold must be a number of nats"),
    ({"sequential": "no"}, "sequential", "schema: sequential must be true or false"),
])
def test_bad_engine_knobs_name_their_field(extra: dict[str, Any], field: str, message: str) -> None:
    error = error_of({**body(a=NOUL), **extra})
    assert (error.field, error.message) == (field, message)


def test_alone_must_be_a_boolean() -> None:
    error = error_of(body(a={**NOUL, "alone": "yes"}))
    assert (error.field, error.message) == ("questions.a.alone", "question 'a': alone must be true or false")


# --- decode_body: malformed bodies are 400 invalid_request_error -------------------------------


@pytest.mark.parametrize("raw", [b"{", b"", b"\xff\xfe", b'{"state": NaN}', b"[" * 100_000])
def test_malformed_json_is_400(raw: bytes) -> None:
    with pytest.raises(InvalidBody) as info:
        decode_body(raw, content_type="application/json")
    assert (info.value.status_code, info.value.error_type) == (400, "invalid_request_error")
    assert info.value.message.startswith("invalid body: ")


def test_non_object_body_is_400() -> None:
    with pytest.raises(InvalidBody, match="expected a JSON object"):
        parse([1, 2])


def multipart(*parts: tuple[str, str | None, bytes]) -> tuple[bytes, str]:
    boundary = "b0undary"
    chunks = []
    for name, filename, content in parts:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        chunks.append(f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode()
                      + content + b"\r\n")
    return b"".join(chunks) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def test_multipart_request_part() -> None:
    raw, ctype = multipart(("request", None, b'{"state": "s", "questions": {"u": {"type": "noul"}}}'))
    payload, images = decode_body(raw, content_type=ctype)
    parsed = parse(payload)
    assert parsed.state == "s" and parsed.questions[0].id == "u" and images == []


def test_multipart_image_parts_are_images_and_other_parts_are_refused() -> None:
    raw, ctype = multipart(("other", None, b"{}"))
    with pytest.raises(InvalidBody, match="part 'other': neither the request JSON nor an image"):
        decode_body(raw, content_type=ctype)
    raw, ctype = multipart(("request", None, b"{}"), ("image", "a.png", b"\x89PNG"))
    raw = raw.replace(b'filename="a.png"\r\n', b'filename="a.png"\r\nContent-Type: image/png\r\n')
    payload, images = decode_body(raw, content_type=ctype)
    assert payload == {} and images == ["data:image/png;base64,iVBORw=="]
    with pytest.raises(InvalidBody, match="multipart needs a part named request holding the JSON body"):
        decode_body(b"garbage", content_type="multipart/form-data; boundary=zz")
