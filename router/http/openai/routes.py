"""The OpenAI-compatible routes: ``POST /v1/chat/completions`` (decisions routed; everything else
relayed to the System One server that serves its ``model``, else passed to the slow path),
``POST /v1/feedback``, ``GET /v1/models``, and every other ``/v1`` POST (relayed by its model)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from policies.types import summary_route
from router.errors import (
    Forbidden,
    InvalidRequest,
    NoSlowModel,
    PassthroughUnavailable,
    UnprocessableRequest,
)
from router.http.openai.chat_variant import parse_variant, render_variant, schema_payload
from router.http.openai.wire import (
    CREDENTIAL_FIELDS,
    ChatCompletionRequest,
    plan_decisions,
    render_reply,
    routing_headers,
)
from router.http.state import app_state, namespace
from router.http.text_guard import lone_surrogate_field, surrogate_message
from router.http.upstream import ModelNotServed, Upstreams
from router.routing.ports import Label, SlowModel
from router.routing.stages import answer_stages
from router.settings import SlowPathSettings
from router.store.decision_index import labelable, unknown_decision_text


class FeedbackRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    decision_id: str = Field(min_length=1, max_length=128)
    label: str = Field(min_length=1)


class UnknownDecision(InvalidRequest):
    status_code = 404
    error_type = "not_found_error"


def make_router() -> APIRouter:
    router = APIRouter()

    @router.post("/v1/chat/completions", tags=["openai"], response_model=None)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        state = app_state(request)
        settings = state.settings
        await _refuse_lone_surrogates(request)
        variant = schema_payload(body)  # the example server's own chat-shaped decision call
        if variant is not None:
            return await _chat_variant(request, body, variant)
        if body.model is None:  # the variant alone may leave it out, as on the example server
            raise InvalidRequest("model: Field required", field="model")
        plan = plan_decisions(
            body, max_options=settings.max_options, max_questions=settings.max_questions)
        if plan is None:
            relayed = await _relay(request, body.model)
            if relayed is not None:
                return relayed
            await _refuse_unknown_while_lists_fail(state.upstreams, body.model, settings.slow)
            state.metrics.request(surface="openai_passthrough", route="slow")
            return await _passthrough(state.slow, body)
        decisions = await state.service.route(plan.requests, namespace=namespace(request))
        state.metrics.request(surface="openai_decision", route=summary_route(decisions))
        reply = render_reply(body, plan, decisions)
        headers = routing_headers(reply["slotgate"])
        if body.stream:
            stream_options = (body.model_extra or {}).get("stream_options")
            usage = isinstance(stream_options, dict) and bool(stream_options.get("include_usage"))
            return StreamingResponse(_as_events(reply, include_usage=usage),
                                     media_type="text/event-stream", headers=headers)
        return JSONResponse(reply, headers=headers)

    @router.post("/v1/feedback", tags=["slotgate"])
    async def feedback(body: FeedbackRequest, request: Request) -> dict[str, Any]:
        """The true answer of a logged decision (for recalibration: ``slotgate export-log``)."""
        await _refuse_lone_surrogates(request)
        state = app_state(request)
        caller = namespace(request)
        role = state.settings.feedback.role_of(caller)
        if role == "refused":
            raise Forbidden("authorization: this API key may not label decisions "
                            "(feedback.roles)", field="authorization")
        trusted = role == "trusted"
        decision = labelable(await state.feedback.get(body.decision_id), caller, trusted=trusted)
        if decision is None:
            raise UnknownDecision(unknown_decision_text(body.decision_id, trusted=trusted),
                                  field="decision_id")
        if body.label not in decision.options:
            raise InvalidRequest(
                f"label: {body.label!r} is not one of the decision's {len(decision.options)} "
                "options", field="label")
        await state.feedback.add_feedback(body.decision_id, body.label, trusted=role == "trusted")
        monitor = state.service.monitor
        # Only a trusted key's label is evidence for the accuracy alarm (the observer port);
        # any other is logged and exported, and can switch no policy to the slow model.
        if monitor is not None and role == "trusted":
            await monitor.labelled(Label(decision.decision_id, decision.policy_id,
                                         decision.served_fast, body.label == decision.answer,
                                         "feedback"))
        state.metrics.request(surface="feedback", route="none")
        return {"decision_id": body.decision_id, "label": body.label,
                "correct": body.label == decision.answer, "trusted": role == "trusted"}

    @router.get("/v1/models", tags=["openai"])
    async def models(request: Request) -> dict[str, Any]:
        """slotgate's slow models and fast tier, and the models of every System One server
        (passed through), said per server under ``slotgate.upstreams`` (with why a list is
        missing)."""
        state = app_state(request)
        settings, backend = state.settings, state.service.backend
        listed = await state.upstreams.lists() if state.upstreams is not None else []
        served: dict[str, dict[str, Any]] = {}
        for server, found in listed:
            for entry in found.entries:
                served.setdefault(entry["id"], {"object": "model", "created": 0,
                                                "owned_by": f"upstream:{server.tier}"}
                                  | entry | {"slotgate": {"route": "passthrough",
                                                         "tier": server.tier}})
        slow_models = dict.fromkeys(
            [m for m in [settings.slow.model, *settings.slow.allowed_models]
             if m and m not in served])  # a name a server lists is relayed to it
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "slotgate:slow"}
                for m in slow_models]
        data += served.values()
        data.append({"id": f"slotgate-fast:{backend.name}", "object": "model",
                     "created": 0, "owned_by": "slotgate:fast", "fingerprint": backend.fingerprint})
        reply: dict[str, Any] = {"object": "list", "data": data}
        if listed:
            reply["slotgate"] = {"upstreams": [
                {"tier": server.tier, "models": list(found.names), "error": found.error}
                for server, found in listed]}
        return reply

    return router


async def _refuse_lone_surrogates(request: Request) -> None:
    """400 naming the field before any of it is hashed, logged or forwarded
    (router/http/text_guard.py). ``request.json()`` is the body FastAPI already parsed (Starlette caches it)."""
    field = lone_surrogate_field(await request.json())
    if field is not None:
        raise InvalidRequest(surrogate_message(field), field=field)


def make_relay_router() -> APIRouter:
    """Every ``/v1`` POST no other route takes (``/v1/completions``, ``/v1/embeddings``...):
    relayed to the System One server serving the body's ``model``. Included last."""
    router = APIRouter()

    # Out of the OpenAPI document: what it takes is the upstream's to describe.
    @router.post("/v1/{path:path}", tags=["openai"], response_model=None, include_in_schema=False)
    async def relay(path: str, request: Request) -> Response:
        where = f"POST /v1/{path}"
        model = _model_of(await request.body(), where)
        state = app_state(request)
        if state.upstreams is None:
            raise ModelNotServed(
                f"no route {where}: other /v1 POSTs are passed through only to the server of a "
                "systemone tier, and none is configured (or passthrough.enabled is false)")
        relayed = await _relay(request, model)
        if relayed is not None:
            return relayed
        await _refuse_unknown_while_lists_fail(state.upstreams, model, None)
        names = sorted({n for _, found in await state.upstreams.lists() for n in found.names})
        raise ModelNotServed(f"model: {model!r} is not served here; {where} is passed through "
                             f"only for the System One servers' models {names}", field="model")

    return router


async def _relay(request: Request, model: str) -> Response | None:
    """The request relayed as sent to the System One server listing ``model``; None when no
    server lists it."""
    state = app_state(request)
    server = await state.upstreams.serving(model) if state.upstreams is not None else None
    if server is None:
        return None
    state.metrics.request(surface="passthrough", route="upstream")
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return await server.relay(target, await request.body(),
                              request.headers.get("content-type", "application/json"))


async def _refuse_unknown_while_lists_fail(upstreams: Upstreams | None, model: str,
                                           slow: SlowPathSettings | None) -> None:
    """A model neither the slow path takes (``slow``: None, no slow path for this route)
    nor a server lists, while a server's list cannot be read: a 503 saying so, not a 403/404
    that would blame the name."""
    if upstreams is None:
        return
    if slow is not None and model in {slow.model, *slow.allowed_models, *slow.model_aliases}:
        return
    problems = await upstreams.problems()
    if problems:
        raise PassthroughUnavailable(
            f"model: {model!r} is not a model slotgate knows, and the model list of a System One "
            f"server that may serve it is unavailable ({'; '.join(problems)})", field="model")


def _model_of(body: bytes, where: str) -> str:
    """The ``model`` of a relayed body: a JSON object, checked as every body is (credential
    fields, lone surrogates)."""
    try:  # the standard parser, as for every route: orjson refuses a lone surrogate unnamed
        value = json.loads(body)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise InvalidRequest("body: not a valid JSON object", field="body")
    chosen = sorted(CREDENTIAL_FIELDS & set(value))
    if chosen:
        raise Forbidden(f"{chosen[0]} cannot be set by clients; the upstream is configured "
                        "by the operator", field=chosen[0])
    field = lone_surrogate_field(value)
    if field is not None:
        raise InvalidRequest(surrogate_message(field), field=field)
    model = value.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest(f"model: required: {where} is passed through to the System One "
                             "server that serves the body's model", field="model")
    return model


async def _chat_variant(request: Request, body: ChatCompletionRequest,
                        payload: dict[str, Any]) -> Response:
    """The example server's chat variant, answered through the System One flow in its shape."""
    started = time.perf_counter()
    state = app_state(request)
    settings = state.settings
    parsed = parse_variant(payload, max_questions=settings.max_questions,
                           max_options=settings.max_options)
    service, caller = state.service, namespace(request)
    try:
        staged = parsed.staged()
        outcome = await answer_stages(service, staged, namespace=caller)
    except UnprocessableRequest as exc:  # the server answers its chat route's refusals with 400
        raise InvalidRequest(exc.message, field="messages.0.content") from exc
    state.metrics.request(surface="openai_decision",
                          route=summary_route(outcome.decisions.values()))
    total_ms = (time.perf_counter() - started) * 1e3
    return JSONResponse(render_variant(body, parsed, outcome, total_ms=total_ms,
                                       engine=f"slotgate:{service.backend.name}"))


async def _passthrough(slow: SlowModel | None, body: ChatCompletionRequest) -> Response:
    if slow is None or not slow.available:
        raise NoSlowModel("passthrough")
    upstream = body.upstream_body()
    if not body.stream:
        return JSONResponse(await slow.complete(upstream))
    events = slow.stream(upstream)
    # The first event is awaited here, so a failing upstream is still an HTTP error, not a
    # 200 with a broken stream.
    first = await anext(aiter(events), None)
    return StreamingResponse(_chain(first, events), media_type="text/event-stream")


async def _chain(first: bytes | None, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    try:
        if first is not None:
            yield first
        async for chunk in rest:
            yield chunk
    finally:
        aclose = getattr(rest, "aclose", None)
        if aclose is not None:
            await aclose()  # on client disconnect too: no upstream connection is left open


async def _as_events(reply: dict[str, Any], *, include_usage: bool) -> AsyncIterator[bytes]:
    """A decision as a ``chat.completion.chunk`` stream: the whole answer, then the stop, then
    (``stream_options.include_usage``) OpenAI's usage chunk with no choices. The ``slotgate``
    block (the receipt with it) rides on the first chunk and again on the last with choices,
    where a client reading to the end finds it."""
    base = {k: reply[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    content = reply["choices"][0]["message"]["content"]
    first = base | {"choices": [{"index": 0, "delta": {"role": "assistant", "content": content},
                                 "finish_reason": None}],
                    "slotgate": reply["slotgate"]}
    last = base | {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                   "slotgate": reply["slotgate"]}
    chunks = [first, last]
    if include_usage:
        chunks.append(base | {"choices": [], "usage": reply["usage"]})
    for chunk in chunks:
        yield b"data: " + orjson.dumps(chunk) + b"\n\n"
    yield b"data: [DONE]\n\n"
