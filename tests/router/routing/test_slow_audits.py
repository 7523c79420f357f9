"""Audits never take a client's slow-model slot: they run on a budget of their own (the audit
workers), outside the one concurrency cap clients share, so a client's escalation starts at
once while every audit is still in flight, and audits do not count against the client queue."""

from __future__ import annotations

import asyncio

from router.routing.backpressure import ConcurrencyLimit
from tests.router.routing.test_slow import ScriptedCompletion, request, slow_path


async def test_a_client_escalation_starts_while_audits_hold_the_slow_model() -> None:
    gate = asyncio.Event()
    completion = ScriptedCompletion('"lost_card"', gate=gate)
    limit = ConcurrencyLimit("slow path", capacity=1, max_waiting=0, on_reject=lambda: None)
    slow = slow_path(completion, limit=limit)
    audits = [asyncio.create_task(slow.audit(request(f"audited {i}"))) for i in range(2)]
    client = asyncio.create_task(slow.ask(request("a client's escalation")))
    for _ in range(10):  # a few turns of the loop: every call that can start has started
        await asyncio.sleep(0)
    states = [call["messages"][-1]["content"] for call in completion.calls]
    # The client's call is under way with both audits in flight, and none was refused for the
    # one client slot (max_waiting 0 would make a second client call a 429).
    assert "a client's escalation" in states and len(states) == 3
    gate.set()
    answers = await asyncio.gather(client, *audits)
    assert [a.answer for a in answers] == ["lost_card"] * 3
