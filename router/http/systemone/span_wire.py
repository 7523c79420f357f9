"""Span questions (``span`` / ``spans``) on the System One wire, validated with the example
server's rules and messages: criteria an object with ``max_tokens`` (1 to 96; 24 for ``span``,
64 for ``spans`` by default) and ``max_items`` (1 to 64, 16 by default); no ``depends_on`` or
``ask_if`` on a span question, and none on one; a state with text to point into."""

from __future__ import annotations

import json
from typing import Any

from router.backends.spans import (
    MAX_ITEMS,
    MAX_ITEMS_CAP,
    MAX_TOKENS_CAP,
    SPAN_MAX_TOKENS,
    SPANS_MAX_TOKENS,
    SpanQuestion,
    SpanState,
)
from router.http.systemone.errors import SystemOneError

SPAN_KINDS = ("span", "spans")


class SpanSchemaError(SystemOneError):
    """A span question the example server refuses: 422 ``validation_error``."""


def span_question(raw_id: str, raw: Any, *, allowed: bool) -> SpanQuestion | None:
    """The span question ``raw`` is, validated; None when it is another kind of question."""
    if not isinstance(raw, dict) or raw.get("type") not in SPAN_KINDS:
        return None
    qid = raw_id.strip()
    kind = raw["type"]
    where, field = f"question '{qid}'", f"questions.{qid}"
    if not qid or ":" in qid or "\n" in qid or "\r" in qid:
        raise SpanSchemaError(f"{where}: ids must be non-empty after trimming, with no ':' or "
                              "newline", field="questions")
    if not allowed:
        raise SpanSchemaError(f"{where}: {kind} questions are answered on /v1/systemone only",
                              field=f"{field}.type")
    given = _criteria(raw.get("criteria"), kind, where, field)
    if raw.get("depends_on") or raw.get("ask_if"):
        raise SpanSchemaError(f"{where}: a span question cannot depend on another question",
                              field=f"{field}.depends_on")
    instructions = raw.get("instructions", "")
    return SpanQuestion(
        id=qid, kind=kind,
        instructions=instructions if isinstance(instructions, str) else json.dumps(instructions),
        max_tokens=given.get("max_tokens", SPAN_MAX_TOKENS if kind == "span" else SPANS_MAX_TOKENS),
        max_items=given.get("max_items", MAX_ITEMS),
        given=tuple(given.items()))


def _criteria(criteria: Any, kind: str, where: str, field: str) -> dict[str, int]:
    """The criteria given (``max_tokens``, ``max_items``), checked."""
    if criteria is not None and not isinstance(criteria, dict):
        raise SpanSchemaError(f'{where}: {kind} criteria must be an object, e.g. '
                              '{"max_tokens": 24}', field=f"{field}.criteria")
    given = {k: criteria[k] for k in ("max_tokens", "max_items") if criteria and k in criteria}
    for key, cap in (("max_tokens", MAX_TOKENS_CAP), ("max_items", MAX_ITEMS_CAP)):
        value = given.get(key)
        if key in given and (isinstance(value, bool) or not isinstance(value, int)
                             or not 1 <= value <= cap):
            raise SpanSchemaError(f"{where}: {key} must be 1 to {cap}",
                                  field=f"{field}.criteria.{key}")
    return given


def span_text_problem(state: Any) -> str | None:
    """Why span questions cannot be asked about ``state`` (no text to point into), or None."""
    text = state if isinstance(state, str) else json.dumps(state, ensure_ascii=False)
    if not SpanState(value=state, text=text).source.strip():
        return "a span question needs a text state to point into"
    return None
