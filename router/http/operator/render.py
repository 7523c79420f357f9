"""The operator page's HTML: Jinja2 templates beside this module, escaped by default, with one
nonce per response for its inline style and script, which its Content-Security-Policy allows
and nothing else: the page loads no asset from anywhere, so it works offline."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from starlette.responses import HTMLResponse

from router.http.operator.sessions import PREFIX


@cache
def environment() -> Environment:
    env = Environment(loader=FileSystemLoader(Path(__file__).parent / "templates"),
                      autoescape=True, undefined=StrictUndefined, trim_blocks=True,
                      lstrip_blocks=True)
    env.globals.update(prefix=PREFIX, share=share, num=num, when=when)
    return env


def html(template: str, *, status_code: int = 200, **context: Any) -> HTMLResponse:
    nonce = secrets.token_urlsafe(16)
    body = environment().get_template(template).render(nonce=nonce, **context)
    return HTMLResponse(body, status_code=status_code, headers={
        "content-security-policy": (
            f"default-src 'none'; style-src 'nonce-{nonce}'; script-src 'nonce-{nonce}'; "
            "img-src data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
        "cache-control": "no-store",
        "referrer-policy": "no-referrer",
        "x-content-type-options": "nosniff",
        "x-frame-options": "DENY",
    })


def share(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def when(epoch_s: float) -> str:
    return f"{datetime.fromtimestamp(epoch_s, UTC):%Y-%m-%d %H:%M:%S}Z"
