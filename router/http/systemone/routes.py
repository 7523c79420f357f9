"""``POST /v1/systemone``: the System One decision protocol as the vLLM example server speaks it,
answered through the routing service. Errors use that server's dialect, not OpenAI's."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from policies.types import summary_route
from router.http.state import app_state, namespace
from router.http.systemone.answers import render_response
from router.http.systemone.body import decode_body
from router.http.systemone.errors import ImagesRefused
from router.http.systemone.wire import SystemOneRequest, parse_request
from router.routing.service import RoutingService
from router.routing.spans import SpanDecision, SpanRouting
from router.routing.stages import StagedOutcome, answer_stages


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
        payload, form_images = decode_body(await request.body(),
                                           content_type=request.headers.get("content-type"))
        parsed = parse_request(payload, max_questions=settings.max_questions,
                               max_options=settings.max_options, spans=True,
                               form_images=form_images)
        service, caller = state.service, namespace(request)
        if parsed.images:
            _check_slow_sees_images(service)
        outcome, spans = await _answer(service, parsed, caller)
        # One label per request, as on the OpenAI surface: the least verified route taken.
        state.metrics.request(surface="systemone", route=summary_route(
            [*outcome.decisions.values(), *(d.decision for d in spans.values())]))
        total_ms = (time.perf_counter() - started) * 1e3
        return JSONResponse(render_response(parsed, outcome, total_ms=total_ms,
                                            engine=f"slotgate:{service.backend.name}",
                                            spans=spans))

    return router


async def _answer(service: RoutingService, parsed: SystemOneRequest, caller: str
                  ) -> tuple[StagedOutcome, dict[str, SpanDecision]]:
    """The label questions in stages and the span questions beside them, as the server runs
    them; either failing cancels the other."""
    labels = (answer_stages(service, parsed.staged(), namespace=caller) if parsed.questions
              else _no_labels())
    spans = SpanRouting(backend=service.backend, registry=service.registry, slow=service.slow,
                        settings=service.settings, metrics=service.metrics)
    span_answers = (spans.route(parsed.span_state(), parsed.spans) if parsed.spans
                    else _no_spans())
    outcome_task, spans_task = asyncio.ensure_future(labels), asyncio.ensure_future(span_answers)
    try:
        return await outcome_task, await spans_task
    except BaseException:
        for task in (outcome_task, spans_task):
            task.cancel()
        await asyncio.gather(outcome_task, spans_task, return_exceptions=True)
        raise


def _check_slow_sees_images(service: RoutingService) -> None:
    """A 400 naming the slow model when it cannot take images: any question may escalate, and
    the slow model would answer about the text alone."""
    slow = service.slow
    model, supports = getattr(slow, "model", None), getattr(slow, "supports_images", None)
    if model and supports is not None and not supports():
        raise ImagesRefused(
            f"images: the slow model {model} cannot take images (litellm's supports_vision is "
            "false for it), and any question may be escalated to it; send no images, or "
            "configure a slow model that takes them", field="images")


async def _no_labels() -> StagedOutcome:
    return StagedOutcome()


async def _no_spans() -> dict[str, SpanDecision]:
    return {}


def _openapi_body() -> dict[str, Any]:
    """The request body for /docs and schema-driven tests (the parser is the authority)."""
    question = {
        "type": "object",
        "required": ["type"],
        "properties": {
            "type": {"enum": ["noul", "bool", "boolean", "choice", "score", "span", "spans"]},
            "instructions": {"type": "string"},
            "criteria": {"anyOf": [
                {"type": "object", "additionalProperties": {"type": ["string", "null"]}},
                {"type": "array", "items": {"type": "string"}},
                {"type": "object", "properties": {  # span / spans
                    "max_tokens": {"type": "integer", "minimum": 1, "maximum": 96},
                    "max_items": {"type": "integer", "minimum": 1, "maximum": 64}}},
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
            # Shown ahead of the state; multipart image parts are images too.
            "images": {"type": "array", "items": {"anyOf": [
                {"type": "string", "pattern": "^data:image/"},
                {"type": "object", "required": ["content_type", "base64"], "properties": {
                    "content_type": {"type": "string"}, "base64": {"type": "string"}}}]}},
        },
    }
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": body}}}}
