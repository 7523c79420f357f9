"""Text that cannot leave the process as UTF-8 or as an HTTP header, stopped at the edge.

A JSON body may carry a lone UTF-16 surrogate (``"\\ud800"``): Python decodes it into a ``str``
that no UTF-8 encoder accepts, so hashing, logging or forwarding it fails deep inside (a 500, or a
503 blamed on the upstream). It is refused once, here, as a 400 naming the field. Header values
built from text we do not control (an upstream's error message) lose CR, LF and other control
characters, which would otherwise split the header or make the server drop the response."""

from __future__ import annotations

import re
from typing import Any

import orjson

_NOT_HEADER_SAFE = re.compile(r"[^\x20-\x7e]")  # visible ASCII and space only (RFC 9110 field-vchar)


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


def surrogate_message(field: str) -> str:
    return (f"{field}: contains a lone UTF-16 surrogate (such as \\ud800), which is not valid "
            "Unicode text; send valid UTF-8")


def header_safe(text: str) -> str:
    """``text`` as a header value: non-ASCII and control characters (CR, LF, tab...) become '?'
    or a space, so no client-influenced text can split a header or make the reply unsendable."""
    return _NOT_HEADER_SAFE.sub(lambda m: " " if m.group() in "\r\n\t" else "?", text)


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _printable(key: Any) -> str:
    return str(key).encode("utf-8", "backslashreplace").decode("utf-8")
