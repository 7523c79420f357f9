"""Operational routes: liveness (``/healthz``), readiness (``/readyz``: what a decision needs: the
fast backend answers, a configured Redis answers, the decision log is writable) and Prometheus
metrics (``/metrics``)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from router.http.startup import decision_log_writable
from router.http.state import app_state


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
        if settings.cache.redis_url:
            checks["redis"] = bool(await service.cache.ping())
        if state.decision_log_path is not None:  # None: a log injected by a test
            checks["decision_log"] = decision_log_writable(state.decision_log_path)
        ready = all(checks.values())
        body = {"status": "ready" if ready else "unavailable", "checks": checks,
                "escalation_available": service.escalation_available,
                # "available", "available once litellm is loaded", or why not (no model, no key)
                "escalation": getattr(service.slow, "status", None) or (
                    "available" if service.escalation_available else "unavailable")}
        return JSONResponse(body, status_code=200 if ready else 503)

    @router.get("/metrics", tags=["ops"])
    async def metrics(request: Request) -> Response:
        registry = app_state(request).metrics
        return Response(registry.render(), media_type=registry.content_type)

    return router
