"""The vLLM example server's own OpenAI-shaped decision call on ``POST /v1/chat/completions``:
exactly two messages, the system (or developer) one the question schema as JSON
(``{"questions": [{"id", "type", "instructions", "options" | "levels" | "criteria"}, ...],
"instructions", "samples", ...}``) and the user one the state as JSON. A client written for that
server works unchanged: the body is recognised here, answered through the System One flow, and
the reply is the server's ``chat.completion`` whose ``content`` is the JSON answer set.

Errors are 400 ``invalid_request_error``, as the server answers them on this route.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from policies.types import Decision
from router.errors import InvalidRequest
from router.http.openai.request import ChatCompletionRequest
from router.http.systemone.answers import calibrated_distribution, diagnostics
from router.http.systemone.wire import (
    ENGINE_KNOBS,
    Question,
    SystemOneError,
    SystemOneRequest,
    parse_request,
)
from router.http.text_guard import depth_message, holds_array, too_deep_field
from router.routing.stages import StagedOutcome

SCHEMA_KEYS = ("instructions", "samples", "ask", *ENGINE_KNOBS)
DEFAULT_MODEL = "dgemma-structured"  # the server's name for a reply when the body names none


def schema_payload(body: ChatCompletionRequest) -> dict[str, Any] | None:
    """The System One body a chat request stands for, or None when it is not the server's chat
    variant (then it is an ordinary chat request). Raises InvalidRequest (400) for a variant
    whose state is not JSON."""
    messages = body.messages
    # The server takes any response_format here (``json_object`` is common); a json_schema one
    # is slotgate's own decision shape (router/http/openai/wire.py).
    schema_format = body.response_format is not None and body.response_format.type == "json_schema"
    if (len(messages) != 2 or messages[0].role not in ("system", "developer")
            or messages[1].role != "user" or schema_format
            or body.structured_outputs is not None or body.guided_choice is not None):
        return None
    schema = _json_object(_text(messages[0].content), field="messages.0.content")
    if schema is None or not isinstance(schema.get("questions"), list):
        return None
    state = _text(messages[1].content).strip()
    try:
        _loads(state, field="messages.1.content")
    except ValueError as exc:
        raise InvalidRequest("system must be a JSON question schema and user must be JSON "
                             f"state: {exc}", field="messages.1.content") from exc
    questions: dict[str, Any] = {}
    if not schema["questions"]:
        raise InvalidRequest("schema: needs a non-empty questions array", field="messages.0.content")
    for i, raw in enumerate(schema["questions"]):
        if not isinstance(raw, dict):
            raise InvalidRequest(f"questions.{i}: must be an object", field="messages.0.content")
        qid = str(raw.get("id", "")).strip()
        if qid in questions:
            raise InvalidRequest(f"duplicate question id {qid!r}", field="messages.0.content")
        questions[qid] = _jev_question(raw)
    payload: dict[str, Any] = {k: schema[k] for k in SCHEMA_KEYS if k in schema}
    payload.update(state=state, questions=questions)
    seed = body.model_extra.get("seed") if body.model_extra else None
    if seed is not None:
        payload["seed"] = seed
    return payload


def parse_variant(payload: dict[str, Any], *, max_questions: int, max_options: int) -> SystemOneRequest:
    """The validated request; a schema error is 400 here, as the server answers on this route."""
    try:
        return parse_request(payload, max_questions=max_questions, max_options=max_options)
    except SystemOneError as exc:
        raise InvalidRequest(exc.message, field="messages.0.content") from exc


def render_variant(body: ChatCompletionRequest, request: SystemOneRequest,
                   outcome: StagedOutcome, *, total_ms: float, engine: str) -> dict[str, Any]:
    """The server's reply: a ``chat.completion`` whose content is ``{"answers", "diagnostics"}``."""
    answers = {q.id: (_answer(q, outcome.decisions[q.id]) if q.id in outcome.decisions else None)
               for q in request.questions}
    content = {
        "answers": answers,
        "diagnostics": diagnostics(request, outcome, total_ms=total_ms, engine=engine),
    }
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.model or DEFAULT_MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant",
                                             "content": json.dumps(content, indent=2)},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }


def _answer(question: Question, decision: Decision) -> dict[str, Any] | None:
    """The server's internal answer shape: type, label, confidence, probabilities by name, and
    noul / choice / score (1-based expectation) with level."""
    if decision.answer is None:
        return None
    names = question.answer_names
    proba = calibrated_distribution(names, decision)
    chosen = names.index(decision.answer)
    confidence = proba[chosen] if decision.probability is None else decision.probability
    out: dict[str, Any] = {
        "type": question.kind, "label": _labels(question)[chosen],
        "confidence": 1.0 if decision.escalated else confidence,
        "probabilities": dict(zip(names, proba)),
    }
    if question.kind == "noul":
        out["noul"] = proba[0]
    elif question.kind == "choice":
        out["choice"] = decision.answer
    else:
        out["score"] = sum((i + 1) * p for i, p in enumerate(proba))
        out["level"] = decision.answer
    # The server adds these with several draws; slotgate's read is one distribution (calibrated
    # or the slow model's), so they are null, and present: a client reading them does not break.
    out["stderr"] = None
    out["agreement"] = None
    out["route"] = decision.route
    return out


def _labels(question: Question) -> list[str]:
    n = len(question.options)
    if question.kind == "noul":
        return ["yes", "no"]
    if question.kind == "score" and n <= 9:
        return [str(i + 1) for i in range(n)]
    return [_letters(i) for i in range(n)]


def _letters(i: int) -> str:
    return chr(ord("A") + i) if i < 26 else _letters(i // 26 - 1) + chr(ord("A") + i % 26)


def _jev_question(raw: dict[str, Any]) -> dict[str, Any]:
    kind = raw.get("type")
    # The server prints a chat question's instructions with str(): a Python repr, not JSON.
    out: dict[str, Any] = {"type": kind, "instructions": str(raw.get("instructions", ""))}
    if kind == "choice":
        out["criteria"] = {
            (str(o.get("name")) if isinstance(o, dict) else str(o)):
            (o.get("description") if isinstance(o, dict) else None)
            for o in raw.get("options") or []
        }
    elif kind == "score":
        out["criteria"] = list(raw.get("levels") or [])
    elif "criteria" in raw:
        out["criteria"] = raw["criteria"]
    for key in ("depends_on", "ask_if", "alone"):
        if key in raw:
            out[key] = raw[key]
    return out


def _json_object(text: str, *, field: str) -> dict[str, Any] | None:
    """The JSON object ``text`` holds, or None. Only a schema (an object holding a ``questions``
    array) is slotgate's to parse, so only a schema nested past MAX_JSON_DEPTH is refused; other
    JSON, however deep, makes the body no decision (it passes through unchanged)."""
    try:
        value = _loads(text, field=field)
    except ValueError:
        return None
    except InvalidRequest:
        if holds_array(text, "questions"):
            raise
        return None
    return value if isinstance(value, dict) else None


def _loads(text: str, *, field: str) -> Any:
    """``json.loads``, with JSON nested past MAX_JSON_DEPTH refused first (400 naming ``field``)
    instead of reaching the parser's RecursionError."""
    if too_deep_field(text.encode()) is not None:
        raise InvalidRequest(depth_message(field), field=field)
    return json.loads(text)


def _text(content: str | list[dict[str, Any]] | None) -> str:
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return content or ""
