"""Detection of decision requests in OpenAI chat bodies, and the reply that satisfies the schema."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.types import Decision
from router.errors import Forbidden, InvalidRequest
from router.http.openai.wire import (
    CREDENTIAL_FIELDS,
    ChatCompletionRequest,
    plan_decisions,
    render_reply,
    routing_headers,
)

USER = [{"role": "user", "content": "my card has not arrived"}]


def body(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": USER, **fields})


def enum_format(enum: Any, name: str = "intent", **schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": {"enum": enum, **schema}}}


def plan(b: ChatCompletionRequest, **limits: int) -> Any:
    return plan_decisions(b, max_options=limits.get("max_options", 100),
                          max_questions=limits.get("max_questions", 8))


def test_string_enum_schema_is_one_decision_on_the_user_text() -> None:
    p = plan(body(response_format=enum_format(["card_arrival", "lost_card"], type="string"),
                  messages=[{"role": "system", "content": "Banking intents."}, *USER]))
    [r] = p.requests
    assert (p.shape, r.question_id, r.option_names) == ("enum", "intent",
                                                        ("card_arrival", "lost_card"))
    assert r.state == "my card has not arrived" and r.context == "Banking intents."


def test_object_of_enums_is_one_question_per_property() -> None:
    schema = {"type": "object", "properties": {
        "intent": {"type": "string", "enum": ["a", "b"], "description": "Which intent?"},
        "urgent": {"type": "string", "enum": ["yes", "no"]}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "triage", "schema": schema}}
    p = plan(body(response_format=fmt))
    assert p.shape == "object"
    # The object's name is part of what each property asks; a property with no text of its
    # own is asked by its name after it.
    assert [(r.question_id, r.instructions, r.option_names) for r in p.requests] == [
        ("intent", "triage\nWhich intent?", ("a", "b")), ("urgent", "triage\nurgent", ("yes", "no"))]


@pytest.mark.parametrize("fields", [
    {"structured_outputs": {"choice": ["x", "y"]}},
    {"guided_choice": ["x", "y"]},
])
def test_vllm_choice_spellings(fields: dict[str, Any]) -> None:
    p = plan(body(**fields))
    assert p.shape == "choice" and p.requests[0].option_names == ("x", "y")


@pytest.mark.parametrize("fields", [
    {},
    {"response_format": {"type": "json_object"}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"enum": ["p", "q"]}, "b": {"type": "string"}}}}}},
    {"structured_outputs": {"regex": "[a-z]+"}},
    # Not a finite set of strings or of integers: passed through (docs/proxy.md says so).
    {"response_format": enum_format(["a", None], type=["string", "null"])},
    {"response_format": enum_format(["a", 3])},
    {"response_format": enum_format([True, False])},
    {"response_format": enum_format([0.5, 1.5])},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"enum": ["p", "q"]}, "b": {"enum": ["u", None]}}}}}},
    # A tool call is demanded: the reply cannot be one of the options, so it is not a decision.
    {"response_format": enum_format(["a", "b"]), "tool_choice": "required",
     "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
    {"guided_choice": ["a", "b"], "tool_choice": {"type": "function", "function": {"name": "f"}},
     "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
])
def test_other_requests_are_passthrough(fields: dict[str, Any]) -> None:
    assert plan(body(**fields)) is None


def test_integer_enums_are_decided_and_answered_as_integers() -> None:
    schema = {"type": "object", "properties": {
        "stars": {"type": "integer", "enum": [1, 2, 3, 4, 5]},
        "intent": {"type": "string", "enum": ["a", "b"]}}}
    p = plan(body(response_format={"type": "json_schema",
                                   "json_schema": {"name": "review", "schema": schema}}))
    assert [r.option_names for r in p.requests] == [("1", "2", "3", "4", "5"), ("a", "b")]
    assert p.integer_questions == {"stars"}
    reply = render_reply(body(), p, [decision("stars", "4", "fast", 0.95),
                                   decision("intent", "b", "fast", 0.95)])
    assert json.loads(reply["choices"][0]["message"]["content"]) == {"stars": 4, "intent": "b"}
    single = plan(body(response_format=enum_format([-1, 0, 1], type="integer")))
    content = render_reply(body(), single, [decision("intent", "-1", "slow", 0.5)])["choices"][0]["message"]
    assert json.loads(content["content"]) == -1


def test_tools_with_auto_choice_and_logprobs_false_are_still_decisions() -> None:
    p = plan(body(response_format=enum_format(["a", "b"]), logprobs=False, tool_choice="auto",
                  tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}]))
    assert p is not None and p.requests[0].option_names == ("a", "b")


@pytest.mark.parametrize(("fields", "field"), [
    ({"response_format": enum_format(["only"])}, "response_format.json_schema.schema.enum"),
    ({"response_format": enum_format(["a", ""])}, "response_format.json_schema.schema.enum.1"),
    ({"response_format": enum_format([1, 1])}, "response_format.json_schema.schema.enum"),
    ({"guided_choice": [1, 2]}, "guided_choice.0"),
    ({"response_format": enum_format(["a", "b"]), "logprobs": True}, "logprobs"),
    ({"guided_choice": ["a", "b"], "top_logprobs": 3}, "top_logprobs"),
    ({"response_format": enum_format(["a", "a"])}, "response_format.json_schema.schema.enum"),
    ({"response_format": enum_format([f"o{i}" for i in range(101)])},
     "response_format.json_schema.schema.enum"),
    ({"response_format": enum_format(["a", "b"], name="bad:id")}, "response_format.json_schema.name"),
    ({"guided_choice": ["a"]}, "guided_choice"),
    ({"guided_choice": ["a", "b"], "n": 2}, "n"),
    ({"guided_choice": ["a", "b"], "messages": [{"role": "system", "content": "only"}]}, "messages"),
    ({"guided_choice": ["a", "b"],
      "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages.0.content.0"),
])
def test_bad_decisions_name_the_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        plan(body(**fields))
    assert info.value.field == field and field in info.value.message


def test_property_names_with_colon_or_newline_are_refused() -> None:
    schema = {"type": "object", "properties": {"a\nb": {"enum": ["x", "y"]}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}
    with pytest.raises(InvalidRequest, match="not a valid question id"):
        plan(body(response_format=fmt))


def test_the_state_is_the_last_user_message_and_earlier_turns_are_context() -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                {"role": "user", "content": [{"type": "text", "text": "card lost"}]}]
    [r] = plan(body(guided_choice=["a", "b"], messages=messages)).requests
    assert (r.context, r.state) == ("user: hi\nassistant: hello", "card lost")


@pytest.mark.parametrize("messages", [
    [{"role": "system", "content": "Banking."}],
    [{"role": "user", "content": "  \n"}, {"role": "assistant", "content": "card lost"}],
])
def test_a_decision_without_user_text_is_refused_naming_messages(
        messages: list[dict[str, Any]]) -> None:
    with pytest.raises(InvalidRequest, match="messages: a decision needs a user message") as info:
        plan(body(guided_choice=["a", "b"], messages=messages))
    assert info.value.field == "messages"


def test_properties_without_text_of_their_own_are_read_apart() -> None:
    """Two yes/no properties of one object with no description differ by their names alone:
    what the fast backend reads (and the read cache keys on) must differ too."""
    schema = {"type": "object", "properties": {name: {"type": "string", "enum": ["yes", "no"]}
                                               for name in ("urgent", "angry")}}
    fmt = {"type": "json_schema", "json_schema": {"name": "triage", "schema": schema}}
    urgent, angry = plan(body(response_format=fmt)).requests
    assert urgent.signature() != angry.signature()


def test_turns_after_the_last_user_message_are_context_too() -> None:
    messages = [{"role": "user", "content": "card lost"}, {"role": "assistant", "content": "When?"}]
    [r] = plan(body(guided_choice=["a", "b"], messages=messages)).requests
    assert (r.context, r.state) == ("assistant: When?", "card lost")


def test_the_conversation_travels_in_the_request_as_turns() -> None:
    """What the slow path shows the slow model: every message as (role, text), system included;
    it is the same input as context and state, so it takes no part in equality."""
    messages = [{"role": "system", "content": "Banking."}, {"role": "user", "content": "hi"},
                {"role": "user", "content": [{"type": "text", "text": "card lost"}]}]
    [r] = plan(body(guided_choice=["a", "b"], messages=messages)).requests
    assert r.turns == (("system", "Banking."), ("user", "hi"), ("user", "card lost"))
    assert (r.context, r.state) == ("Banking.\n\nuser: hi", "card lost")
    without = dataclasses.replace(r, turns=())
    assert without == r and hash(without) == hash(r) and without.signature() == r.signature()


@pytest.mark.parametrize("field", sorted(CREDENTIAL_FIELDS))
def test_the_request_model_refuses_credential_fields_with_a_403(field: str) -> None:
    for fields in ({}, {"guided_choice": ["a", "b"]}):  # passthrough and decision alike
        with pytest.raises(Forbidden) as info:
            body(**fields, **{field: "http://evil.example/v1"})
        assert info.value.field == field and info.value.status_code == 403


def decision(qid: str, answer: str, route: str, p: float, note: str | None = None) -> Decision:
    return Decision(decision_id=f"id-{qid}", question_id=qid, answer=answer,
                    route=route, probability=p, raw_probability=p,  # type: ignore[arg-type]
                    threshold=0.9, policy_id="pol@1", latency_ms=3.0, note=note)


def test_reply_content_satisfies_the_schema_and_carries_routing_facts() -> None:
    b = body(response_format=enum_format(["card_arrival", "lost_card"]))
    reply = render_reply(b, plan(b), [decision("intent", "lost_card", "fast", 0.97)])
    assert json.loads(reply["choices"][0]["message"]["content"]) == "lost_card"
    assert reply["object"] == "chat.completion"
    facts = reply["slotgate"]
    assert (facts["route"], facts["decision_id"], facts["threshold"]) == ("fast", "id-intent", 0.9)
    headers = routing_headers(facts)
    assert headers["x-slotgate-route"] == "fast" and headers["x-slotgate-probability"] == "0.97"


def test_headers_carry_no_control_characters_from_an_upstream_message() -> None:
    note = "slow model unavailable: upstream said\r\nx-injected: 1\n\tand café"
    headers = routing_headers({"route": "unverified", "note": note})
    assert headers["x-slotgate-note"] == (
        "slow model unavailable: upstream said  x-injected: 1  and caf?")
    assert all(0x20 <= ord(c) < 0x7f for value in headers.values() for c in value)


def test_object_reply_summarises_the_least_verified_route() -> None:
    schema = {"type": "object", "properties": {"a": {"enum": ["x", "y"]}, "b": {"enum": ["u", "v"]}}}
    b = body(response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": schema}})
    ds = [decision("a", "x", "fast", 0.99), decision("b", "v", "unverified", 0.6, note="no slow")]
    reply = render_reply(b, plan(b), ds)
    assert json.loads(reply["choices"][0]["message"]["content"]) == {"a": "x", "b": "v"}
    facts = reply["slotgate"]
    assert facts["route"] == "unverified" and facts["probability"] == 0.6
    assert facts["note"] == "no slow" and [d["route"] for d in facts["decisions"]] == [
        "fast", "unverified"]


def test_choice_reply_is_the_bare_option() -> None:
    b = body(guided_choice=["yes", "no"])
    reply = render_reply(b, plan(b), [decision("choice", "no", "slow", 0.4)])
    assert reply["choices"][0]["message"]["content"] == "no"


def test_sdk_pydantic_schema_with_an_enum_definition_is_resolved() -> None:
    schema = {"$defs": {"Urgency": {"enum": ["yes", "no"], "type": "string"}},
              "type": "object", "additionalProperties": False, "required": ["intent", "urgent"],
              "properties": {"intent": {"enum": ["a", "b"], "type": "string"},
                             "urgent": {"$ref": "#/$defs/Urgency", "description": "Urgent?"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "Triage", "schema": schema}}
    p = plan(body(response_format=fmt))
    assert [(r.question_id, r.instructions, r.option_names) for r in p.requests] == [
        ("intent", "Triage\nintent", ("a", "b")), ("urgent", "Triage\nUrgent?", ("yes", "no"))]


@pytest.mark.parametrize("ref", ["#/$defs/Missing", "#/$defs", "#/a/b/c", "http://x/y", "#/$defs/U"])
def test_unresolvable_refs_mean_passthrough(ref: str) -> None:
    schema = {"$defs": ["not", "a", "map"] if ref == "#/$defs/U" else {},
              "type": "object", "properties": {"u": {"$ref": ref}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}
    assert plan(body(response_format=fmt)) is None



JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["enum", "type", "properties", "$ref", "$defs", "description", "x"]),
        inner, max_size=4),
    max_leaves=12)


@settings(max_examples=300, derandomize=True, database=None, deadline=None)
@given(schema=JSON, choice=st.none() | JSON, name=st.text(max_size=6))
def test_any_schema_is_a_plan_none_or_a_named_request_error(
    schema: Any, choice: Any, name: str
) -> None:
    fields: dict[str, Any] = {"response_format": {
        "type": "json_schema", "json_schema": {"name": name or "n", "schema": schema}}}
    if choice is not None:
        fields["guided_choice"] = choice
    try:
        b = body(**fields)
    except ValueError:  # pydantic refused the shape: the app answers that with a 400 itself
        return
    try:
        p = plan(b)
    except InvalidRequest as exc:
        assert exc.field and exc.field in exc.message
        return
    if p is not None:
        assert all(len(r.options) >= 2 for r in p.requests)
