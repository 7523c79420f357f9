"""The stand-in System One server's span reads, thoughts and images, following the example server
(mmastrac/djev ``structured_server.py`` at 28b1e26) where a client sees it: span criteria and
their 422s, answers that are substrings of the text at their offsets (the state when it is a
string, else its ``"text"`` field, else the state's JSON text), the answer shapes, a text state
required, ``diagnostics.thought`` for ``think``, images as data URLs or multipart file parts.

The stand-in has no model that copies spans: it reads the question's instructions for a kind of
value it knows (a date, an amount, an id, an email; else a word of the instructions that the
text holds) and finds it in the text. A found value reads with ``SPAN_CONFIDENCE``; the
instruction ``"unsure"`` reads with ``UNSURE_CONFIDENCE`` (three reads, as the server re-reads
under 0.3)."""

from __future__ import annotations

import base64
import json
import re
from email import policy as email_policy
from email.parser import BytesParser
from typing import Any

SPAN_KINDS = ("span", "spans")
SPAN_CONFIDENCE = 0.87
UNSURE_CONFIDENCE = 0.2
MIN_CONFIDENCE = 0.3
MAX_READS = 3
BYTES_PER_TOKEN = 3
_KINDS_OF_VALUE = (
    (("date",), r"\d{4}-\d{2}-\d{2}"),
    (("amount", "total", "price"), r"\$\d[\d,]*(?:\.\d+)?"),
    (("email",), r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+"),
    (("id", "number", "reference"), r"[A-Z]+-\d+"),
)


class StandinSchemaError(Exception):
    """A request the example server answers with 422."""


def span_config(qid: str, question: dict[str, Any]) -> dict[str, int]:
    """``max_tokens`` and ``max_items`` of a span question, checked as the server checks them."""
    kind, criteria = question["type"], question.get("criteria")
    if criteria is not None and not isinstance(criteria, dict):
        raise StandinSchemaError(f"question {qid!r}: {kind} criteria must be an object, "
                                 'e.g. {"max_tokens": 24}')
    config = {"max_tokens": (criteria or {}).get("max_tokens", 24 if kind == "span" else 64),
              "max_items": (criteria or {}).get("max_items", 16)}
    for key, cap in (("max_tokens", 96), ("max_items", 64)):
        value = config[key]
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= cap:
            raise StandinSchemaError(f"question {qid!r}: {key} must be 1 to {cap}")
    if question.get("depends_on") or question.get("ask_if"):
        raise StandinSchemaError(f"question {qid!r}: a span question cannot depend on another "
                                 "question")
    return config


def span_source(state: Any, state_text: str) -> str:
    if isinstance(state, str):
        return state
    if isinstance(state, dict) and isinstance(state.get("text"), str):
        return str(state["text"])
    return state_text


def answer_span(question: dict[str, Any], source: str) -> dict[str, Any]:
    """The server's answer shape for one span question about ``source``."""
    matches = _matches(question["instructions"], source)
    if question["type"] == "spans":
        items = [{"text": source[a:b], "start": a, "end": b, "confidence": SPAN_CONFIDENCE,
                  "coverage": 0.99} for a, b in matches[:question["span"]["max_items"]]]
        return {"type": "spans", "found": bool(items), "items": items, "reads": 2}
    unsure = question["instructions"].strip() == "unsure"
    confidence = UNSURE_CONFIDENCE if unsure else SPAN_CONFIDENCE
    reads = MAX_READS if confidence < MIN_CONFIDENCE else 1
    if not matches:
        return {"type": "span", "found": False, "text": None, "start": None, "end": None,
                "confidence": confidence, "coverage": 0.95, "reads": reads}
    a, b = matches[0]
    return {"type": "span", "found": True, "text": source[a:b], "start": a, "end": b,
            "confidence": confidence, "coverage": 0.99, "reads": reads}


def _matches(instructions: str, source: str) -> list[tuple[int, int]]:
    words = re.findall(r"[a-z]+", instructions.lower())
    for names, pattern in _KINDS_OF_VALUE:
        if any(name in words for name in names):
            return [m.span() for m in re.finditer(pattern, source)]
    for word in sorted(words, key=len, reverse=True):
        found = re.search(rf"\b{re.escape(word)}\b", source, re.IGNORECASE)
        if found and len(word) > 3:
            return [found.span()]
    return []


def thought(think: int, state_text: str) -> dict[str, Any] | None:
    """``diagnostics.thought`` for a ``think`` budget: the text, its tokens, whether the model
    closed the channel itself, the generation time (None for no thought)."""
    if not think:
        return None
    text = f"The state reads: {state_text}"[:think * BYTES_PER_TOKEN]
    return {"tokens": -(-len(text.encode()) // BYTES_PER_TOKEN),
            "closed": len(text) < think * BYTES_PER_TOKEN, "ms": 0.0, "text": text}


def json_images(value: Any) -> list[str]:
    """The body's ``images``: data URLs, or objects with content_type and base64 (the server's
    ``jev_images``); returned as data URLs."""
    urls = []
    for i, image in enumerate(value or []):
        if isinstance(image, str) and image.startswith("data:image/"):
            urls.append(image)
        elif (isinstance(image, dict) and str(image.get("content_type", "")).startswith("image/")
              and isinstance(image.get("base64"), str)):
            urls.append(f"data:{image['content_type']};base64,{image['base64']}")
        else:
            raise StandinSchemaError(f"images[{i}]: a data:image/... URL or an object with "
                                     "content_type and base64")
    return urls


def read_form(body: bytes, content_type: str) -> tuple[Any, list[str]]:
    """A multipart body: the JSON of the ``request`` part and each image part as a data URL.
    ValueError for anything else (the server answers 400 ``invalid body``)."""
    message = BytesParser(policy=email_policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + body)
    request, images = None, []
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        data = part.get_payload(decode=True)
        data = data if isinstance(data, bytes) else b""
        if name == "request":
            request = json.loads(data)
        elif part.get_content_type().startswith("image/"):
            images.append(f"data:{part.get_content_type()};base64,"
                          + base64.b64encode(data).decode())
        else:
            raise ValueError(f"part {name!r}: neither the request JSON nor an image")
    if request is None:
        raise ValueError("multipart needs a part named request holding the JSON body")
    return request, images


def slow_span_answer(system: str, user_text: str) -> dict[str, Any] | None:
    """The stand-in LLM's answer to slotgate's span question (``router.routing.spans``): the
    value ``_matches`` finds, with offsets into the state's ``"text"`` field when the question
    says so; None when ``system`` is not a span question."""
    found = re.search(r"^Question: (.*)$", system, re.MULTILINE)
    if found is None or "Offsets are 0-based character offsets" not in system:
        return None
    text = user_text
    if '"text" field' in system:
        text = str(json.loads(user_text).get("text", ""))
    spans = [{"text": text[a:b], "start": a, "end": b} for a, b in _matches(found[1], text)]
    if '"items"' in system:
        return {"items": spans}
    return {"found": True, **spans[0]} if spans else {"found": False}
