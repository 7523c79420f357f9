"""Audits: a seeded share of accepted decisions also answered by the slow model after the reply
has gone out. A bounded queue and a few workers on the event loop; a full queue drops the audit
(counted), so audits never hold up, slow down or fail a decision. Their slow-model calls run
outside the clients' concurrency cap (``SlowPath.audit``): the workers are the audits' own
budget, never a slot a client's escalation waits for."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from policies.types import DecisionRequest
from router.errors import SlotgateError

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AuditJob:
    policy_id: str
    decision_id: str
    answer: str  # what the fast tier served
    request: DecisionRequest  # its ``turns`` carry the caller's conversation, when there was one


@dataclass(slots=True)
class AuditCounts:
    done: int = 0
    dropped: int = 0  # the queue was full
    failed: int = 0  # the slow model could not answer
    by_policy: dict[tuple[str, str], int] = field(default_factory=dict)

    def count(self, policy_id: str, result: str) -> None:
        setattr(self, result, getattr(self, result) + 1)
        key = (policy_id, result)
        self.by_policy[key] = self.by_policy.get(key, 0) + 1


class AuditQueue:
    """``submit`` never waits; ``answer(job)`` (the slow model) runs in one of ``workers``
    background tasks and ``on_label(job, label)`` gets its answer. Workers start on the first
    submit, on the running loop; ``aclose`` finishes what is queued (up to ``timeout_s``)."""

    def __init__(self, answer: Callable[[AuditJob], Awaitable[str]],
                 on_label: Callable[[AuditJob, str], Awaitable[None]], *,
                 capacity: int = 1000, workers: int = 2,
                 on_count: Callable[[str, str], None] | None = None) -> None:
        self._answer = answer
        self._on_label = on_label
        self._on_count = on_count
        self.capacity = capacity
        self.n_workers = workers
        self.counts = AuditCounts()
        self._queue: asyncio.Queue[AuditJob] | None = None
        self._workers: list[asyncio.Task[None]] = []

    def submit(self, job: AuditJob) -> bool:
        """Queue one audit; False (and counted as dropped) when the queue is full."""
        if self._queue is None:
            self._queue = asyncio.Queue(self.capacity)
            loop = asyncio.get_running_loop()
            self._workers = [loop.create_task(self._work()) for _ in range(self.n_workers)]
        try:
            self._queue.put_nowait(job)
        except asyncio.QueueFull:
            self._count(job.policy_id, "dropped")
            return False
        return True

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
                self._count(job.policy_id, "failed")
                logger.info("audit of %s failed: %s", job.decision_id, exc.message)
            else:
                self._count(job.policy_id, "done")
                try:
                    await self._on_label(job, label)
                except OSError as exc:  # the log could not take the label: the worker goes on
                    logger.warning("audit label of %s not recorded: %s", job.decision_id, exc)
            finally:
                self._queue.task_done()

    def _count(self, policy_id: str, result: str) -> None:
        self.counts.count(policy_id, result)
        if self._on_count is not None:
            self._on_count(policy_id, result)
