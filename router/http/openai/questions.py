"""The question builder of the OpenAI wire: the questions a chat request asks (a vLLM choice list,
a ``json_schema`` enum, or an object schema's enum properties), each with every word on the path
to its answer, and the conversation split into the question's context and the state."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from policies.scope import question_text
from policies.types import Turn
from router.errors import InvalidRequest
from router.http.openai.request import ChatCompletionRequest, JsonSchemaFormat

Shape = Literal["enum", "object", "choice"]
FORMAT = "response_format.json_schema"
_SCHEMA_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's own rule for json_schema.name


@dataclass(frozen=True, slots=True)
class AskedQuestion:
    """One question of a chat request: its id, its text as the fast backend reads it
    (``policies.scope.question_text``, with the id where the question has no text of its own;
    "" for a choice list), its enum values as sent, and the field they came from."""

    question_id: str
    instructions: str
    values: Any
    where: str


def find_questions(
    body: ChatCompletionRequest, *, max_questions: int
) -> tuple[Shape, list[AskedQuestion]] | None:
    """The questions ``body`` asks and the shape its answer takes, or None when its answer is
    not constrained to a finite set (an ordinary chat, passed through). Raises InvalidRequest
    naming the field for a malformed question id or too many questions."""
    choice = choice_list(body)
    if choice is not None:
        return "choice", [choice]
    fmt = body.response_format
    if fmt is None or fmt.type != "json_schema" or fmt.json_schema is None:
        return None
    spec = fmt.json_schema
    schema = spec.schema_ or {}
    if "enum" in schema:
        enum = enum_question(spec, schema)
        return None if enum is None else ("enum", [enum])
    properties = enum_properties(schema)
    if properties is None:
        return None  # structured output of another kind: the slow model's job, unchanged
    if len(properties) > max_questions:
        raise InvalidRequest(
            f"{FORMAT}.schema.properties: at most {max_questions} questions per request, "
            f"got {len(properties)}", field=f"{FORMAT}.schema.properties")
    return "object", [property_question(spec, schema, name, prop)
                      for name, prop in properties.items()]


def choice_list(body: ChatCompletionRequest) -> AskedQuestion | None:
    """vLLM's ``guided_choice`` or ``structured_outputs.choice``: one question, ``choice``, with
    no text of its own (what it asks is in the messages)."""
    if body.guided_choice is not None:
        return AskedQuestion("choice", "", body.guided_choice, "guided_choice")
    if body.structured_outputs and "choice" in body.structured_outputs:
        return AskedQuestion("choice", "", body.structured_outputs["choice"],
                             "structured_outputs.choice")
    return None


def enum_question(spec: JsonSchemaFormat, schema: dict[str, Any]) -> AskedQuestion | None:
    """An enum schema: one question named by ``json_schema.name``, asked by the descriptions and
    title around the enum; None when the enum is not a set of strings or of integers."""
    if enum_kind(schema["enum"]) is None:
        return None  # null, booleans, floats or a mix: not a finite set we decide
    check_id(spec.name, field=f"{FORMAT}.name", schema_name=True)
    text = question_text(spec.name, [spec.description, _text(schema, "title"),
                                     _text(schema, "description")])
    return AskedQuestion(spec.name, text or spec.name, schema["enum"], f"{FORMAT}.schema.enum")


def enum_properties(schema: dict[str, Any]) -> dict[str, dict[str, Any]] | None:
    """An object schema's properties with local ``$ref`` resolved, when every one is an enum of
    strings or integers; None for any other schema."""
    properties = schema.get("properties")
    if schema.get("type") != "object" or not isinstance(properties, dict) or not properties:
        return None
    resolved = {name: resolve(schema, prop) for name, prop in properties.items()}
    if not all(isinstance(p, dict) and "enum" in p and enum_kind(p["enum"]) is not None
               for p in resolved.values()):
        return None
    return resolved


def property_question(spec: JsonSchemaFormat, schema: dict[str, Any], name: str,
                      prop: dict[str, Any]) -> AskedQuestion:
    """One property of an object schema: a question named by the property, asked by everything
    from the outside in: the object's ``json_schema`` name (when the client gave one) and
    description, the schema's title and description, the property's title and description, or
    its name when it has neither."""
    where = f"{FORMAT}.schema.properties.{name}"
    check_id(name, field=where)
    given_name = spec.name if "name" in spec.model_fields_set else None
    own = [_text(prop, "title"), _text(prop, "description")]
    text = question_text(name, [given_name, spec.description, _text(schema, "title"),
                                _text(schema, "description"), *own])
    # A property with no text of its own is asked by its name, after what the object says:
    # two such properties of one object must not read (or be cached) as one question.
    named = "" if question_text(name, own) else name
    return AskedQuestion(name, "\n".join(filter(None, [text, named])), prop["enum"],
                         f"{where}.enum")


def _text(node: dict[str, Any], key: str) -> str | None:
    """A title or description as it is asked: text as given, anything else as its ``str()``."""
    value = node.get(key)
    return None if value is None else str(value)


def enum_kind(values: Any) -> Literal["string", "integer"] | None:
    """What a json_schema enum is a set of: strings, integers, or (None) anything else, which
    is passed through. Not a list at all is "string", so that the option check names the field."""
    if not isinstance(values, list) or all(isinstance(v, str) for v in values):
        return "string"
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return "integer"
    return None


def resolve(root: dict[str, Any], prop: Any) -> Any:
    """A property with its local ``$ref`` (``#/$defs/X``, as the OpenAI SDK writes an Enum field
    of a pydantic model) replaced by the definition; sibling keys (a description) win."""
    if not isinstance(prop, dict) or not isinstance(prop.get("$ref"), str):
        return prop
    *parents, name = prop["$ref"].removeprefix("#/").split("/")
    if not prop["$ref"].startswith("#/") or len(parents) != 1:
        return prop
    definitions = root.get(parents[0])
    target = definitions.get(name) if isinstance(definitions, dict) else None
    if not isinstance(target, dict):
        return prop
    return {**target, **{k: v for k, v in prop.items() if k != "$ref"}}


def check_id(question_id: str, *, field: str, schema_name: bool = False) -> None:
    # ':' and newlines would blur the decision log and anything else built from ids.
    valid = bool(question_id.strip()) and not any(c in question_id for c in ":\r\n")
    if schema_name:
        valid = valid and _SCHEMA_NAME.fullmatch(question_id) is not None
    if not valid:
        rule = "letters, digits, '_' and '-', 1 to 64" if schema_name else "non-empty, no ':' or newline"
        raise InvalidRequest(f"{field}: {question_id!r} is not a valid question id ({rule})",
                             field=field)


def split_conversation(conversation: Sequence[Turn]) -> tuple[str, str]:
    """(context, state). The state is the last user message, the text a classifier trained on
    raw texts reads. Everything else is part of what is asked, so the context holds it: the
    system and developer messages, then every other turn as a ``role: text`` line."""
    last = max((i for i, (role, text) in enumerate(conversation)
                if role == "user" and text.strip()), default=None)
    if last is None:
        raise InvalidRequest(
            "messages: a decision needs a user message with text (the state)", field="messages")
    system = [text for role, text in conversation if role in ("system", "developer")]
    turns = [f"{role}: {text}" for i, (role, text) in enumerate(conversation)
             if i != last and role not in ("system", "developer")]
    return "\n\n".join(system + (["\n".join(turns)] if turns else [])), conversation[last][1]
