"""The seams of the routing service, typed the way httpx types its transports: what the service
(and the routes above it) use of the slow model, the read cache and the decision log. The
concrete parts (``SlowPath``, ``RedisCache``/``MemoryCache``, ``JsonlDecisionLog``/...) satisfy
these structurally; tests pass small fakes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from policies.types import DecisionRequest


@dataclass(frozen=True, slots=True)
class SlowAnswer:
    """The slow model's answer to one decision: always one of the request's options."""

    answer: str
    model: str
    latency_ms: float
    attempts: int  # 1, or 2 after the corrective retry


class SlowModel(Protocol):
    """The slow LLM: decisions (answers confined to the options) and passthrough chats. Failures
    are ``router.errors.SlowPathError`` subclasses; a full queue is ``TooManyRequests``."""

    @property
    def available(self) -> bool:
        """False when no slow model is configured (every call then raises ``NoSlowModel``)."""
        ...

    async def decide(self, request: DecisionRequest) -> SlowAnswer: ...

    async def complete(self, body: dict[str, Any]) -> dict[str, Any]: ...

    def stream(self, body: dict[str, Any]) -> AsyncIterator[bytes]: ...


class ReadCache(Protocol):
    """Bytes by key with a TTL. Never raises on the request path: a failing store answers misses
    and drops writes (``router.store.cache`` says how it is counted). ``claim``/``release``: which
    replica computes a key's value while the others wait for it (True where there is one)."""

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]: ...

    async def set_many(self, items: Sequence[tuple[str, bytes]]) -> None: ...

    async def ping(self) -> bool: ...

    async def claim(self, key: str, *, ttl_s: float) -> bool: ...

    async def renew(self, key: str, *, ttl_s: float) -> bool: ...  # the claim holder's heartbeat

    async def release(self, key: str) -> None: ...


class DecisionSink(Protocol):
    """Where the service records each decision, durably, before the caller gets its answer."""

    async def append(self, record: dict[str, Any]) -> None: ...


class FeedbackStore(Protocol):
    """The logged decisions a feedback label can be attached to (``POST /v1/feedback``)."""

    async def get(self, decision_id: str) -> dict[str, Any] | None: ...

    async def add_feedback(self, decision_id: str, label: str) -> None: ...
