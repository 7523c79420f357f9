"""OpenTelemetry traces of routing: one span per decision (``slotgate.decision``) carrying its
route, tier reads, policy and guarantee as attributes, and the W3C trace context handed on to
the slow model call. The message text and the answer are recorded only under
``tracing.record_text``. With tracing off (the default) ``NO_TRACING`` stands in: nothing of
OpenTelemetry is imported and a decision pays one attribute check."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from policies.types import Decision, DecisionRequest
from router.routing.ports import FastRead

SPAN_NAME = "slotgate.decision"


class DecisionTracing:
    """Spans of decisions from ``tracer`` (an OpenTelemetry ``Tracer``; None: tracing off).
    ``record_text``: the decision's state and answer become attributes too."""

    def __init__(self, tracer: Any | None, *, record_text: bool = False) -> None:
        self.tracer = tracer
        self.record_text = record_text

    @property
    def enabled(self) -> bool:
        return self.tracer is not None

    @contextmanager
    def decision(self, started: float) -> Iterator[Any | None]:
        """The current span of one decision while it is planned and carried out (the slow call
        made inside it carries its context); it starts at ``started`` (``time.perf_counter``
        when the request began, so the fast read is inside it). Yields None with tracing off."""
        if self.tracer is None:
            yield None
            return
        start_ns = time.time_ns() - int((time.perf_counter() - started) * 1e9)
        with self.tracer.start_as_current_span(
                SPAN_NAME, start_time=start_ns, record_exception=False,
                set_status_on_exception=False) as span:
            try:
                yield span
            except BaseException as exc:
                self.failed(span, exc)
                raise

    def describe(self, span: Any, request: DecisionRequest, read: FastRead,
                 decision: Decision, *, namespace: str) -> None:
        """The decision's facts as attributes of ``span``; the text only if configured."""
        attributes: dict[str, Any] = {
            "slotgate.decision_id": decision.decision_id,
            "slotgate.question_id": decision.question_id,
            "slotgate.namespace": namespace,
            "slotgate.route": decision.route,
            "slotgate.escalated": decision.escalated,
            "slotgate.shadow": decision.shadow,
            "slotgate.policy_id": decision.policy_id,
            "slotgate.guarantee": decision.guarantee or "none",
            "slotgate.fast.read": not read.skipped,
            "slotgate.fast.cached": read.cached,
            "slotgate.options": len(request.options),
        }
        if read.failure is not None:
            attributes["slotgate.fast.failure"] = read.failure
        for name, value in (("probability", decision.probability),
                            ("raw_probability", decision.raw_probability),
                            ("threshold", decision.threshold), ("tier", decision.tier)):
            if value is not None:
                attributes[f"slotgate.{name}"] = value
        if decision.tiers:
            attributes["slotgate.tiers.read"] = [t.tier for t in decision.tiers]
            attributes["slotgate.tiers.accepted"] = [t.accepted for t in decision.tiers]
            attributes["slotgate.tiers.probability"] = [t.probability for t in decision.tiers]
        if decision.receipt is not None:
            attributes["slotgate.receipt.why"] = decision.receipt.why
        if self.record_text:
            attributes["slotgate.state"] = request.state
            if decision.answer is not None:
                attributes["slotgate.answer"] = decision.answer
        span.set_attributes(attributes)

    @staticmethod
    def failed(span: Any, exc: BaseException) -> None:
        """A decision that raised: its span says so (the error type; its message may quote
        the caller's input, so it is not recorded)."""
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        span.set_attribute("error.type", type(exc).__name__)


NO_TRACING = DecisionTracing(None)


def trace_headers() -> dict[str, str]:
    """The W3C ``traceparent`` (and ``tracestate``) of the current span, for an outgoing call;
    empty when no span is current."""
    from opentelemetry.propagate import inject

    carrier: dict[str, str] = {}
    inject(carrier)
    return carrier
