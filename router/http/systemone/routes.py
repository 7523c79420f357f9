"""``POST /v1/systemone``: the System One decision protocol as the vLLM example server speaks it,
answered through the routing service. Errors use that server's dialect, not OpenAI's."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from policies.types import summary_route
from router.http.state import app_state, namespace
from router.http.systemone.answers import render_response
from router.http.systemone.body import decode_body
from router.http.systemone.wire import parse_request
from router.routing.stages import answer_stages


def make_router() -> APIRouter:
    """The System One routes. The handler reads the app's settings (limits) and routing service
    through ``app_state`` at request time, so one router fits any app.

    Errors are raised, not rendered here: the app's one error mapping answers every path under
    ``/v1/systemone`` as ``{"error": {"message", "type"}}`` (422 ``validation_error`` for schema
    errors, 400 ``invalid_request_error`` for a body that is not JSON), and its gate has already
    refused bodies over ``max_body_bytes`` and set the caller's cache namespace."""
    router = APIRouter()

    @router.post("/v1/systemone", tags=["systemone"], openapi_extra=_openapi_body())
    async def systemone(request: Request) -> JSONResponse:
        started = time.perf_counter()
        state = app_state(request)
        settings = state.settings
        parsed = parse_request(
            decode_body(await request.body(), content_type=request.headers.get("content-type")),
            max_questions=settings.max_questions,
            max_options=settings.max_options,
        )
        service, caller = state.service, namespace(request)
        outcome = await answer_stages(service, parsed.staged(), namespace=caller)
        # One label per request, as on the OpenAI surface: the least verified route taken.
        state.metrics.request(surface="systemone",
                              route=summary_route(outcome.decisions.values()))
        total_ms = (time.perf_counter() - started) * 1e3
        return JSONResponse(render_response(parsed, outcome, total_ms=total_ms,
                                            engine=f"slotgate:{service.backend.name}"))

    return router


def _openapi_body() -> dict[str, Any]:
    """The request body for /docs and schema-driven tests (the parser is the authority)."""
    question = {
        "type": "object",
        "required": ["type"],
        "properties": {
            "type": {"enum": ["noul", "bool", "boolean", "choice", "score"]},
            "instructions": {"type": "string"},
            "criteria": {"anyOf": [
                {"type": "object", "additionalProperties": {"type": ["string", "null"]}},
                {"type": "array", "items": {"type": "string"}},
            ]},
            "depends_on": {"type": "array", "items": {"type": "string"}},
            "ask_if": {"type": "object", "additionalProperties": {
                "type": "array", "minItems": 1, "items": {"type": "string"}}},
            "policy": {"type": "string"},
            "alone": {"type": "boolean"},
        },
    }
    body = {
        "type": "object",
        "required": ["state", "questions"],
        "properties": {
            "model": {"type": "string"},
            "state": {},
            "questions": {"type": "object", "minProperties": 1, "additionalProperties": question},
            "instructions": {"type": "string"},
            "samples": {"anyOf": [{"const": "auto"}, {"type": "integer", "minimum": 1}]},
            "seed": {"type": "integer"},
            "ask": {"type": "array", "items": {"type": "string"}},
            "policy": {"type": "string"},
            # The example server's engine knobs, forwarded to a System One fast backend.
            "steps": {"type": "integer"},
            "think": {"type": "integer", "minimum": 0, "maximum": 4096},
            "chunk_rows": {"type": "integer", "minimum": 8},
            "chunk_prompt": {"enum": ["shared", "own"]},
            "auto_max": {"type": "integer"},
            "auto_threshold": {"type": "number"},
            "sequential": {"type": "boolean"},
        },
    }
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": body}}}}
