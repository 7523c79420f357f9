"""Coalescing concurrent reads (coalescer.py's Coalescer alone, over a stand-in batch reader):
concurrent callers share batches, each gets exactly its own answers, one caller's failure fails
only that caller, and a batch's plan takes one question's oldest requests, sized by cost.
Through TorchBackend on the tiny DiffusionGemma: test_backend_batching.py."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from router.backends.torch.serve.coalescer import Coalescer


class Recorder:
    """A run_batch that doubles numbers, records each batch, and fails on negative numbers."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.batches: list[list[int]] = []
        self.delay_s = delay_s
        self.threads: set[str] = set()

    def __call__(self, items: list[int]) -> list[int]:
        self.batches.append(list(items))
        self.threads.add(threading.current_thread().name)
        if any(i < 0 for i in items):
            raise ValueError(f"cannot read {min(items)}")
        threading.Event().wait(self.delay_s)
        return [2 * i for i in items]


async def gather(coalescer: Coalescer[int, int], calls: list[list[int]]) -> list[Any]:
    return await asyncio.gather(*(coalescer.submit(c) for c in calls), return_exceptions=True)


def test_concurrent_callers_share_batches_and_get_their_own_answers() -> None:
    run = Recorder()
    calls = [[10 * k + j for j in range(k % 3 + 1)] for k in range(12)]
    with ThreadPoolExecutor(1) as pool:
        coalescer = Coalescer(run, executor=pool, window_s=0.05, max_batch=8)
        results = asyncio.run(gather(coalescer, calls))
    assert results == [[2 * i for i in c] for c in calls]
    assert sum(len(b) for b in run.batches) == sum(len(c) for c in calls)
    assert len(run.batches) < len(calls)  # shared
    assert all(len(b) <= 8 for b in run.batches)
    # a caller's items are never split between batches
    for c in calls:
        assert any(b[i : i + len(c)] == c for b in run.batches for i in range(len(b)))


def test_one_failing_request_fails_only_itself() -> None:
    run = Recorder()
    calls = [[1, 2], [3, -4], [5], [6, 7]]
    with ThreadPoolExecutor(1) as pool:
        coalescer = Coalescer(run, executor=pool, window_s=0.05, max_batch=16)
        results = asyncio.run(gather(coalescer, calls))
    assert results[0] == [2, 4] and results[2] == [10] and results[3] == [12, 14]
    assert isinstance(results[1], ValueError) and "-4" in str(results[1])
    assert run.batches[0] == [1, 2, 3, -4, 5, 6, 7]  # tried together first


def test_a_request_larger_than_max_batch_is_read_in_chunks_in_order() -> None:
    run = Recorder()
    with ThreadPoolExecutor(1) as pool:
        coalescer = Coalescer(run, executor=pool, window_s=0.0, max_batch=3)
        results = asyncio.run(gather(coalescer, [list(range(8))]))
    assert results == [[2 * i for i in range(8)]]
    assert [len(b) for b in run.batches] == [3, 3, 2]


def test_callers_arriving_during_a_batch_form_the_next_one() -> None:
    run = Recorder(delay_s=0.2)

    async def scenario(coalescer: Coalescer[int, int]) -> list[Any]:
        first = asyncio.ensure_future(coalescer.submit([1]))
        await asyncio.sleep(0.05)  # the first batch is running now
        later = [asyncio.ensure_future(coalescer.submit([k])) for k in range(2, 6)]
        return await asyncio.gather(first, *later)

    with ThreadPoolExecutor(1) as pool:
        results = asyncio.run(scenario(Coalescer(run, executor=pool, window_s=0.001, max_batch=8)))
    assert results == [[2], [4], [6], [8], [10]]
    assert run.batches == [[1], [2, 3, 4, 5]]


async def closed_loop(coalescer: Coalescer[int, int], callers: int, rounds: int) -> None:
    """``callers`` clients, each sending its next item once its last one is answered."""

    async def client(c: int) -> None:
        for r in range(rounds):
            assert await coalescer.submit([100 * c + r]) == [2 * (100 * c + r)]

    await asyncio.gather(*(client(c) for c in range(callers)))


def test_closed_loop_callers_are_not_kept_waiting_for_the_window() -> None:
    """8 clients under a max_batch of 64 and a 30 s window: after the first batch each batch
    waits for the 8 callers the last one answered, not for 64 items or the window (waiting for
    the window would cost 30 s a batch here; bench/host_path.py measured the 2 ms default window
    costing 2 ms a batch)."""
    run = Recorder(delay_s=0.01)

    async def scenario() -> None:
        coalescer = Coalescer(run, executor=pool, window_s=30.0, max_batch=64)
        await coalescer.submit([0])  # a lone caller's read starts at once
        await asyncio.wait_for(closed_loop(coalescer, callers=8, rounds=4), timeout=60)
        await coalescer.aclose()

    with ThreadPoolExecutor(1) as pool:
        asyncio.run(asyncio.wait_for(scenario(), timeout=90))
    # the first shared batch waited (8 items, unknown company: up to the window), the rest not
    assert [len(b) for b in run.batches] == [1, 8, 8, 8, 8]


def test_batches_grow_to_the_callers_there_are() -> None:
    """The expectation counts what waits as well as the last batch: 8 clients, then 8 more that
    arrive while the first batch reads, are read as batches of 16 from then on (a rule of "the
    last batch's size" alone would go on with alternating batches of 8)."""
    run = Recorder(delay_s=0.2)

    async def scenario() -> None:
        coalescer = Coalescer(run, executor=pool, window_s=0.05, max_batch=64)
        first = asyncio.ensure_future(closed_loop(coalescer, callers=8, rounds=4))
        await asyncio.sleep(0.1)  # the first batch (its window is 0.05 s) reads for 0.2 s now
        second = asyncio.ensure_future(closed_loop(coalescer, callers=8, rounds=4))
        await asyncio.wait_for(asyncio.gather(first, second), timeout=60)
        await coalescer.aclose()

    with ThreadPoolExecutor(1) as pool:
        asyncio.run(scenario())
    assert [len(b) for b in run.batches] == [8, 16, 16, 16, 8]


@pytest.mark.parametrize(("available", "want"), [
    (20, 16),  # 20 in a bucket of 32 cost 4 + 32 for 20 reads; 16 cost 4 + 16
    (31, 31),  # 31 in 32: better than 16 now and 15 later
    (32, 32), (16, 16), (1, 1),
    (10, 8),   # 10 pad to 16: 8 now, 2 wait
    (14, 14),  # 14 pad to 16: 14/20 beats 8/12
    (3, 3), (5, 4),
    (40, 40),  # past the largest bucket: unpadded, all of them
])
def test_bucket_take_reads_the_most_items_per_cost(available: int, want: int) -> None:
    from router.backends.torch.serve.coalescer import bucket_take

    assert bucket_take(available, (1, 2, 4, 8, 16, 32), fixed_items=4.0) == want


def test_bucket_take_without_buckets_or_with_a_large_fixed_cost_takes_everything() -> None:
    from router.backends.torch.serve.coalescer import bucket_take

    assert bucket_take(20, (), fixed_items=4.0) == 20  # reads not padded
    assert bucket_take(20, (1, 2, 4, 8, 16, 32), fixed_items=1000.0) == 20
    assert bucket_take(0, (1, 2), fixed_items=4.0) == 0


def by_tens(n: int) -> int:
    """The test's groups: 10-19 one question, 20-29 another, ..."""
    return n // 10


def test_a_batch_holds_one_group_the_oldest_requests_first() -> None:
    """Three questions' requests arrive together: each batch reads one question, in the order of
    their oldest requests, and a question's requests keep their order (one batch of all
    would be three reads back to back for the reader, which every caller waits for)."""
    run = Recorder()
    calls = [[10], [20], [11], [30], [21], [12], [31, 32]]
    with ThreadPoolExecutor(1) as pool:
        coalescer = Coalescer(run, executor=pool, window_s=0.05, max_batch=8, group_of=by_tens)
        results = asyncio.run(gather(coalescer, calls))
    assert results == [[2 * i for i in c] for c in calls]
    assert run.batches == [[10, 11, 12], [20, 21], [30, 31, 32]]


def test_a_request_of_several_groups_is_a_group_of_its_own() -> None:
    run = Recorder()
    with ThreadPoolExecutor(1) as pool:
        coalescer = Coalescer(run, executor=pool, window_s=0.05, max_batch=8, group_of=by_tens)
        results = asyncio.run(gather(coalescer, [[10, 20], [11], [10, 21], [20, 10]]))
    assert results == [[20, 40], [22], [20, 42], [40, 20]]
    assert run.batches == [[10, 20, 10, 21], [11], [20, 10]]  # (1, 2) twice, then 1, then (2, 1)


def test_the_plan_leaves_the_newest_for_the_next_batch() -> None:
    """20 waiting items of one question under buckets of 16 and 32: 16 now (the oldest), 4 in the
    next batch, which nothing else delays."""
    run = Recorder()

    def plan(available: int) -> int:
        from router.backends.torch.serve.coalescer import bucket_take

        return bucket_take(available, (1, 2, 4, 8, 16, 32), fixed_items=4.0)

    with ThreadPoolExecutor(1) as pool:
        coalescer = Coalescer(run, executor=pool, window_s=0.05, max_batch=32, group_of=by_tens,
                              plan=plan)
        results = asyncio.run(gather(coalescer, [[10 + k % 10] for k in range(20)]))
    assert results == [[2 * (10 + k % 10)] for k in range(20)]
    assert run.batches == [[10 + k % 10 for k in range(16)], [10 + k % 10 for k in range(16, 20)]]


def test_a_caller_that_leaves_while_its_question_waits_is_skipped() -> None:
    """A request waiting behind another question's batch whose caller goes away (a client that
    disconnects) is dropped when its turn comes; the others of its question are still read."""
    run = Recorder(delay_s=0.1)

    async def scenario() -> list[Any]:
        coalescer = Coalescer(run, executor=pool, window_s=0.01, max_batch=8, group_of=by_tens)
        first = asyncio.ensure_future(coalescer.submit([10]))
        await asyncio.sleep(0.05)  # question 1 reads now
        leaving = asyncio.ensure_future(coalescer.submit([20]))
        staying = asyncio.ensure_future(coalescer.submit([21]))
        await asyncio.sleep(0.01)
        leaving.cancel()
        results = await asyncio.gather(first, staying)
        await coalescer.aclose()
        return results

    with ThreadPoolExecutor(1) as pool:
        results = asyncio.run(asyncio.wait_for(scenario(), timeout=10))
    assert results == [[20], [42]] and run.batches == [[10], [21]]


def test_a_failing_plan_takes_everything_and_the_worker_goes_on(caplog: Any) -> None:
    run = Recorder()

    def broken(available: int) -> int:
        raise KeyError("plan bug")

    with ThreadPoolExecutor(1) as pool, caplog.at_level("ERROR"):
        coalescer = Coalescer(run, executor=pool, window_s=0.05, max_batch=8, group_of=by_tens,
                              plan=broken)
        results = asyncio.run(gather(coalescer, [[10], [11], [12]]))
    assert results == [[20], [22], [24]] and run.batches == [[10, 11, 12]]
    assert "the batch plan failed" in caplog.text


def test_bad_settings_are_refused() -> None:
    with ThreadPoolExecutor(1) as pool:
        with pytest.raises(ValueError, match="max_batch"):
            Coalescer(Recorder(), executor=pool, max_batch=0)
        with pytest.raises(ValueError, match="window_s"):
            Coalescer(Recorder(), executor=pool, window_s=-1)
        with pytest.raises(ValueError, match="plan needs group_of"):
            Coalescer(Recorder(), executor=pool, plan=lambda n: n)
