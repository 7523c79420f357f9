"""Text that cannot leave the process as UTF-8 or as an HTTP header, stopped at the edge.

A JSON body may carry a lone UTF-16 surrogate (``"\\ud800"``): Python decodes it into a ``str``
that no UTF-8 encoder accepts, so hashing, logging or forwarding it fails deep inside (a 500, or a
503 blamed on the upstream). It is refused once, here, as a 400 naming the field. Header values
built from text we do not control (an upstream's error message) lose CR, LF and other control
characters, which would otherwise split the header or make the server drop the response; a list
of ids goes out whole or not at all.
JSON nested deeper than ``MAX_JSON_DEPTH`` that slotgate must parse is refused before any parser
recurses into it: Python's ``json`` gives up near 1,000 levels with a RecursionError, pydantic's
serializer near 255. ``holds_array`` tells, without parsing, whether JSON text is such (a System
One schema in a chat message) or a document slotgate only forwards."""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

_NOT_HEADER_SAFE = re.compile(r"[^\x20-\x7e]")  # visible ASCII and space only (RFC 9110 field-vchar)
MAX_JSON_DEPTH = 128  # levels of arrays and objects in a body, or in JSON text a field carries
# A JSON string (escapes included) or one of the punctuation marks that give JSON its structure.
_JSON_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[][{}:,]')
MAX_HEADER_CHARS = 1024  # a header value built from client text is cut here (ending "...")


def lone_surrogate_field(payload: Any) -> str | None:
    """The dotted path of the first string (or key) in ``payload`` holding a lone surrogate, or
    None. orjson refuses such strings in C, so the common case costs one encode; only a payload
    orjson refuses for some reason is walked (iteratively: 10,000-level nesting is legal input)."""
    try:
        orjson.dumps(payload)
        return None
    except TypeError:  # orjson.JSONEncodeError: a surrogate, or something else orjson refuses
        pass
    stack: list[tuple[Any, str]] = [(payload, "")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            if not _utf8(value):
                return path or "body"
        elif isinstance(value, dict):
            items = list(value.items())
            for key, item in reversed(items):  # reversed: the stack then visits in document order
                name = f"{path}.{_printable(key)}" if path else _printable(key)
                if isinstance(key, str) and not _utf8(key):
                    return name
                stack.append((item, name))
        elif isinstance(value, list):
            stack.extend((item, f"{path}.{i}" if path else str(i))
                         for i, item in reversed(list(enumerate(value))))
    return None


def too_deep_field(body: bytes, *, max_depth: int = MAX_JSON_DEPTH) -> str | None:
    """Where the JSON ``body`` nests deeper than ``max_depth`` (its first three path parts, or
    ``body``), or None; also None for a body that is not JSON (the route's parser says so). A
    body with no more brackets than ``max_depth`` cannot nest deeper: the common case is two
    byte counts; only other bodies are parsed (orjson, in C, to 1,024 levels) and walked."""
    if body.count(b"[") + body.count(b"{") <= max_depth:
        return None
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return "body" if "depth limit" in str(exc) else None
    stack: list[tuple[Any, tuple[str, ...], int]] = [(payload, (), 0)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth >= max_depth:
                return ".".join(path[:3]) or "body"
            items = value.items() if isinstance(value, dict) else enumerate(value)
            stack.extend((item, (*path, _printable(key)) if len(path) < 3 else path, depth + 1)
                         for key, item in items)
    return None


def holds_array(text: str, key: str) -> bool:
    """Whether the JSON text ``text`` is an object whose ``key`` holds an array, read from its
    top-level tokens in linear time without parsing any value: nesting at any depth costs
    nothing (``text`` need not be valid JSON; what is not an object is False)."""
    stripped = text.lstrip()
    if not stripped.startswith("{"):
        return False
    depth, previous, name = 0, "", None
    for match in _JSON_TOKEN.finditer(stripped):
        token = match.group()
        if depth == 1:
            if token == ":" and previous.startswith('"'):
                name = previous
            elif name is not None:  # the first token of the value after "name":
                if token == "[" and _decoded(name) == key:
                    return True
                name = None
            previous = token
        if token in ("{", "["):
            depth += 1
        elif token in ("}", "]"):
            depth -= 1
            if depth <= 0:
                return False
    return False


def depth_message(field: str) -> str:
    return f"{field}: JSON nested more than {MAX_JSON_DEPTH} levels deep"


def surrogate_message(field: str) -> str:
    return (f"{field}: contains a lone UTF-16 surrogate (such as \\ud800), which is not valid "
            "Unicode text; send valid UTF-8")


def header_safe(text: str) -> str:
    """``text`` as a header value: non-ASCII and control characters (CR, LF, tab...) become '?'
    or a space, and past ``MAX_HEADER_CHARS`` it is cut (ending "..."), so no client-influenced
    text can split a header or make the reply unsendable (the whole text is in the body)."""
    if len(text) > MAX_HEADER_CHARS:
        text = text[:MAX_HEADER_CHARS - 3] + "..."
    return _NOT_HEADER_SAFE.sub(lambda m: " " if m.group() in "\r\n\t" else "?", text)


def header_whole(text: str) -> str | None:
    """``text`` as a header value when it is one as it stands (visible ASCII, at most
    ``MAX_HEADER_CHARS``), else None: for lists of ids, where a cut or altered value would name
    ids that do not exist, so the header is left out and the body carries them all."""
    if len(text) > MAX_HEADER_CHARS or _NOT_HEADER_SAFE.search(text):
        return None
    return text


def _decoded(token: str) -> str | None:
    """A JSON string token's text; None for one that is not valid JSON (a bad escape)."""
    try:
        return str(json.loads(token))
    except ValueError:
        return None


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _printable(key: Any) -> str:
    return str(key).encode("utf-8", "backslashreplace").decode("utf-8")
