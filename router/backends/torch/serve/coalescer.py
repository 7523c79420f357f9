"""Concurrent reads gathered into one batch: what a proxy's concurrent requests need from one GPU.

Callers ``submit`` their items; one worker task takes everything pending, runs it as one call of
``run_batch`` in a single worker thread, and answers each caller with its own slice. A caller
never straddles two batches unless it brings more than ``max_batch`` items. When a batch fails,
each caller's items are read again alone, so one request's failure fails only that request.

Under concurrency the worker waits at most ``window_s`` for companions, and no longer than it
takes the expected ones to arrive: the items that were waiting when the last batch was answered
plus that batch's own (its callers come back with their next items: closed-loop clients, a
proxy's keep-alive connections), at most ``max_batch``. Waiting for ``max_batch`` items or the
whole window instead makes a few closed-loop callers under a large ``max_batch`` wait the full
window on every batch, on top of the read (bench/host_path.py).

Several questions (``group_of``): a read runs one group (items sharing a question's static prefix
and canvas) at a time, so a batch of four questions would be four reads back to back, every
caller waiting for all four. With ``group_of`` a batch takes only the group of the oldest waiting
request (no group starves), and with ``plan`` only as many of its items as read best. The batch
cost model is ``bucket_take``: a read of a graph bucket of b items costs ``fixed_items + b``, so a
few items wait for the next batch when the bucket holding them all would pad more than it saves
(10 waiting, buckets of 8 and 16: 8 now).
"""

from __future__ import annotations

import asyncio
import bisect
import logging
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

Item = TypeVar("Item")
Result = TypeVar("Result")


@dataclass
class _Entry(Generic[Item]):
    items: list[Item]
    future: asyncio.Future[list[Any]] = field(repr=False)
    group: Hashable = None  # what group_of says of its items (a tuple when they differ)


def padded_size(n: int, sizes: Sequence[int]) -> int:
    """The items a read of ``n`` items costs: the smallest of ``sizes`` (graph buckets, sorted)
    that holds them, or ``n`` itself past them (an unpadded read)."""
    at = bisect.bisect_left(sizes, n)
    return sizes[at] if at < len(sizes) else n


def bucket_take(available: int, sizes: Sequence[int], fixed_items: float) -> int:
    """How many of ``available`` items of one group to read now, when reads are padded up to the
    smallest of ``sizes`` (graph buckets, sorted; none: no padding) and a read of a bucket of b
    items costs about ``fixed_items + b`` items' worth: the count of the most items per cost, all
    of them or a whole bucket's worth (the rest wait for the next batch). With ``fixed_items`` 4:
    20 waiting reads 16 now (20 in a bucket of 32 cost 36 for 20; 16 cost 20), 31 reads all 31."""
    if available <= 0 or not sizes:
        return available

    candidates = [available, *(s for s in sizes if s < available)]
    return max(candidates, key=lambda n: (n / (fixed_items + padded_size(n, sizes)), n))


class Coalescer(Generic[Item, Result]):
    """Batches ``submit`` calls made from one event loop; ``run_batch`` runs in ``executor``.
    ``group_of`` (optional): the group of an item; a batch then holds one group, the oldest
    waiting request's. ``plan`` (optional, with ``group_of``): how many of the n items of that
    group to take (``bucket_take``); at least one request is always taken."""

    def __init__(self, run_batch: Callable[[list[Item]], list[Result]], *, executor: Executor,
                 window_s: float = 0.002, max_batch: int = 32,
                 group_of: Callable[[Item], Hashable] | None = None,
                 plan: Callable[[int], int] | None = None) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch!r}")
        if window_s < 0:
            raise ValueError(f"window_s must be >= 0, got {window_s!r}")
        self.run_batch, self.executor = run_batch, executor
        self.window_s, self.max_batch = window_s, max_batch
        if plan is not None and group_of is None:
            raise ValueError("plan needs group_of: it sizes a batch of one group")
        self.group_of, self.plan = group_of, plan
        self._pending: list[_Entry[Item]] = []
        self._pending_items = 0  # items in _pending (kept, not summed on every submit)
        self._expected = max_batch  # items worth waiting for: see the module docstring
        self._arrived: asyncio.Event | None = None
        self._enough: asyncio.Event | None = None
        self._worker: asyncio.Task[None] | None = None
        self.batches = 0  # batches run, for tests and metrics
        self._last_size = 0  # items in the last batch

    async def submit(self, items: Sequence[Item]) -> list[Result]:
        """The results of ``items``, in order, read in whichever batches they joined."""
        if not items:
            return []
        loop = asyncio.get_running_loop()
        if self._worker is None or self._worker.done():
            self._arrived, self._enough = asyncio.Event(), asyncio.Event()
            self._worker = loop.create_task(self._work())
        assert self._arrived is not None and self._enough is not None
        entries = [_Entry(list(items[i : i + self.max_batch]), loop.create_future())
                   for i in range(0, len(items), self.max_batch)]
        if self.group_of is not None:
            for entry in entries:
                keys = tuple(dict.fromkeys(map(self.group_of, entry.items)))
                entry.group = keys[0] if len(keys) == 1 else keys
        self._pending.extend(entries)
        self._pending_items += len(items)
        self._arrived.set()
        if self._pending_items >= self._expected:
            self._enough.set()
        results: list[Result] = []
        for entry in entries:
            results.extend(await entry.future)
        return results

    async def aclose(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass
        for entry in self._pending:
            if not entry.future.done():
                entry.future.cancel()
        self._pending.clear()
        self._pending_items = 0

    async def _work(self) -> None:
        assert self._arrived is not None and self._enough is not None
        while True:
            await self._arrived.wait()
            # Wait for companions only under concurrency (the last batch was shared, or several
            # callers wait now): a lone caller's read starts at once.
            busy = self._last_size > 1 or len(self._pending) > 1
            if self.window_s > 0 and busy and not self._enough.is_set():
                try:  # a short window for the expected companions of the first arrival
                    await asyncio.wait_for(self._enough.wait(), timeout=self.window_s)
                except TimeoutError:
                    pass
            batch = self._take()
            if not self._pending:
                self._arrived.clear()
            self._enough.clear()
            if batch:
                await self._run(batch)
            # the next batch waits for what waits now and for this batch's callers' next items
            self._expected = min(self.max_batch, max(1, self._pending_items + self._last_size))
            if self._pending_items >= self._expected:
                self._enough.set()
            else:  # set during the read against the old expectation
                self._enough.clear()

    def _take(self) -> list[_Entry[Item]]:
        self._pending = [e for e in self._pending if not e.future.done()]  # callers gone
        self._pending_items = sum(len(e.items) for e in self._pending)
        if not self._pending:
            return []
        if self.group_of is None:
            members = self._pending
            limit = self.max_batch
        else:  # the oldest request's group, in arrival order
            group = self._pending[0].group
            members = [e for e in self._pending if e.group == group]
            available = sum(len(e.items) for e in members)
            limit = min(self.max_batch, available)
            if self.plan is not None:
                try:
                    limit = max(1, min(limit, self.plan(limit)))
                except Exception:  # a bug in the plan must not stop the worker: all of them
                    log.exception("coalescer: the batch plan failed; taking all %d waiting", limit)
        taken: list[_Entry[Item]] = []
        size = 0
        for entry in members:
            if taken and size + len(entry.items) > limit:
                break
            taken.append(entry)
            size += len(entry.items)
        return self._taken(taken)

    def _taken(self, taken: list[_Entry[Item]]) -> list[_Entry[Item]]:
        """``taken`` off the waiting list: the next batch."""
        chosen = {id(e) for e in taken}
        self._pending = [e for e in self._pending if id(e) not in chosen]
        self._pending_items -= sum(len(e.items) for e in taken)
        return taken

    async def _run(self, batch: list[_Entry[Item]]) -> None:
        loop = asyncio.get_running_loop()
        flat = [item for entry in batch for item in entry.items]
        self.batches += 1
        self._last_size = len(flat)
        try:
            results = await loop.run_in_executor(self.executor, self.run_batch, flat)
        except Exception as exc:  # noqa: BLE001 (each caller gets its own outcome below)
            if len(batch) == 1:
                _settle(batch[0], exc=exc)
                return
            log.warning("batched read of %d requests failed (%s): reading each alone", len(batch), exc)
            for entry in batch:
                try:
                    _settle(entry, await loop.run_in_executor(self.executor, self.run_batch, entry.items))
                except Exception as alone:  # noqa: BLE001 (this request's own failure)
                    _settle(entry, exc=alone)
            return
        start = 0
        for entry in batch:
            _settle(entry, results[start : start + len(entry.items)])
            start += len(entry.items)


def _settle(entry: _Entry[Any], results: list[Any] | None = None, *, exc: BaseException | None = None) -> None:
    if entry.future.done():
        return
    if exc is not None:
        entry.future.set_exception(exc)
    else:
        entry.future.set_result(results or [])
