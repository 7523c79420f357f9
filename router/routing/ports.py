"""The seams of the routing service, typed the way httpx types its transports: what the service
(and the routes above it) use of the slow model, the read cache, the decision log and production monitoring
(``DecisionObserver``). The concrete parts (``SlowPath``, ``RedisCache``/``MemoryCache``, ``JsonlDecisionLog``/...) satisfy
these structurally; tests pass small fakes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from policies.types import DecisionRequest, OptionScores
from router.store.records import DecisionRecord, DecisionView

if TYPE_CHECKING:
    from policies.file import OnCostAlarm, PolicyFile


@dataclass(frozen=True, slots=True)
class SlowAnswer:
    """The slow model's answer to one decision: always one of the request's options."""

    answer: str
    model: str
    latency_ms: float
    attempts: int  # 1, or 2 after the corrective retry


@dataclass(slots=True)
class FastRead:
    """The fast read of one request: scores and where they came from. ``failure``: why the read
    is not routed on (it leads the escalation's note). With no ``scores``, why there are none;
    with scores, why they may not be trusted (``routing.stages``: a read that continued an
    answer the caller does not get): that escalates too, except in shadow mode, which judges and
    logs it as any read, since the slow answer is served anyway."""

    scores: OptionScores | None
    cached: bool
    failure: str | None = None
    # None made on purpose: nothing routes on it (``RoutingService.reads_fast``). Not a failure.
    skipped: bool = False


# The read of a decision that needs none (an unscoped one under ``policy.unscoped: escalate``).
NOT_READ = FastRead(None, cached=False, skipped=True)


class SlowModel(Protocol):
    """The slow LLM: decisions (answers confined to the options) and passthrough chats. Failures
    are ``router.errors.SlowPathError`` subclasses; a full queue is ``TooManyRequests``."""

    @property
    def available(self) -> bool:
        """False when no slow model is configured (every call then raises ``NoSlowModel``)."""
        ...

    async def ask(self, request: DecisionRequest) -> SlowAnswer: ...

    async def audit(self, request: DecisionRequest) -> SlowAnswer:
        """``ask`` for an audit, on the audits' own budget: never a slot a client waits for."""
        ...

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

    async def append(self, record: DecisionRecord) -> None: ...


class FeedbackStore(Protocol):
    """The logged decisions a feedback label can be attached to (``POST /v1/feedback``)."""

    async def get(self, decision_id: str) -> DecisionView | None: ...

    async def add_feedback(self, decision_id: str, label: str, *, trusted: bool) -> None: ...


@dataclass(frozen=True, slots=True)
class Observation:
    """One routed decision with a fast read, as monitoring sees it."""

    request: DecisionRequest  # audits re-ask it; its text and options key the input (dedupe)
    decision_id: str
    policy_id: str
    confidence: float  # calibrated probability of the fast answer (the raw argmax)
    accepted: bool  # the policy's own verdict, before any alarm gate
    answer: str | None  # what the caller got
    served_fast: bool  # the accepted fast answer reached the caller: what a label measures
    caller: str = ""  # the caller's namespace (one per API key): its share of audits is capped


@dataclass(frozen=True, slots=True)
class Label:
    """A label of a logged decision: a human's (``/v1/feedback``) or the slow model's (audit)."""

    decision_id: str
    policy_id: str | None
    served_fast: bool
    correct: bool  # the answer the caller got equals the label
    source: Literal["feedback", "audit"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CostAlarm:
    """The live check found the covering policy's cost promise broken
    (``router.monitoring.cost``), as ``router.routing.plan`` takes it: the operator's choice
    (the policy file's ``on_cost_alarm``: alert_only changes no decision; serve_unverified
    serves the fast answer, marked unverified, where the policy's own verdict escalates, while
    an accuracy alarm's escalations still reach the slow model) and why."""

    on_cost_alarm: OnCostAlarm
    detail: str


class DecisionObserver(Protocol):
    """Production monitoring as routing sees it (``router.monitoring.monitor.Monitor``): told of
    each policy file the registry loads, asked by the registry whether an alarm makes a policy
    escalate what it accepts (the alarm gate), told once per decision with a fast read and once
    per label. ``decided`` never waits and never raises: a decision is never slower for it."""

    def watch(self, policy_file: PolicyFile) -> None: ...

    def retire_others(self, policy_ids: Iterable[str]) -> None:
        """The policies loaded now are exactly ``policy_ids``: any other's watch goes."""
        ...

    def gate(self, policy_id: str) -> str | None:
        """Why this policy's accepted answers escalate now; None while they are served."""
        ...

    def watch_state(self, policy_id: str) -> str | None:
        """"clear", "suspect" or "alarmed" (None: not watched), as the receipt states it."""
        ...

    def cost_alarm(self, policy_id: str) -> CostAlarm | None:
        """The policy's cost promise found broken, and what that does; None while it holds."""
        ...

    def decided(self, observation: Observation) -> None: ...

    async def labelled(self, label: Label) -> None: ...
