"""The bytes of a System One body to its JSON payload: a JSON body, or a multipart form whose
``request`` part holds the JSON (the stdlib MIME parser reads it: no python-multipart needed)."""

from __future__ import annotations

import json
from email import policy as email_policy
from email.parser import BytesParser
from typing import Any

from router.http.systemone.errors import InvalidBody, SystemOneError
from router.http.text_guard import lone_surrogate_field, surrogate_message


def decode_body(body: bytes, *, content_type: str | None) -> Any:
    """The JSON payload of a body: the whole body, or a multipart form's ``request`` part."""
    media = (content_type or "").split(";")[0].strip().lower()
    if media == "multipart/form-data":
        body = _request_part(body, content_type or "")
    try:
        payload = json.loads(body, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError included
        raise InvalidBody(f"invalid body: {exc}") from exc
    field = lone_surrogate_field(payload)
    if field is not None:
        raise InvalidBody(surrogate_message(field), field=field)
    return payload


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _request_part(body: bytes, content_type: str) -> bytes:
    """The ``request`` part of a multipart form; image parts are refused, other parts are 400."""
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode("latin-1", "replace")
    message = BytesParser(policy=email_policy.HTTP).parsebytes(head + body)
    if not message.is_multipart():
        raise InvalidBody("invalid body: a multipart form needs a 'request' part")
    found: bytes | None = None
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if name == "request" and found is None:
            payload = part.get_payload(decode=True)
            found = payload if isinstance(payload, bytes) else b""
        elif part.get_filename() is not None or name in ("image", "images"):
            raise SystemOneError("images: slotgate reads text state only; send no image parts",
                                 field="images")
        else:
            raise InvalidBody(f"invalid body: unexpected form part {name!r}")
    if found is None:
        raise InvalidBody("invalid body: a multipart form needs a 'request' part")
    return found
