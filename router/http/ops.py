"""Operational routes: liveness (``/healthz``), readiness (``/readyz``) and Prometheus metrics
(``/metrics``).

Readiness is "this replica can answer decisions": the fast backend answers, every fast tier has
made its first read (the start-up warm-up; ``warm`` in the body names those still pending), and
the decision log is writable (its file's permissions, and the log's own account of its writes: a
full disk shows only when a write fails, so while it fails each probe has the log try again, at
most once a second, and a replica out of rotation sees the space come back; ``decision_log`` in
the body then says why, and how much is kept in memory meanwhile). What the fast backend serves
with (its kernels, and any fallback to slower ones: ``fast_backend``,
``slotgate_fast_backend_fallbacks``) is reported, never a readiness condition.
Redis is a cache: while it is down or hung decisions are still answered (uncached),
so it is reported (body, ``slotgate_redis_up``, a log line when it changes) but takes the replica
out only with ``cache.required: true``; otherwise a Redis outage would take every replica of a
fleet out of its load balancer at once (docs/reliability.md)."""

from __future__ import annotations

import logging
import threading
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from router.http.startup import decision_log_writable
from router.http.state import AppState, app_state
from router.routing.service import RoutingService

log = logging.getLogger("slotgate")


def make_router() -> APIRouter:
    router = APIRouter()

    @router.get("/healthz", tags=["ops"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @router.get("/readyz", tags=["ops"], response_model=None)
    async def readyz(request: Request) -> JSONResponse:
        state = app_state(request)
        service, settings = state.service, state.settings
        checks: dict[str, bool] = {"fast_backend": bool(await service.backend.ready())}
        body: dict[str, Any] = {}
        if state.decision_log_path is not None:  # None: a log injected by a test
            # The log's own account of its writes: os.access cannot see a full disk.
            recheck = getattr(state.feedback, "recheck", None)
            failing = await recheck() if recheck is not None else getattr(
                state.feedback, "failing", None)
            checks["decision_log"] = failing is None and decision_log_writable(
                state.decision_log_path)
            if failing is not None:
                records, size = getattr(state.feedback, "spooled", (0, 0))
                body["decision_log"] = {"failing": failing, "spooled_records": records,
                                        "spooled_bytes": size}
        if state.warm_up is not None:  # every tier has made its first read (start-up warm-up)
            warming = state.warm_up.pending
            checks["warm"] = not warming
            if warming:
                body["warm"] = {"pending": warming}
        required = sorted(checks)
        serving = _fast_backend_seen(state)
        if serving:  # reported, never a readiness condition: a fallback still serves
            body["fast_backend"] = serving
        if settings.cache.redis_url:
            up = bool(await service.cache.ping())
            checks["redis"] = up
            _redis_seen(state, up, required=settings.cache.required)
            if settings.cache.required:
                required.append("redis")
            body["redis"] = {"state": "up" if up else "down", "required": settings.cache.required,
                             "effect": None if up else "decisions are served without the cache"}
        ready = all(checks[name] for name in required)
        available, escalation = escalation_state(service)
        body = {"status": "ready" if ready else "unavailable", "checks": checks,
                "required": required, **body,
                # True, False, or None while not known yet (litellm loading); "escalation" says why
                "escalation_available": available, "escalation": escalation,
                "policies": [{"name": p.name, "policy_id": p.runtime.policy_id,
                              "shadow": service.registry.mode(p.runtime)[0],
                              "path": None if p.path is None else str(p.path),
                              # a cascade's tiers in reading order (None: one fast tier)
                              "tiers": None if p.file.cascade is None else [
                                  {"name": t.name, "threshold": t.threshold}
                                  for t in p.file.cascade.tiers]}
                             for p in service.registry.loaded()]}
        return JSONResponse(body, status_code=200 if ready else 503)

    @router.get("/metrics", tags=["ops"])
    async def metrics(request: Request) -> Response:
        state = app_state(request)
        _fast_backend_seen(state)
        registry = state.metrics
        return Response(registry.render(), media_type=registry.content_type)

    return router


def escalation_state(service: RoutingService) -> tuple[bool | None, str]:
    """(available, why): None until it is known. The slow model's credentials are checked once
    litellm's background import is done; until then "available" would be a guess."""
    slow = service.slow
    status = getattr(slow, "status", None)
    if not service.escalation_available:
        return False, status or "unavailable"
    warmed_up = getattr(slow, "warmed_up", None)
    if isinstance(warmed_up, threading.Event) and not warmed_up.is_set():
        return None, status or "not known yet: litellm is loading"
    return True, status or "available"


def _fast_backend_seen(state: AppState) -> dict[str, Any]:
    """What the fast backend serves with (``FastBackend.serving``; {} when it has nothing to
    say), and its fallbacks counted on ``slotgate_fast_backend_fallbacks``."""
    serving = dict(state.service.backend.serving())
    fallbacks = serving.get("fallbacks")
    state.metrics.fast_backend_fallbacks(len(fallbacks) if isinstance(fallbacks, list) else 0)
    prefixes = serving.get("prefix_cache")
    if isinstance(prefixes, dict):
        state.metrics.fast_backend_prefix_cache(hits=int(prefixes.get("hits", 0)),
                                                misses=int(prefixes.get("misses", 0)))
    return serving


def _redis_seen(state: AppState, up: bool, *, required: bool) -> None:
    """The gauge, and one log line per change of what /readyz saw."""
    state.metrics.redis_up(up)
    if state.redis_up is not None and state.redis_up == up:
        return
    if up:
        log.info("readiness: redis answers")
    elif required:
        log.warning("readiness: redis does not answer; NOT READY (cache.required is true)")
    else:
        log.warning("readiness: redis does not answer; still ready, decisions are served without "
                    "the cache (cache.required: true would make it a readiness condition)")
    state.redis_up = up
