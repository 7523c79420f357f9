"""No caller holds more than its share of the audit queue: one key's flood of audits is capped
(counted, never read as audits falling short), and another key's audits still queue; a
deployment with one caller keeps the whole queue."""

from __future__ import annotations

import asyncio

from policies.types import DecisionRequest, Option
from router.monitoring.audits import AuditJob, AuditQueue


def job(i: int, caller: str) -> AuditJob:
    return AuditJob("p@1", f"d{i}", "a", DecisionRequest("q", "?", (Option("a"),), f"s{i}"),
                    caller=caller)


async def test_a_flooding_caller_is_capped_and_the_other_still_audits() -> None:
    release = asyncio.Event()
    counted: list[str] = []

    async def answer(_: AuditJob) -> str:
        await release.wait()  # the slow model is slow: the queue fills
        return "a"

    async def on_label(_: AuditJob, __: str) -> None:
        return None

    queue = AuditQueue(answer, on_label, capacity=20, workers=1,
                       on_count=lambda _, result: counted.append(result))
    assert queue.submit(job(0, "victim"))
    flood = [queue.submit(job(i, "attacker")) for i in range(1, 101)]
    assert sum(flood) == 10 and counted.count("capped") == 90  # half of 20, two callers
    assert counted.count("dropped") == 0
    assert all(queue.submit(job(200 + i, "victim")) for i in range(5))
    release.set()
    await queue.aclose(timeout_s=5)
    assert counted.count("done") == 16


async def test_one_caller_keeps_the_whole_queue() -> None:
    async def answer(_: AuditJob) -> str:
        await asyncio.sleep(3600)
        return "a"

    async def on_label(_: AuditJob, __: str) -> None:
        return None

    queue = AuditQueue(answer, on_label, capacity=20, workers=1)
    accepted = [queue.submit(job(i, "")) for i in range(30)]
    assert sum(accepted) == 20  # the queue's capacity: a full queue drops, as always
    assert queue.counts.capped == 0 and queue.counts.dropped == 10
    await queue.aclose(timeout_s=0.01)
