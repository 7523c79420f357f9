"""The OpenAI chat-completions subset slotgate speaks: detection of a *decision* request (an
answer constrained to a finite set of strings; its questions: ``questions.py``, its request
models: ``request.py``), and the ``chat.completion`` reply.
The wire stops here: what the routing service needs of a chat goes into ``DecisionRequest``."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from policies.types import Decision, DecisionRequest, Option, Turn, summary_route
from router.errors import InvalidRequest
from router.http.openai.questions import (
    Shape,
    enum_kind,
    find_questions,
    split_conversation,
)
from router.http.openai.request import (
    CREDENTIAL_FIELDS,
    ChatCompletionRequest,
    ChatMessage,
    JsonSchemaFormat,
    ResponseFormat,
    SlotgateOptions,
)
from router.http.text_guard import header_safe, header_whole

__all__ = ["CREDENTIAL_FIELDS", "ChatCompletionRequest", "ChatMessage", "DecisionPlan",
           "JsonSchemaFormat", "ResponseFormat", "SlotgateOptions", "content_of",
           "plan_decisions", "render_reply", "routing_facts", "routing_headers"]

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
    found = find_questions(body, max_questions=max_questions)
    if found is None:
        return None
    shape, questions = found
    if body.n not in (None, 1):
        raise InvalidRequest("n: a decision request has exactly one answer; send n=1", field="n")
    _refuse_logprobs(body)
    turns = _turns(body.messages)
    context, state = split_conversation(turns)
    policy = body.slotgate.policy if body.slotgate else None
    # vLLM's choice lists are strings only; a json_schema enum may also be a set of integers.
    integers = frozenset(q.question_id for q in questions
                         if shape != "choice" and enum_kind(q.values) == "integer")
    requests = [
        DecisionRequest(
            question_id=q.question_id,
            instructions=q.instructions,
            options=tuple(
                Option(_option(v, field=f"{q.where}.{i}", integer=q.question_id in integers))
                for i, v in enumerate(_enum(q.values, where=q.where, max_options=max_options))),
            state=state,
            context=context,
            policy=policy,
            turns=turns,
        )
        for q in questions
    ]
    return DecisionPlan(shape=shape, requests=requests, integer_questions=integers)


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
