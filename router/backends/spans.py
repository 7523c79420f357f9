"""Span questions (System One ``span`` / ``spans``): a piece of the state's text, as character
offsets, or every such piece. The records every layer shares, the text offsets index (the
example server's rule) and the grounding check an answer from anywhere must pass."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from router.errors import BackendMalformed

SpanKind = Literal["span", "spans"]
# The example server's defaults and bounds (``parse_schema``): the blank in tokens, the items.
SPAN_MAX_TOKENS = 24
SPANS_MAX_TOKENS = 64
MAX_ITEMS = 16
MAX_TOKENS_CAP = 96
MAX_ITEMS_CAP = 64


@dataclass(frozen=True, slots=True)
class SpanQuestion:
    """One span question: ``max_tokens`` is the blank the server reads (its criteria), and
    ``max_items`` the most items of a ``spans`` answer."""

    id: str
    kind: SpanKind
    instructions: str
    max_tokens: int
    max_items: int = MAX_ITEMS
    given: tuple[tuple[str, int], ...] = ()  # the criteria as sent, forwarded as sent

    def criteria(self) -> dict[str, int]:
        return dict(self.given)


@dataclass(frozen=True, slots=True)
class SpanState:
    """What span questions are asked about. ``value``: the state as the client sent it (the
    server takes offsets into it, or into its ``"text"`` field); ``text``: the state as the model
    reads it; ``images``: data URLs shown ahead of it; ``engine``: the engine knobs sent."""

    value: Any
    text: str
    context: str = ""
    seed: int = 42
    images: tuple[str, ...] = ()
    engine: tuple[tuple[str, Any], ...] = ()

    @property
    def source(self) -> str:
        """The text offsets index: the state when it is a string, its ``"text"`` field when it
        holds one, else the state as the model reads it (the server's ``span_source``)."""
        if isinstance(self.value, str):
            return self.value
        if isinstance(self.value, dict) and isinstance(self.value.get("text"), str):
            return str(self.value["text"])
        return self.text


@dataclass(frozen=True, slots=True)
class SpanItem:
    text: str
    start: int
    end: int
    confidence: float = 1.0
    coverage: float = 1.0

    def render(self) -> dict[str, Any]:
        return {"text": self.text, "start": self.start, "end": self.end,
                "confidence": self.confidence, "coverage": self.coverage}


@dataclass(frozen=True, slots=True)
class SpanAnswer:
    """An answer to a span question: for ``span`` at most one item (``found`` False: none), for
    ``spans`` every item. ``confidence`` is the server's (the weakest item's for ``spans``; 1.0
    for the slow model's answer, whose numbers say nothing), ``extra`` the server's other keys
    (``resolved``, ``windows``), passed on."""

    kind: SpanKind
    items: tuple[SpanItem, ...]
    confidence: float
    coverage: float = 1.0
    reads: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def found(self) -> bool:
        return bool(self.items)

    def render(self) -> dict[str, Any]:
        """The example server's shape."""
        if self.kind == "spans":
            return {"type": "spans", "found": self.found,
                    "items": [i.render() for i in self.items], "reads": self.reads,
                    **self.extra}
        first = self.items[0] if self.items else None
        return {"type": "span", "found": self.found,
                "text": first.text if first else None, "start": first.start if first else None,
                "end": first.end if first else None, "confidence": self.confidence,
                "coverage": self.coverage, "reads": self.reads, **self.extra}


def ungrounded(answer: SpanAnswer, source: str) -> str | None:
    """Why ``answer`` is not made of substrings of ``source`` at the offsets it gives (every
    item), or None when it is."""
    for k, item in enumerate(answer.items):
        where = "" if answer.kind == "span" else f"items[{k}] "
        if not 0 <= item.start < item.end <= len(source):
            return (f"{where}offsets [{item.start}, {item.end}) are outside the text "
                    f"({len(source)} characters)")
        if source[item.start:item.end] != item.text:
            return (f"{where}text {item.text!r} is not the text at [{item.start}, {item.end}) "
                    f"({source[item.start:item.end]!r})")
    return None


def parse_server_answer(question: SpanQuestion, answer: Any) -> SpanAnswer:
    """A span answer in the server's shape, checked field by field; BackendMalformed names what
    is wrong."""
    where = f"answers[{question.id!r}]"
    if not isinstance(answer, dict) or answer.get("type") != question.kind:
        raise BackendMalformed(f"{where} is not a {question.kind} answer")
    known = {"type", "found", "text", "start", "end", "confidence", "coverage", "reads", "items"}
    extra = {k: v for k, v in answer.items() if k not in known}
    reads = answer.get("reads", 0)
    if isinstance(reads, bool) or not isinstance(reads, int):
        raise BackendMalformed(f"{where}.reads is not a count")
    if question.kind == "spans":
        raw_items = answer.get("items")
        if not isinstance(raw_items, list):
            raise BackendMalformed(f"{where}.items is not a list")
        items = tuple(_item(f"{where}.items[{k}]", it) for k, it in enumerate(raw_items))
        # An empty list has no confidence to show: 0.0, so no bar accepts it unread.
        return SpanAnswer("spans", items, min((i.confidence for i in items), default=0.0),
                          reads=reads, extra=extra)
    confidence = _number(answer.get("confidence"), f"{where}.confidence")
    coverage = _number(answer.get("coverage"), f"{where}.coverage")
    if answer.get("found") is not True:
        return SpanAnswer("span", (), confidence, coverage, reads, extra)
    item = _item(where, answer)
    return SpanAnswer("span", (item,), confidence, coverage, reads, extra)


def _item(where: str, raw: Any) -> SpanItem:
    if not isinstance(raw, dict) or not isinstance(raw.get("text"), str):
        raise BackendMalformed(f"{where} has no text")
    start, end = raw.get("start"), raw.get("end")
    if (isinstance(start, bool) or not isinstance(start, int)
            or isinstance(end, bool) or not isinstance(end, int)):
        raise BackendMalformed(f"{where} has no integer start and end")
    return SpanItem(raw["text"], start, end,
                    _number(raw.get("confidence", 1.0), f"{where}.confidence"),
                    _number(raw.get("coverage", 1.0), f"{where}.coverage"))


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BackendMalformed(f"{what} is not a finite number: {json.dumps(value)[:40]}")
    return float(value)
