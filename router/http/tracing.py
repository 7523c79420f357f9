"""Tracing's HTTP side: the tracer provider that exports decision spans over OTLP/HTTP
(``tracing`` settings), and the ASGI middleware that makes a request's W3C ``traceparent`` the
parent of its decisions' spans and of the slow model call they make."""

from __future__ import annotations

from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from router.errors import ConfigError
from router.routing.tracing import DecisionTracing
from router.settings import TracingSettings

_CONTEXT_HEADERS = (b"traceparent", b"tracestate", b"baggage")
INSTALL = "pip install 'slotgate[tracing]'"


class TraceContext:
    """Pure ASGI middleware: a request's trace context headers, when it has them, become the
    current context while the request is served (the configured propagator reads them: W3C
    trace context unless OTEL_PROPAGATORS says otherwise)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        carrier = {name.decode("latin-1"): value.decode("latin-1")
                   for name, value in scope.get("headers", ()) if name in _CONTEXT_HEADERS}
        if scope["type"] != "http" or not carrier:
            await self.app(scope, receive, send)
            return
        from opentelemetry import context
        from opentelemetry.propagate import extract

        token = context.attach(extract(carrier))
        try:
            await self.app(scope, receive, send)
        finally:
            context.detach(token)


def make_tracer_provider(settings: TracingSettings) -> Any:
    """An SDK ``TracerProvider`` naming the service, its spans batched to the OTLP/HTTP
    exporter; a ConfigError naming ``tracing.enabled`` when the SDK is not installed."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise ConfigError(f"tracing.enabled: the OpenTelemetry SDK or its OTLP exporter is not "
                          f"installed ({exc.name}): {INSTALL}", field="tracing.enabled") from exc
    provider = TracerProvider(resource=Resource.create({"service.name": settings.service_name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(
        endpoint=settings.otlp_endpoint)))
    return provider


def decision_tracing(settings: TracingSettings, provider: Any) -> DecisionTracing:
    """Decision spans from ``provider`` (its own tracer, never the process-wide one: two apps
    in one process trace apart)."""
    return DecisionTracing(provider.get_tracer("slotgate"), record_text=settings.record_text)
