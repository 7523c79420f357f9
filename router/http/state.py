"""The one typed accessor for what the app keeps between requests: routes call ``app_state``
instead of reading untyped ``app.state.*`` attributes, and ``namespace`` for the caller's cache
namespace that the admission guard set."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.requests import HTTPConnection

from router.http.startup import WarmUp
from router.http.upstream import Upstreams
from router.routing.ports import FeedbackStore, SlowModel
from router.routing.service import RoutingService
from router.settings import Settings
from router.store.metrics import Metrics


@dataclass(slots=True)
class AppState:
    """Built with the app; ``service`` and ``feedback`` are set at start-up (the lifespan)."""

    settings: Settings
    metrics: Metrics
    # The decision log file the app writes (None: a log injected by a test): /readyz checks it.
    decision_log_path: Path | None = None
    redis_up: bool | None = None  # what /readyz last saw of a configured Redis (None: not yet)
    warm_up: WarmUp | None = None  # the tiers' first reads at start-up (None: none made)
    # The System One servers plain chat may pass through to (None: no systemone tier, or off)
    upstreams: Upstreams | None = None
    _service: RoutingService | None = None
    _feedback: FeedbackStore | None = None

    def started(self, service: RoutingService, feedback: FeedbackStore) -> None:
        self._service = service
        self._feedback = feedback

    @property
    def service(self) -> RoutingService:
        if self._service is None:
            raise RuntimeError("the app has not started: its lifespan builds the service")
        return self._service

    @property
    def feedback(self) -> FeedbackStore:
        if self._feedback is None:
            raise RuntimeError("the app has not started: its lifespan opens the decision log")
        return self._feedback

    @property
    def slow(self) -> SlowModel | None:
        return self.service.slow


def app_state(app_or_connection: Any) -> AppState:
    """The AppState of an app, or of the app serving a request."""
    app = app_or_connection.app if isinstance(app_or_connection, HTTPConnection) else app_or_connection
    state = app.state.slotgate
    if not isinstance(state, AppState):
        raise TypeError(f"app.state.slotgate is {type(state).__name__}, not AppState")
    return state


def namespace(request: HTTPConnection) -> str:
    """The caller's cache namespace (one per API key; set by the admission guard)."""
    found = request.scope.get("state", {}).get("namespace")
    return str(found) if found else app_state(request).settings.cache.namespace
