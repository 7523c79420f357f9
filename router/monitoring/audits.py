"""Audits: a seeded share of accepted decisions also answered by the slow model after the reply
has gone out. A bounded queue and a few workers on the event loop; a full queue drops the audit
(counted), so audits never hold up, slow down or fail a decision. No caller (API key: one
namespace; a deployment without keys is one caller) holds more than its share of the queue, the
capacity over the callers seen in the last ``SHARE_WINDOW`` submissions: an audit past it is
``capped`` (counted), so one key's flood cannot fill the queue and starve the others' audits,
and a capped audit never reads as audits falling short. Their slow-model calls run
outside the clients' concurrency cap (``SlowPath.audit``): the workers are the audits' own
budget, never a slot a client's escalation waits for."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from policies.types import DecisionRequest
from router.errors import SlotgateError

logger = logging.getLogger(__name__)
SHARE_WINDOW = 1000  # submissions whose callers set each caller's share of the queue


@dataclass(frozen=True, slots=True)
class AuditJob:
    policy_id: str
    decision_id: str
    answer: str  # what the fast tier served
    request: DecisionRequest  # its ``turns`` carry the caller's conversation, when there was one
    caller: str = ""  # the namespace (API key) whose decision it audits
    ticket: int = -1  # the decision's place in its watch's weighted test (-1: none)
    probability: float | None = None  # its draw probability


@dataclass(slots=True)
class AuditCounts:
    done: int = 0
    dropped: int = 0  # the queue was full
    capped: int = 0  # its caller held its share of the queue already
    failed: int = 0  # the slow model could not answer
    by_policy: dict[tuple[str, str], int] = field(default_factory=dict)

    def count(self, policy_id: str, result: str) -> None:
        setattr(self, result, getattr(self, result) + 1)
        key = (policy_id, result)
        self.by_policy[key] = self.by_policy.get(key, 0) + 1


class AuditQueue:
    """``submit`` never waits; ``answer(job)`` (the slow model) runs in one of ``workers``
    background tasks and ``on_label(job, label)`` gets its answer; ``on_lost(job)`` hears of an
    audit whose label will never come (capped, dropped, failed), so the weighted test can count
    it. Workers start on the first submit, on the running loop; ``aclose`` finishes what is
    queued (up to ``timeout_s``)."""

    def __init__(self, answer: Callable[[AuditJob], Awaitable[str]],
                 on_label: Callable[[AuditJob, str], Awaitable[None]], *,
                 capacity: int = 1000, workers: int = 2,
                 on_count: Callable[[str, str], None] | None = None,
                 on_lost: Callable[[AuditJob], None] | None = None) -> None:
        self._answer = answer
        self._on_label = on_label
        self._on_count = on_count
        self._on_lost = on_lost
        self.capacity = capacity
        self.n_workers = workers
        self.counts = AuditCounts()
        self._queue: asyncio.Queue[AuditJob] | None = None
        self._workers: list[asyncio.Task[None]] = []
        self._held: Counter[str] = Counter()  # queued or in work, by caller
        self._callers: deque[str] = deque()  # the last SHARE_WINDOW submissions' callers
        self._seen: Counter[str] = Counter()  # ... counted, so a share costs O(1)

    def submit(self, job: AuditJob) -> bool:
        """Queue one audit; False when its caller holds its share (counted as capped) or the
        queue is full (counted as dropped)."""
        if self._queue is None:
            self._queue = asyncio.Queue(self.capacity)
            loop = asyncio.get_running_loop()
            self._workers = [loop.create_task(self._work()) for _ in range(self.n_workers)]
        self._saw(job.caller)
        if len(self._seen) > 1 and self._held[job.caller] >= self.share():
            self._count(job, "capped")
            return False
        try:
            self._queue.put_nowait(job)
        except asyncio.QueueFull:
            self._count(job, "dropped")
            return False
        self._held[job.caller] += 1
        return True

    def share(self) -> int:
        """The most audits one caller may hold: the capacity over the callers seen lately."""
        return max(1, self.capacity // max(1, len(self._seen)))

    def _saw(self, caller: str) -> None:
        self._callers.append(caller)
        self._seen[caller] += 1
        if len(self._callers) > SHARE_WINDOW:
            old = self._callers.popleft()
            self._seen[old] -= 1
            if not self._seen[old]:
                del self._seen[old]

    @property
    def pending(self) -> int:
        return 0 if self._queue is None else self._queue.qsize()

    async def join(self) -> None:
        """Wait until every queued audit is answered (tests, benchmarks, shutdown)."""
        if self._queue is not None:
            await self._queue.join()

    async def aclose(self, *, timeout_s: float = 10.0) -> None:
        try:
            async with asyncio.timeout(timeout_s):
                await self.join()
        except TimeoutError:
            logger.warning("shutdown with %d audits unanswered", self.pending)
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers, self._queue = [], None

    async def _work(self) -> None:
        assert self._queue is not None
        while True:
            job = await self._queue.get()
            try:
                label = await self._answer(job)
            except SlotgateError as exc:  # the slow path's errors are already translated
                self._count(job, "failed")
                logger.info("audit of %s failed: %s", job.decision_id, exc.message)
            else:
                self._count(job, "done")
                try:
                    await self._on_label(job, label)
                except OSError as exc:  # the log could not take the label: the worker goes on
                    logger.warning("audit label of %s not recorded: %s", job.decision_id, exc)
            finally:
                self._held[job.caller] -= 1
                self._queue.task_done()

    def _count(self, job: AuditJob, result: str) -> None:
        self.counts.count(job.policy_id, result)
        if result != "done" and self._on_lost is not None:
            self._on_lost(job)
        if self._on_count is not None:
            self._on_count(job.policy_id, result)
