"""RoutingService with real parts where they are cheap (MockBackend, MemoryCache, the fallback
policy, metrics) and a recording slow path and log, so each failure semantic is checked exactly."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from policies.types import DecisionRequest, Option, OptionScores
from router.backends.mock import MockBackend
from router.errors import (
    BackendMalformed,
    BackendUnavailable,
    InvalidRequest,
    SlowPathTimeout,
    SlowPathUnavailable,
    TooManyRequests,
)
from router.routing.registry import PolicyRegistry
from router.routing.service import FastRead, RoutingService
from router.settings import Settings
from router.store.cache import MemoryCache
from router.store.metrics import Metrics


@dataclass
class SlowAnswer:
    answer: str
    model: str = "standin"
    latency_ms: float = 1.0
    attempts: int = 1


@dataclass
class RecordingSlow:
    """Answers the last option; records every question; can be made to fail."""

    available: bool = True
    fail: Exception | None = None
    calls: list[str] = field(default_factory=list)

    async def ask(self, request: DecisionRequest) -> SlowAnswer:
        self.calls.append(request.state)
        if self.fail is not None:
            raise self.fail
        return SlowAnswer(request.option_names[-1])
    audit = ask  # one budget: audits and escalations alike


@dataclass
class ListLog:
    records: list[dict[str, Any]] = field(default_factory=list)

    async def append(self, record: Any) -> None:  # a DecisionRecord, kept as its dict
        self.records.append(record.model_dump())


def request(state: str, *, policy: str | None = None) -> DecisionRequest:
    return DecisionRequest("intent", "Which intent?", (Option("a"), Option("b"), Option("c")),
                           state, policy=policy)


def confident_on_sure(req: DecisionRequest) -> list[float]:
    """0.98 on 'a' when the text says 'sure', else 0.5 on 'a' (below the 0.9 fallback bar)."""
    return [0.98, 0.01, 0.01] if "sure" in req.state else [0.5, 0.3, 0.2]


def make_service(handler: Any = confident_on_sure, *, slow_path: RecordingSlow | None = None,
                 **overrides: Any) -> tuple[RoutingService, MockBackend, ListLog, Metrics]:
    calls: list[str] = []

    def counting(req: DecisionRequest) -> Any:
        calls.append(req.state)
        return handler(req)

    backend = MockBackend(counting)
    backend.calls = calls  # type: ignore[attr-defined]
    log, metrics = ListLog(), Metrics()
    settings = Settings(**overrides)
    service = RoutingService(
        backend=backend, cache=MemoryCache(max_entries=100, ttl_s=60), registry=PolicyRegistry(),
        slow=slow_path if slow_path is not None else RecordingSlow(), log=log,  # type: ignore[arg-type]
        metrics=metrics, settings=settings)
    return service, backend, log, metrics


async def test_confident_read_is_answered_fast_and_logged() -> None:
    service, _, log, _ = make_service()
    [d] = await service.route([request("I am sure")], namespace="t")
    assert (d.answer, d.route, d.policy_id) == ("a", "fast", "fallback")
    assert d.probability == pytest.approx(0.98) and d.threshold == 0.9
    assert [r["decision_id"] for r in log.records] == [d.decision_id]
    assert log.records[0]["proba"] == pytest.approx([0.98, 0.01, 0.01])


async def test_repeat_is_served_from_the_read_cache_without_a_backend_call() -> None:
    service, backend, _, _ = make_service()
    await service.route([request("I am sure")], namespace="t")
    [d] = await service.route([request("I am sure")], namespace="t")
    assert d.route == "cache" and d.answer == "a"
    assert backend.calls == ["I am sure"]  # type: ignore[attr-defined]


async def test_low_confidence_escalates_once_then_the_slow_answer_is_cached() -> None:
    slow = RecordingSlow()
    service, _, log, metrics = make_service(slow_path=slow)
    [d1] = await service.route([request("hmm")], namespace="t")
    [d2] = await service.route([request("hmm")], namespace="t")
    assert (d1.route, d1.answer) == ("slow", "c")
    assert (d2.route, d2.answer) == ("cache", "c")
    assert slow.calls == ["hmm"]
    assert d1.probability == pytest.approx(0.2)  # the slow answer's probability under the fast read
    assert [r["route"] for r in log.records] == ["slow", "cache"]
    assert b"slotgate_escalation_rate 1.0" in metrics.render()


async def test_other_namespace_does_not_share_cache_entries() -> None:
    slow = RecordingSlow()
    service, _, _, _ = make_service(slow_path=slow)
    await service.route([request("hmm")], namespace="tenant-a")
    [d] = await service.route([request("hmm")], namespace="tenant-b")
    assert d.route == "slow" and len(slow.calls) == 2


async def test_failing_backend_escalates_and_is_counted() -> None:
    def down(req: DecisionRequest) -> list[float]:
        raise BackendUnavailable("connection refused")

    slow = RecordingSlow()
    service, _, log, metrics = make_service(down, slow_path=slow)
    [d] = await service.route([request("I am sure")], namespace="t")
    assert (d.route, d.answer, d.probability) == ("slow", "c", None)
    assert "BackendUnavailable" in (d.note or "")
    assert b'slotgate_backend_errors_total{kind="BackendUnavailable"} 1.0' in metrics.render()
    assert log.records[0]["proba"] is None


async def test_slow_backend_past_its_timeout_escalates() -> None:
    async def stalls(req: DecisionRequest) -> list[float]:
        await asyncio.sleep(5)
        return [1.0, 0.0, 0.0]

    slow = RecordingSlow()
    service, _, _, _ = make_service(stalls, slow_path=slow, fast={"timeout_s": 0.05})
    [d] = await service.route([request("I am sure")], namespace="t")
    assert d.route == "slow" and "BackendTimeout" in (d.note or "")
    assert d.latency_ms < 1000


async def test_no_slow_model_raises_unavailable_saying_so() -> None:
    service, _, log, _ = make_service(slow_path=RecordingSlow(available=False))
    with pytest.raises(SlowPathUnavailable, match="escalation unavailable"):
        await service.route([request("hmm")], namespace="t")
    assert log.records == []  # nothing answered, nothing logged as answered
    [d] = await service.route([request("sure")], namespace="t")  # confident ones still work
    assert d.route == "fast"


async def test_unverified_when_configured_says_so() -> None:
    slow = RecordingSlow(fail=SlowPathTimeout("slow model timed out after 30 s"))
    service, _, log, _ = make_service(slow_path=slow, slow={"serve_unverified_on_failure": True})
    [d] = await service.route([request("hmm")], namespace="t")
    assert (d.route, d.answer) == ("unverified", "a")
    assert "timed out" in (d.note or "") and "not verified" in (d.note or "")
    assert log.records[0]["route"] == "unverified"


async def test_full_queue_is_refused_with_retry_after() -> None:
    gate = asyncio.Event()

    async def blocked(req: DecisionRequest) -> list[float]:
        await gate.wait()
        return [0.98, 0.01, 0.01]

    service, _, _, _ = make_service(blocked, fast={"max_concurrency": 1, "timeout_s": 5},
                                    max_queue=1)
    first = asyncio.create_task(service.route([request("sure 1")], namespace="t"))
    second = asyncio.create_task(service.route([request("sure 2")], namespace="t"))
    await asyncio.sleep(0.01)
    with pytest.raises(TooManyRequests) as info:
        await service.route([request("sure 3")], namespace="t")
    assert info.value.retry_after_s >= 1
    gate.set()
    assert [d.route for d in (await first) + (await second)] == ["fast", "fast"]
    assert await service.drain(timeout_s=1)


async def test_unknown_policy_name_is_a_request_error() -> None:
    service, backend, _, _ = make_service()
    with pytest.raises(InvalidRequest, match="no policy named 'nope'"):
        await service.route([request("sure", policy="nope")], namespace="t")
    assert backend.calls == []  # type: ignore[attr-defined]


async def test_a_failing_question_cancels_the_others_escalations() -> None:
    class HalfBroken:
        available = True
        cancelled = False

        async def ask(self, request: DecisionRequest) -> SlowAnswer:
            if request.question_id == "a":
                raise SlowPathTimeout("slow model timed out")
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                self.cancelled = True
                raise
            return SlowAnswer(request.option_names[0])
        audit = ask  # one budget: audits and escalations alike

    slow = HalfBroken()
    service, _, log, _ = make_service(slow_path=slow)  # type: ignore[arg-type]
    # Two different questions (identical ones would share one slow call: test_single_flight).
    questions = [DecisionRequest(qid, f"{qid}?", (Option("x"), Option("y"), Option("z")), "hmm")
                 for qid in "ab"]
    async with asyncio.timeout(5):
        with pytest.raises(SlowPathTimeout):
            await service.route(questions, namespace="t")
    assert slow.cancelled and log.records == []


async def test_given_reads_are_routed_on_and_one_not_to_be_trusted_escalates_saying_why() -> None:
    """``decide(reads=...)``: reads made elsewhere (``routing.stages``, a body read whole) are
    routed as the service's own; a read with a ``failure`` is not routed on, even with scores,
    and leaves no row to tune from."""
    service, backend, log, _ = make_service()
    sure, doubted = request("I am sure"), request("I am sure too")
    scores = OptionScores(("a", "b", "c"), (0.98, 0.01, 0.01))
    reads = [FastRead(scores, cached=False),
             FastRead(scores, cached=False, failure="no fast read fits: q = 'a'")]
    fast, slow = await service.route([sure, doubted], namespace="t", reads=reads)
    assert (fast.route, fast.answer) == ("fast", "a")
    assert (slow.route, slow.answer, slow.escalated) == ("slow", "c", True)
    # No policy covers these requests: the unscoped rule (a fixed bar) has no read to judge.
    assert slow.note is not None and slow.note.startswith("unscoped: ")
    assert "no fast read fits: q = 'a'; answered by the slow model" in slow.note
    assert [r["proba"] for r in log.records] == [pytest.approx([0.98, 0.01, 0.01]), None]
    assert backend.calls == []  # type: ignore[attr-defined]


async def test_read_upstream_cuts_states_and_checks_the_options_answered() -> None:
    service, _, _, _ = make_service(fast={"max_input_chars": 5})
    seen: list[str] = []

    async def read(requests: list[DecisionRequest]) -> list[OptionScores | None]:
        seen.extend(r.state for r in requests)
        return [None, OptionScores(("a", "b", "c"), (0.2, 0.3, 0.5))]

    answers = await service.read_upstream([request("0123456789"), request("short")], read)
    assert seen == ["01234", "short"] and answers[0] is None

    async def wrong(requests: list[DecisionRequest]) -> list[OptionScores | None]:
        return [OptionScores(("x", "y"), (0.5, 0.5)) for _ in requests]

    with pytest.raises(BackendMalformed):
        await service.read_upstream([request("s")], wrong)
