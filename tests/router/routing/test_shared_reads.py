"""SharedReads (routing/shared_reads.py): identical fast reads at once make one backend read; a
caller that leaves fails no one; a failed read fails each waiter with the same error."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from policies.types import DecisionRequest, Option, OptionScores
from router.errors import BackendUnavailable
from router.routing.shared_reads import SharedReads


def ask(state: str) -> DecisionRequest:
    return DecisionRequest("intent", "Which?", (Option("a"), Option("b")), state)


class Backend:
    """``read_many`` that counts its calls and requests, waits ``gate`` and can fail."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.calls: list[list[str]] = []
        self.gate = asyncio.Event()
        self.fail = fail
        self.stored: list[list[str]] = []

    async def read_many(self, requests: list[DecisionRequest]) -> list[OptionScores]:
        self.calls.append([r.state for r in requests])
        await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return [OptionScores(("a", "b"), (0.75, 0.25)) for _ in requests]

    async def store(self, reads: list[tuple[str, OptionScores]]) -> None:
        self.stored.append([key for key, _ in reads])


def run(scenario: Any) -> Any:
    return asyncio.run(asyncio.wait_for(scenario(), timeout=10))


def test_identical_reads_at_once_make_one_backend_read() -> None:
    backend, shared = Backend(), SharedReads()

    async def scenario() -> list[Any]:
        calls = [asyncio.ensure_future(shared.read(["k1"], [ask("same")], backend.read_many, backend.store))
                 for _ in range(20)]
        await asyncio.sleep(0.01)
        assert len(shared) == 1  # one key in flight
        backend.gate.set()
        return await asyncio.gather(*calls)

    outcomes = [out for (out,) in run(scenario)]
    assert backend.calls == [["same"]] and backend.stored == [["k1"]]
    assert all(o.scores is not None and o.scores.proba == (0.75, 0.25) for o in outcomes)
    assert [o.shared for o in outcomes] == [False] + [True] * 19
    assert len(shared) == 0  # nothing left behind


def test_only_the_keys_not_in_flight_are_read_and_a_key_asked_twice_once() -> None:
    backend, shared = Backend(), SharedReads()

    async def scenario() -> tuple[Any, Any]:
        first = asyncio.ensure_future(shared.read(["k1"], [ask("one")], backend.read_many, backend.store))
        await asyncio.sleep(0.01)
        second = asyncio.ensure_future(shared.read(
            ["k1", "k2", "k2"], [ask("one"), ask("two"), ask("two")], backend.read_many, backend.store))
        await asyncio.sleep(0.01)
        backend.gate.set()
        return await first, await second

    first, second = run(scenario)
    assert backend.calls == [["one"], ["two"]]
    assert [o.shared for o in first] == [False]
    assert [o.shared for o in second] == [True, False, False]
    assert second[1].scores == second[2].scores


def test_a_caller_that_leaves_fails_no_one_waiting_on_its_read() -> None:
    backend, shared = Backend(), SharedReads()

    async def scenario() -> Any:
        owner = asyncio.ensure_future(shared.read(["k1"], [ask("same")], backend.read_many, backend.store))
        await asyncio.sleep(0.01)
        waiter = asyncio.ensure_future(shared.read(["k1"], [ask("same")], backend.read_many, backend.store))
        await asyncio.sleep(0.01)
        owner.cancel()  # its client went away
        await asyncio.sleep(0.01)
        backend.gate.set()
        with pytest.raises(asyncio.CancelledError):
            await owner
        return await waiter

    (outcome,) = run(scenario)
    assert outcome.scores is not None and outcome.shared
    assert backend.calls == [["same"]] and backend.stored == [["k1"]]  # read once, still cached


def test_a_failed_read_fails_every_waiter_with_the_same_error() -> None:
    backend, shared = Backend(fail=BackendUnavailable("GPU gone")), SharedReads()

    async def scenario() -> list[Any]:
        calls = [asyncio.ensure_future(shared.read(["k1"], [ask("same")], backend.read_many, backend.store))
                 for _ in range(3)]
        await asyncio.sleep(0.01)
        backend.gate.set()
        return await asyncio.gather(*calls)

    outcomes = [out for (out,) in run(scenario)]
    assert len(backend.calls) == 1 and backend.stored == []
    assert {id(o.error) for o in outcomes} == {id(outcomes[0].error)}
    assert isinstance(outcomes[0].error, BackendUnavailable) and outcomes[0].scores is None
    assert len(shared) == 0  # the next read tries again


def test_an_unexpected_error_is_raised_to_every_waiter() -> None:
    backend, shared = Backend(fail=KeyError("bug")), SharedReads()

    async def scenario() -> list[Any]:
        calls = [asyncio.ensure_future(shared.read(["k1"], [ask("same")], backend.read_many, backend.store))
                 for _ in range(2)]
        await asyncio.sleep(0.01)
        backend.gate.set()
        return await asyncio.gather(*calls, return_exceptions=True)

    results = run(scenario)
    assert all(isinstance(r, KeyError) for r in results) and len(backend.calls) == 1
