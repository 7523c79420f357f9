"""``POST /v1/systemone``: the System One decision protocol as the vLLM example server speaks it,
answered through the routing service. Errors use that server's dialect, not OpenAI's."""

from __future__ import annotations

import time
from collections.abc import Sequence

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from policies.types import Decision, DecisionRequest
from router.wire.systemone import decode_body, parse_request
from router.wire.systemone_answers import render_response, run_stages


def make_router() -> APIRouter:
    """The System One routes. The handler reads ``app.state.settings`` (limits, namespace) and
    ``app.state.service`` (a RoutingService) at request time, so one router fits any app.

    Errors are raised, not rendered here: the app's one error mapping answers every path under
    ``/v1/systemone`` as ``{"error": {"message", "type"}}`` (422 ``validation_error`` for schema
    errors, 400 ``invalid_request_error`` for a body that is not JSON), and its gate has already
    refused bodies over ``max_body_bytes`` and set the caller's cache namespace."""
    router = APIRouter()

    @router.post("/v1/systemone", tags=["systemone"])
    async def systemone(request: Request) -> JSONResponse:
        started = time.perf_counter()
        settings = request.app.state.settings
        parsed = parse_request(
            decode_body(await request.body(), content_type=request.headers.get("content-type")),
            max_questions=settings.max_questions,
            max_options=settings.max_options,
        )
        service = request.app.state.service
        namespace = getattr(request.state, "namespace", None) or settings.cache.namespace

        async def decide(requests: Sequence[DecisionRequest]) -> list[Decision]:
            return list(await service.decide(requests, namespace=namespace, messages=None))

        outcome = await run_stages(parsed, decide)
        total_ms = (time.perf_counter() - started) * 1e3
        return JSONResponse(render_response(parsed, outcome, total_ms=total_ms))

    return router
