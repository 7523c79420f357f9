"""The OpenAI chat-completions subset slotgate speaks: request models, detection of a *decision*
request (an answer constrained to a finite set of strings), and the ``chat.completion`` reply.
The wire stops here: what the routing service needs of a chat goes into ``DecisionRequest``."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from policies.types import Decision, DecisionRequest, Option, Turn, summary_route
from router.errors import Forbidden, InvalidRequest
from router.http.text_guard import header_safe, header_whole

Shape = Literal["enum", "object", "choice"]
_SCHEMA_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's own rule for json_schema.name
_FORMAT = "response_format.json_schema"
# Body fields that would let a client pick the upstream or its credentials (``extra_body`` would
# smuggle any of them): refused on every request, decision or passthrough, with a 403 naming it.
CREDENTIAL_FIELDS = frozenset({
    "api_base", "base_url", "api_key", "api_version", "custom_llm_provider", "extra_headers",
    "headers", "organization", "deployment_id", "litellm_params", "aws_access_key_id",
    "aws_secret_access_key", "vertex_credentials", "azure_ad_token", "extra_body",
})


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class SlotgateOptions(BaseModel):
    """slotgate's own request extension (``extra_body={"slotgate": {...}}`` in the OpenAI SDK)."""

    model_config = ConfigDict(extra="forbid")

    policy: str | None = Field(None, min_length=1, max_length=200)


class ChatCompletionRequest(BaseModel):
    """The fields slotgate reads; every other field is kept and forwarded untouched."""

    model_config = ConfigDict(extra="allow")

    # Optional only for the example server's chat variant (its README's call names none); every
    # other chat request needs it (routes.py answers its absence as pydantic did).
    model: str | None = Field(None, min_length=1)
    messages: list[ChatMessage] = Field(min_length=1)
    response_format: ResponseFormat | None = None
    structured_outputs: dict[str, Any] | None = None  # vLLM: {"choice": [...]} among others
    guided_choice: list[Any] | None = None  # vLLM's older spelling
    stream: bool = False
    n: int | None = None
    slotgate: SlotgateOptions | None = None

    @model_validator(mode="after")
    def _no_client_credentials(self) -> ChatCompletionRequest:
        # Forbidden is not a ValueError, so pydantic lets it through to the app's error mapping
        # as the 403 it is (a ValueError would become a 400 validation error).
        chosen = sorted(CREDENTIAL_FIELDS & set(self.model_extra or {}))
        if chosen:
            raise Forbidden(f"{chosen[0]} cannot be set by clients; the upstream is configured "
                            "by the operator", field=chosen[0])
        return self

    def upstream_body(self) -> dict[str, Any]:
        """The request as the client sent it, minus slotgate's own extension."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True, exclude={"slotgate"})


@dataclass(frozen=True, slots=True)
class DecisionPlan:
    """A chat request recognised as one or more decisions, and how to render the answers."""

    shape: Shape
    requests: list[DecisionRequest]
    # Questions whose enum is a set of integers: decided over the numbers' decimal names and
    # answered as JSON integers, so the content still satisfies the caller's schema.
    integer_questions: frozenset[str] = frozenset()


def plan_decisions(
    body: ChatCompletionRequest, *, max_options: int, max_questions: int
) -> DecisionPlan | None:
    """The decisions a request asks for, or None when it is an ordinary chat (passed through).
    Raises InvalidRequest naming the field when the request is a decision but a malformed one,
    or asks for something a decision reply cannot honour (``logprobs``)."""
    if _forces_tool_call(body):
        return None  # its answer is a tool call, not one of the options: the slow model's job
    found = _find_questions(body, max_questions=max_questions)
    if found is None:
        return None
    shape, questions = found
    if body.n not in (None, 1):
        raise InvalidRequest("n: a decision request has exactly one answer; send n=1", field="n")
    _refuse_logprobs(body)
    turns = _turns(body.messages)
    context, state = _split_turns(turns)
    policy = body.slotgate.policy if body.slotgate else None
    # vLLM's choice lists are strings only; a json_schema enum may also be a set of integers.
    integers = frozenset(qid for qid, _, values, _ in questions
                         if shape != "choice" and _enum_kind(values) == "integer")
    requests = [
        DecisionRequest(
            question_id=qid,
            instructions=instructions,
            options=tuple(Option(_option(v, field=f"{where}.{i}", integer=qid in integers))
                          for i, v in enumerate(_enum(values, where=where, max_options=max_options))),
            state=state,
            context=context,
            policy=policy,
            turns=turns,
        )
        for qid, instructions, values, where in questions
    ]
    return DecisionPlan(shape=shape, requests=requests, integer_questions=integers)


_Question = tuple[str, str, Any, str]  # (question_id, instructions, enum values, field path)


def _forces_tool_call(body: ChatCompletionRequest) -> bool:
    """``tool_choice`` "required" or a named function: the reply must be a tool call, which a
    decision never is, so the request is passed through (honoured) instead of decided."""
    choice = (body.model_extra or {}).get("tool_choice")
    return choice == "required" or isinstance(choice, dict)


def _refuse_logprobs(body: ChatCompletionRequest) -> None:
    """Token log-probabilities of a decision would be invented (no token was sampled): refused,
    pointing at the calibrated probability slotgate does return."""
    extra = body.model_extra or {}
    for name in ("logprobs", "top_logprobs"):
        if extra.get(name) not in (None, False, 0):
            raise InvalidRequest(
                f"{name}: a decision has no token log-probabilities; its calibrated probability "
                "is in the reply's 'slotgate' field (probability, raw_probability). Drop "
                f"{name}, or drop response_format to pass the request to the slow model",
                field=name)


def _find_questions(
    body: ChatCompletionRequest, *, max_questions: int
) -> tuple[Shape, list[_Question]] | None:
    choice = body.guided_choice
    where = "guided_choice"
    if choice is None and body.structured_outputs and "choice" in body.structured_outputs:
        choice, where = body.structured_outputs["choice"], "structured_outputs.choice"
    if choice is not None:
        return "choice", [("choice", "", choice, where)]
    fmt = body.response_format
    if fmt is None or fmt.type != "json_schema" or fmt.json_schema is None:
        return None
    spec = fmt.json_schema
    schema = spec.schema_ or {}
    if "enum" in schema:
        if _enum_kind(schema["enum"]) is None:
            return None  # null, booleans, floats or a mix: not a finite set we decide
        _check_id(spec.name, field=f"{_FORMAT}.name", schema_name=True)
        instructions = str(schema.get("description") or spec.description or spec.name)
        return "enum", [(spec.name, instructions, schema["enum"], f"{_FORMAT}.schema.enum")]
    properties = schema.get("properties")
    if schema.get("type") != "object" or not isinstance(properties, dict) or not properties:
        return None
    properties = {name: _resolve(schema, prop) for name, prop in properties.items()}
    if not all(isinstance(p, dict) and "enum" in p and _enum_kind(p["enum"]) is not None
               for p in properties.values()):
        return None  # structured output of another kind: the slow model's job, unchanged
    if len(properties) > max_questions:
        raise InvalidRequest(
            f"{_FORMAT}.schema.properties: at most {max_questions} questions per request, "
            f"got {len(properties)}", field=f"{_FORMAT}.schema.properties")
    questions = []
    for name, prop in properties.items():
        where = f"{_FORMAT}.schema.properties.{name}"
        _check_id(name, field=where)
        instructions = str(prop.get("description") or prop.get("title") or name)
        questions.append((name, instructions, prop["enum"], f"{where}.enum"))
    return "object", questions


def _enum_kind(values: Any) -> Literal["string", "integer"] | None:
    """What a json_schema enum is a set of: strings, integers, or (None) anything else, which
    is passed through. Not a list at all is "string", so that _enum names the field."""
    if not isinstance(values, list) or all(isinstance(v, str) for v in values):
        return "string"
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return "integer"
    return None


def _resolve(root: dict[str, Any], prop: Any) -> Any:
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


def _check_id(question_id: str, *, field: str, schema_name: bool = False) -> None:
    # ':' and newlines would blur the decision log and anything else built from ids.
    valid = bool(question_id.strip()) and not any(c in question_id for c in ":\r\n")
    if schema_name:
        valid = valid and _SCHEMA_NAME.fullmatch(question_id) is not None
    if not valid:
        rule = "letters, digits, '_' and '-', 1 to 64" if schema_name else "non-empty, no ':' or newline"
        raise InvalidRequest(f"{field}: {question_id!r} is not a valid question id ({rule})",
                             field=field)


def _enum(values: Any, *, where: str, max_options: int) -> list[Any]:
    if not isinstance(values, list):
        raise InvalidRequest(f"{where}: must be a list of strings", field=where)
    if len(values) < 2:
        raise InvalidRequest(
            f"{where}: needs at least two options, got {len(values)}", field=where)
    if len(values) > max_options:
        raise InvalidRequest(
            f"{where}: at most {max_options} options, got {len(values)}", field=where)
    if len(set(map(repr, values))) != len(values):
        raise InvalidRequest(f"{where}: options must be distinct", field=where)
    return values


def _option(value: Any, *, field: str, integer: bool) -> str:
    if integer:
        return str(value)  # an integer enum's option is named by the number (rendered back as one)
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequest(
            f"{field}: options must be non-empty strings, got {json.dumps(value)}", field=field)
    return value


def _turns(messages: Sequence[ChatMessage]) -> tuple[Turn, ...]:
    return tuple((m.role, _text(m, field=f"messages.{i}.content")) for i, m in enumerate(messages))


def _split_turns(conversation: Sequence[Turn]) -> tuple[str, str]:
    """(context, state): system/developer messages are the context, the rest is the state. A lone
    user message is its own text, so a classifier trained on raw texts reads what it was trained on."""
    context = [text for role, text in conversation if role in ("system", "developer")]
    turns = [(role, text) for role, text in conversation if role not in ("system", "developer")]
    if not turns or not any(text.strip() for _, text in turns):
        raise InvalidRequest(
            "messages: a decision needs at least one non-system message with text (the state)",
            field="messages")
    if len(turns) == 1 and turns[0][0] == "user":
        state = turns[0][1]
    else:
        state = "\n".join(f"{role}: {text}" for role, text in turns)
    return "\n\n".join(context), state


def _text(message: ChatMessage, *, field: str) -> str:
    content = message.content
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for j, part in enumerate(content):
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise InvalidRequest(
                f"{field}.{j}: decision requests take text parts only", field=f"{field}.{j}")
        parts.append(part["text"])
    return "\n".join(parts)


def render_reply(
    body: ChatCompletionRequest, plan: DecisionPlan, decisions: Sequence[Decision]
) -> dict[str, Any]:
    """A ``chat.completion`` whose content satisfies the request's schema, plus ``slotgate``."""
    return {
        "id": f"chatcmpl-{decisions[0].decision_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content_of(plan, decisions),
                        "refusal": None},
            "logprobs": None,
            "finish_reason": "stop",
        }],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        "slotgate": routing_facts(decisions),
    }


def content_of(plan: DecisionPlan, decisions: Sequence[Decision]) -> str:
    if plan.shape == "choice":
        return decisions[0].answer or ""  # vLLM answers a choice with the bare text

    def value(d: Decision) -> Any:
        if d.question_id in plan.integer_questions and d.answer is not None:
            return int(d.answer)
        return d.answer

    if plan.shape == "enum":
        return json.dumps(value(decisions[0]), ensure_ascii=False)
    return json.dumps({d.question_id: value(d) for d in decisions}, ensure_ascii=False)


def routing_facts(decisions: Sequence[Decision]) -> dict[str, Any]:
    """The ``slotgate`` object: a summary (the least verified route, the lowest probability) and
    one entry per question."""
    each = [d.facts() for d in decisions]
    if len(each) == 1:
        return {**each[0], "decisions": each}
    notes = [d.note for d in decisions if d.note]
    summary: dict[str, Any] = {
        "route": summary_route(decisions),
        "probability": _min(d.probability for d in decisions),
        "raw_probability": _min(d.raw_probability for d in decisions),
        "threshold": _max(d.threshold for d in decisions),
        "policy_id": ",".join(dict.fromkeys(d.policy_id for d in decisions)),
        "decision_id": ",".join(d.decision_id for d in decisions),
        "latency_ms": max(d["latency_ms"] for d in each),
        "note": "; ".join(dict.fromkeys(notes)) if notes else None,
        "shadow": any(d.shadow for d in decisions),
        "guarantee": ",".join(dict.fromkeys(d.guarantee for d in decisions if d.guarantee))
        or None,
        "decisions": each,
    }
    return summary


def routing_headers(facts: dict[str, Any]) -> dict[str, str]:
    """``x-slotgate-*`` response headers carrying the summary of ``routing_facts``. The id lists
    (``policy_id``, ``decision_id``) are whole or absent (``header_whole``); the note may be cut."""
    headers = {}
    for key in ("route", "probability", "raw_probability", "threshold", "policy_id",
                "decision_id", "latency_ms", "note"):
        value = facts.get(key)
        if value is not None:
            text = f"{value:.6g}" if isinstance(value, float) else str(value)
            header = header_whole(text) if key.endswith("_id") else header_safe(text)
            if header is not None:
                headers[f"x-slotgate-{key.replace('_', '-')}"] = header
    return headers


def _min(values: Any) -> float | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _max(values: Any) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None
