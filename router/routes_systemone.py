"""``POST /v1/systemone``: the System One decision protocol as the vLLM example server speaks it,
answered through the routing service. Errors use that server's dialect, not OpenAI's."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from policies.types import Decision, DecisionRequest
from router.errors import PayloadTooLarge, SlotgateError, TooManyRequests
from router.wire.systemone import decode_body, parse_request
from router.wire.systemone_answers import render_response, run_stages


def make_router() -> APIRouter:
    """The System One routes. The handler reads ``app.state.settings`` (limits, namespace) and
    ``app.state.service`` (a RoutingService) at request time, so one router fits any app."""
    router = APIRouter()

    @router.post("/v1/systemone", tags=["systemone"])
    async def systemone(request: Request) -> JSONResponse:
        started = time.perf_counter()
        settings = request.app.state.settings
        try:
            body = await _read_body(request, max_body_bytes=settings.max_body_bytes)
            parsed = parse_request(
                decode_body(body, content_type=request.headers.get("content-type")),
                max_questions=settings.max_questions,
                max_options=settings.max_options,
            )
            service = request.app.state.service
            namespace = getattr(request.state, "namespace", None) or settings.cache.namespace

            async def decide(requests: Sequence[DecisionRequest]) -> list[Decision]:
                return list(await service.decide(requests, namespace=namespace, messages=None))

            outcome = await run_stages(parsed, decide)
        except SlotgateError as exc:
            return error_response(exc)
        total_ms = (time.perf_counter() - started) * 1000.0
        return JSONResponse(render_response(parsed, outcome, total_ms=total_ms))

    return router


def error_response(exc: SlotgateError) -> JSONResponse:
    """``{"error": {"message", "type"}}`` with the error's status (and ``field`` when known)."""
    error: dict[str, Any] = {"message": exc.message, "type": exc.error_type}
    if exc.field is not None:
        error["field"] = exc.field
    headers = {}
    retry_after_s = getattr(exc, "retry_after_s", None)
    if isinstance(exc, TooManyRequests) or retry_after_s is not None:
        headers["Retry-After"] = str(max(1, round(retry_after_s or 1)))
    return JSONResponse({"error": error}, status_code=exc.status_code, headers=headers)


async def _read_body(request: Request, *, max_body_bytes: int) -> bytes:
    """The body, refused with 413 as soon as it is known to be too large (header or bytes read)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_body_bytes:
        raise PayloadTooLarge(
            f"body is {declared} bytes; the limit is {max_body_bytes}", field="body"
        )
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_body_bytes:
            raise PayloadTooLarge(f"body exceeds the limit of {max_body_bytes} bytes", field="body")
        chunks.append(chunk)
    return b"".join(chunks)
