"""The bytes of a System One body to its JSON payload and images: a JSON body, or a multipart
form whose ``request`` part holds the JSON and whose image file parts are images, in order (the
stdlib MIME parser reads it: no python-multipart needed)."""

from __future__ import annotations

import base64
import json
from email import policy as email_policy
from email.parser import BytesParser
from typing import Any

from router.http.systemone.errors import InvalidBody
from router.http.text_guard import lone_surrogate_field, surrogate_message


def decode_body(body: bytes, *, content_type: str | None) -> tuple[Any, list[str]]:
    """The JSON payload of a body (the whole body, or a multipart form's ``request`` part) and
    the form's images as data URLs."""
    media = (content_type or "").split(";")[0].strip().lower()
    images: list[str] = []
    if media == "multipart/form-data":
        body, images = _form(body, content_type or "")
    try:
        payload = json.loads(body, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError included
        raise InvalidBody(f"invalid body: {exc}") from exc
    field = lone_surrogate_field(payload)
    if field is not None:
        raise InvalidBody(surrogate_message(field), field=field)
    return payload, images


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _form(body: bytes, content_type: str) -> tuple[bytes, list[str]]:
    """The ``request`` part of a multipart form and its image parts (``image/*``) as data URLs,
    in order; any other part is a 400, as the server answers it."""
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode("latin-1", "replace")
    message = BytesParser(policy=email_policy.HTTP).parsebytes(head + body)
    if not message.is_multipart():
        raise InvalidBody("invalid body: multipart needs a part named request holding the JSON body")
    found: bytes | None = None
    images: list[str] = []
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        data = payload if isinstance(payload, bytes) else b""
        if name == "request" and found is None:
            found = data
        elif part.get_content_type().startswith("image/"):
            images.append(f"data:{part.get_content_type()};base64,"
                          + base64.b64encode(data).decode())
        else:
            raise InvalidBody(f"invalid body: part {name!r}: neither the request JSON nor an "
                              "image")
    if found is None:
        raise InvalidBody("invalid body: multipart needs a part named request holding the JSON body")
    return found, images
