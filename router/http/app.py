"""The app factory: ``create_app(settings)`` builds the FastAPI app, its parts (fast backend, cache,
slow path, policies, decision log, metrics) at start-up, and closes them, drained, at shutdown.
This module is also the one place that maps the error tree to HTTP responses."""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import Receive, Scope, Send

from router.backends.base import FastBackend
from router.errors import (
    NO_SLOW_MODEL,
    InvalidRequest,
    NoSlowModel,
    SlotgateError,
    SlowPathRateLimited,
    SlowPathUnavailable,
    TooManyRequests,
)
from router.http.admission import AdmissionGuard
from router.http.openai.routes import make_relay_router as relay_routes
from router.http.openai.routes import make_router as openai_routes
from router.http.operator.routes import make_router as operator_routes
from router.http.ops import make_router as ops_routes
from router.http.ratelimit import make_rate_limit
from router.http.startup_freeze import freeze_after_warm_up, freeze_heap
from router.http.state import AppState
from router.http.systemone.routes import make_router as systemone_routes
from router.http.upstream import Upstreams
from router.routing.backpressure import ConcurrencyLimit
from router.routing.ports import DecisionSink, FeedbackStore, ReadCache, SlowModel
from router.routing.service import RoutingService
from router.settings import Settings
from router.store.budgets import KeyBudgets, make_budgets
from router.store.metrics import Metrics

log = logging.getLogger("slotgate")
SHUTDOWN_DRAIN_S = 30.0  # in-flight decisions get this long to finish (and be logged) at shutdown


class DecisionLogPart(DecisionSink, FeedbackStore, Protocol):
    """What the app needs of a decision log: the service's sink and the feedback route's store."""


def create_app(
    settings: Settings,
    *,
    backend: FastBackend | None = None,
    tiers: Mapping[str, FastBackend] | None = None,
    slow: SlowModel | None = None,
    cache: ReadCache | None = None,
    decision_log: DecisionLogPart | None = None,
    close_backend: bool = False,
    warm_up: bool | None = None,
    tracer_provider: Any | None = None,
) -> FastAPI:
    """A new app for ``settings``. Parts passed in (tests inject a MockBackend) are used as they
    are and left open at shutdown; parts the app builds itself, it closes. ``tiers``: the later
    fast tiers' backends by name (default: built from ``settings.tiers``). ``close_backend``:
    the backends passed in are the app's to close (``slotgate serve`` builds them before
    uvicorn starts, so that a bad model file is one message and exit 2, not a lifespan
    traceback). ``warm_up``: every fast tier reads once at start-up, and /readyz says not ready
    until each has (router/http/startup.py); default: when the app owns its backends (it builds
    them, or ``close_backend``), as under ``slotgate serve``. ``tracer_provider``: the
    OpenTelemetry provider of the decision spans under ``tracing.enabled`` (default: one
    exporting over OTLP, shut down, flushed, with the app; one passed in is left open)."""
    warm = warm_up if warm_up is not None else backend is None or close_backend
    state = AppState(settings=settings, metrics=Metrics(),
                     decision_log_path=settings.log.decision_log_path if decision_log is None
                     else None)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            if backend is not None and close_backend:
                stack.push_async_callback(backend.aclose)
                for later in (tiers or {}).values():
                    stack.push_async_callback(later.aclose)
            if rate_limit is not None:
                stack.push_async_callback(rate_limit.aclose)
            if budgets is not None:
                stack.push_async_callback(budgets.aclose)
            if provider is not None and tracer_provider is None:
                stack.push_async_callback(asyncio.to_thread, provider.shutdown)
            service, feedback = await _build_service(
                settings, stack, backend=backend, tiers=tiers, slow=slow, cache=cache,
                decision_log=decision_log, metrics=state.metrics, tracer_provider=provider,
                budgets=budgets)
            state.started(service, feedback)
            state.upstreams = Upstreams.from_settings(settings, state.metrics)
            if state.upstreams is not None:
                stack.push_async_callback(state.upstreams.aclose)
            warming = await _warm_up(state, service) if warm else None
            from router.routing.reload import live_reload  # SIGHUP and policy file changes

            await stack.enter_async_context(
                live_reload(service.registry, watch=settings.policy.watch, metrics=state.metrics,
                            settings=settings.policy))
            if settings.cache.redis_url:  # the gauge follows every cache call, not only /readyz
                cache_in_use = service.cache
                state.metrics.on_render(
                    lambda: state.metrics.redis_up(getattr(cache_in_use, "healthy", True)))
            if not service.escalation_available:
                log.warning(
                    "ESCALATION UNAVAILABLE: %s. Decisions below their threshold get %s.",
                    NO_SLOW_MODEL,
                    "the fast answer marked 'unverified'" if settings.slow.serve_unverified_on_failure
                    else "a 503 error saying so")
            # Start-up state out of the garbage collector's reach (router/http/startup_freeze.py
            # says why), now and again once the slow path's background import of litellm is done.
            freeze_heap()
            warmed_up = getattr(service.slow, "warmed_up", None)
            refreeze = asyncio.create_task(freeze_after_warm_up(warmed_up)) if isinstance(
                warmed_up, threading.Event) and not warmed_up.is_set() else None
            yield
            for task in (refreeze, warming):
                if task is not None:
                    task.cancel()
            if not await service.drain(timeout_s=SHUTDOWN_DRAIN_S):
                log.warning("shutdown with decisions still in flight after %.0f s",
                            SHUTDOWN_DRAIN_S)
            # leaving the stack closes slow path, backend, cache, then the decision log (flushed)

    rate_limit = make_rate_limit(settings)  # shared through Redis when one is configured
    budgets = make_budgets(settings)  # per-key escalation budgets, shared the same way
    provider = None
    if settings.tracing.enabled:
        from router.http.tracing import make_tracer_provider

        provider = tracer_provider or make_tracer_provider(settings.tracing)
    app = FastAPI(title="slotgate", version="0.1.0", lifespan=lifespan)
    app.state.slotgate = state  # read back only through router.http.state.app_state
    app.include_router(openai_routes())
    app.include_router(systemone_routes())
    app.include_router(ops_routes())
    app.include_router(operator_routes(settings.admin_key_hashes))
    app.include_router(relay_routes())  # last: every other /v1 POST, by its body's model
    app.add_exception_handler(SlotgateError, _on_slotgate_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _on_validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _on_http_exception)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _on_unexpected)
    if budgets is not None:  # inside the guard, which names the caller's namespace
        from router.http.budget_headers import BudgetHeaders

        app.add_middleware(BudgetHeaders, budgets=budgets,
                           default_namespace=settings.cache.namespace)
    app.add_middleware(
        AdmissionGuard,
        api_key_hashes=settings.api_key_hashes,
        default_namespace=settings.cache.namespace,
        max_body_bytes=settings.max_body_bytes,
        send_error=_send_error,
        on_status=state.metrics.response,
        rate_limit=rate_limit,
    )
    if provider is not None:
        from router.http.tracing import TraceContext

        app.add_middleware(TraceContext)
    return app


async def _warm_up(state: AppState, service: RoutingService) -> asyncio.Task[None] | None:
    """Every tier's first read, waited for up to ``WARM_UP_GRACE_S``; a slower one goes on in
    the background (the task returned) while /readyz answers 503."""
    from router.http.startup import WARM_UP_GRACE_S, WarmUp, warm_up_request

    state.warm_up = WarmUp({name: tier.backend for name, tier in service.tiers.items()})
    request = warm_up_request([p.file for p in service.registry.loaded()])
    task = asyncio.create_task(state.warm_up.run(request))
    done, _ = await asyncio.wait({task}, timeout=WARM_UP_GRACE_S)
    return None if done else task


async def _build_service(
    settings: Settings, stack: AsyncExitStack, *, backend: FastBackend | None,
    tiers: Mapping[str, FastBackend] | None, slow: SlowModel | None, cache: ReadCache | None,
    decision_log: DecisionLogPart | None, metrics: Metrics, tracer_provider: Any | None,
    budgets: KeyBudgets | None,
) -> tuple[RoutingService, FeedbackStore]:
    from router.routing.registry import PolicyRegistry
    from router.routing.tracing import NO_TRACING

    tracing = NO_TRACING
    if tracer_provider is not None:
        from router.http.tracing import decision_tracing

        tracing = decision_tracing(settings.tracing, tracer_provider)

    # Closed in reverse order of registration: the log last, so it records every drained decision.
    # The watch's alarms and checkpoint live beside the log file the settings name: a log passed
    # in (tests, embedding) writes no file there, so nothing is restored from or kept beside it.
    log_file = decision_log is None
    if decision_log is None:
        from router.http.startup import check_decision_log
        from router.store.log_factory import make_decision_log

        check_decision_log(settings.log.decision_log_path)
        built_log = make_decision_log(settings, on_unlogged=metrics.unlogged)
        stack.push_async_callback(built_log.aclose)
        decision_log = built_log
    if cache is None:
        from router.store.cache import make_cache

        built_cache = make_cache(settings.cache, on_error=metrics.cache_error)
        stack.push_async_callback(built_cache.aclose)
        cache = built_cache
    if backend is None:
        from router.backends.factory import build_backend

        backend = build_backend(settings.fast)
        stack.push_async_callback(backend.aclose)
    if tiers is None:
        from router.backends.factory import build_backend

        tiers = {}
        for tier in settings.tiers:
            tiers[tier.name] = build_backend(tier)
            stack.push_async_callback(tiers[tier.name].aclose)
    if slow is None:
        from router.routing.slow import SlowPath  # litellm itself is imported lazily
        from router.routing.tracing import trace_headers

        # The slow model's one concurrency cap: escalations and passthrough beyond it plus
        # max_queue waiting get 429 at once instead of waiting until the timeout makes them 504s.
        limit = ConcurrencyLimit(
            "slow path", capacity=settings.slow.max_concurrency, max_waiting=settings.max_queue,
            on_reject=lambda: metrics.queue_rejected("slow"))
        built_slow = SlowPath(settings.slow, limit=limit,
                              trace_headers=None if tracer_provider is None else trace_headers)
        stack.push_async_callback(built_slow.aclose)
        slow = built_slow
    monitor = None
    if settings.monitoring.enabled:
        from router.monitoring.startup import make_monitor, restore_from_log

        monitor = make_monitor(settings, metrics=metrics, decision_log=decision_log, slow=slow)
        if settings.cache.redis_url and settings.monitoring.share_alarms:
            from router.store.alarm_board import RedisAlarmBoard

            board = RedisAlarmBoard(settings.cache.redis_url, ttl_s=settings.cache.ttl_s)
            stack.push_async_callback(board.aclose)  # after the monitor stops reading it
            monitor.share(board, interval_s=settings.monitoring.alarm_sync_s)
        stack.push_async_callback(monitor.aclose)  # audits finish before the slow path closes
    from router.backends.factory import learn_upstreams

    await learn_upstreams([("fast.url", backend)] + [
        (f"tiers.{name}.url", later) for name, later in tiers.items()], strict=False)
    registry = PolicyRegistry.load(
        settings.policy, backend_fingerprint=backend.fingerprint, monitor=monitor,
        tiers=[(settings.fast.name, backend.fingerprint)]
        + [(name, later.fingerprint) for name, later in tiers.items()])
    if monitor is not None and log_file:
        restore_from_log(monitor, settings.log.decision_log_path)
    service = RoutingService(backend=backend, tiers=tiers, cache=cache, registry=registry,
                             slow=slow,
                             log=decision_log, metrics=metrics, settings=settings, monitor=monitor,
                             tracing=tracing, budgets=budgets,
                             cheaper=_cheaper_model(settings, stack, tracer_provider))
    return service, decision_log


def _cheaper_model(settings: Settings, stack: AsyncExitStack,
                   tracer_provider: Any | None) -> SlowModel | None:
    """The slow path to ``budget.cheaper_model`` when a spent budget asks for it, else None."""
    if settings.budget.limit is None or settings.budget.on_spent != "cheaper_model":
        return None
    from router.routing.slow import SlowPath
    from router.routing.tracing import trace_headers

    cheaper = SlowPath(settings.slow.model_copy(update={"model": settings.budget.cheaper_model}),
                       trace_headers=None if tracer_provider is None else trace_headers)
    stack.push_async_callback(cheaper.aclose)
    return cheaper


# ---- the one mapping from the error tree to HTTP -------------------------------------------

def error_response(path: str, exc: SlotgateError) -> JSONResponse:
    """The error in the dialect of the route that failed: System One's ``{"error": {message,
    type}}`` under /v1/systemone, OpenAI's ``{"error": {message, type, param, code}}`` elsewhere."""
    error: dict[str, Any] = {"message": exc.message, "type": exc.error_type}
    if not path.startswith("/v1/systemone"):
        error["param"] = exc.field
        error["code"] = _snake(type(exc).__name__)
    headers = {}
    retry_after_s = getattr(exc, "retry_after_s", None)
    # No Retry-After when no slow model is configured: waiting changes nothing, and clients
    # that honour it (the OpenAI SDK) would retry in silence.
    if isinstance(exc, TooManyRequests | SlowPathRateLimited | SlowPathUnavailable) and not \
            isinstance(exc, NoSlowModel):
        default_s = 10.0 if isinstance(exc, SlowPathUnavailable) else 1.0
        headers["Retry-After"] = str(max(1, round(retry_after_s or default_s)))
    return JSONResponse({"error": error}, status_code=exc.status_code, headers=headers)


async def _send_error(scope: Scope, send: Send, exc: SlotgateError) -> None:
    async def nothing() -> Any:
        return {"type": "http.disconnect"}

    receive: Receive = nothing
    await error_response(scope["path"], exc)(scope, receive, send)


async def _on_slotgate_error(request: Request, exc: SlotgateError) -> JSONResponse:
    if exc.status_code >= 500:
        log.warning("%s %s: %s: %s", request.method, request.url.path, type(exc).__name__,
                    exc.message)
    return error_response(request.url.path, exc)


async def _on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """Pydantic's first complaint, as a 400 naming the field (``body`` for unparseable JSON)."""
    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid" or not loc and first.get("type") == "missing":
        field, message = "body", "body: not a valid JSON object"
    else:
        field = ".".join(loc) or "body"
        message = f"{field}: {first.get('msg', 'invalid value')}"
    return error_response(request.url.path, InvalidRequest(message, field=field))


async def _on_http_exception(request: Request, exc: HTTPException) -> JSONResponse:
    error = InvalidRequest(str(exc.detail))
    error.status_code = exc.status_code  # 404 unknown route, 405 wrong method
    error.error_type = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return error_response(request.url.path, error)


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("%s %s: unexpected error", request.method, request.url.path)
    error = SlotgateError("internal error (logged on the server)")
    return error_response(request.url.path, error)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
