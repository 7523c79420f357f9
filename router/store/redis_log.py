"""The decision log shared through Redis: the JSONL file first (the record of truth), then,
written behind the request, each record once as a Redis stream entry (the audit copy every
replica's records and feedback meet in) and, per decision, a small key holding only what
``/v1/feedback`` needs (namespace, answer, policy, route, the sha256 of the option list, which
is stored once under its own key), so feedback sent to any replica finds a decision made on another.

What a Redis outage or restart does: nothing fails. Records that could not be sent stay queued
(bounded by ``max_pending_bytes``; beyond it the oldest stream entries are dropped and counted)
and are sent when Redis answers again. The per-decision keys of every decision still in this
process's index are re-sent after an outage, and all of them again when Redis comes back
*empty* (a restart without persistence, or a flush): each replica keeps a marker key, and a
missing marker means Redis lost what this replica wrote. The stream's older entries are not
rebuilt after such a restart; the JSONL files still hold every record (``export-log`` joins them).
Delivery is at least once: a pipeline cut mid-way is sent again whole.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any

import orjson

from router.store.decision_index import DecisionIndex, feedback_view
from router.store.decision_log import DecisionLog, EventRecord, JsonlDecisionLog
from router.store.records import DecisionRecord, DecisionView

logger = logging.getLogger(__name__)


class RedisStreamDecisionLog(DecisionLog):
    """XADD to a Redis stream and SET of a per-decision feedback view with a TTL, on top of the
    JSONL file. Write-behind: ``append`` writes the JSONL line and queues the record; a
    background task sends what was queued in the last ``batch_window_s`` as one pipeline, so the
    log costs a request no Redis round trip. Redis failures are counted and logged, never
    raised; what failed is sent again ``retry_interval_s`` later."""

    def __init__(self, url: str, stream: str, *, jsonl: JsonlDecisionLog | Path | str,
                 ttl_s: int = 7 * 24 * 3600, max_stream_len: int = 1_000_000,
                 timeout_s: float = 0.25, batch_window_s: float = 0.002,
                 retry_interval_s: float = 1.0, max_pending: int = 10_000,
                 max_pending_bytes: int = 32 * 2**20, keys_per_batch: int = 1000,
                 max_batch_bytes: int = 4 * 2**20) -> None:
        from router.store.redis_client import redis_client

        self.stream = stream
        self.ttl_s = ttl_s
        self.max_stream_len = max_stream_len
        self.batch_window_s = batch_window_s
        self.retry_interval_s = retry_interval_s
        self.max_pending = max_pending
        self.max_pending_bytes = max_pending_bytes
        self.keys_per_batch = keys_per_batch
        self.max_batch_bytes = max_batch_bytes
        self.jsonl = jsonl if isinstance(jsonl, JsonlDecisionLog) else JsonlDecisionLog(jsonl)
        # Decisions read back from the file at start-up: their keys may be missing (Redis may
        # have restarted while this replica was down), so they are sent with the first batches.
        self.jsonl.index.mark_all_unsynced()
        self.redis_errors = 0  # records (or keys) whose sending failed, retries included
        self.dropped = 0  # stream entries dropped from a full queue (the JSONL file has them)
        self.client: Any = redis_client(url, timeout_s=timeout_s)
        # This replica's marker: gone from Redis = Redis lost what this replica wrote.
        self._marker = f"{stream}:replica:{uuid.uuid4().hex}"
        self._digests: dict[tuple[str, ...], str] = {}
        self._pending: deque[tuple[int, bytes]] = deque()  # (seq, stream entry), oldest first
        self._pending_bytes = 0
        self._seq = 0
        self._known = False  # whether this replica's marker was ever written
        self._retry_at = 0.0  # monotonic time before which a failed Redis is not tried again
        # The flusher task and its events and lock belong to the event loop that created them.
        self._flusher: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._closing = asyncio.Event()
        self._sending = asyncio.Lock()  # one batch at a time: the stream keeps the log's order

    @property
    def index(self) -> DecisionIndex:
        return self.jsonl.index

    @property
    def n_pending(self) -> int:
        """Stream entries plus per-decision keys not yet in Redis."""
        return len(self._pending) + self.jsonl.index.n_unsynced

    def _options_key(self, digest: str) -> str:
        return f"{self.stream}:options:{digest}"

    def _options_digest(self, options: tuple[str, ...]) -> str:
        """sha256 of an option list, memoised: a question asked a million times hashes once."""
        digest = self._digests.get(options)
        if digest is None:
            if len(self._digests) >= 4096:
                self._digests.clear()
            digest = self._digests[options] = hashlib.sha256(orjson.dumps(options)).hexdigest()
        return digest

    def _key(self, decision_id: str) -> str:
        # Ids come from clients (feedback): hashed, so nothing they hold reaches a key.
        return f"{self.stream}:decision:{hashlib.sha256(decision_id.encode()).hexdigest()}"

    async def append(self, record: DecisionRecord | dict[str, Any]) -> None:
        data = await self.jsonl.append_encoded(record, unsynced=True)
        self._enqueue(data)

    async def get(self, decision_id: str) -> DecisionView | None:
        """This process's index first; Redis holds what other replicas logged."""
        local = await self.jsonl.get(decision_id)
        if local is not None:
            return local
        from redis.exceptions import RedisError

        try:
            raw = await self.client.get(self._key(decision_id))
        except (RedisError, OSError) as exc:  # OSError covers TimeoutError
            self._count_failure("get", type(exc).__name__)
            return None
        if raw is None:
            return None
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            value = None
        if not isinstance(value, dict):  # a damaged key: as unknown as a missing one
            self._count_failure("get", "damaged decision key")
            return None
        options = value.get("options")  # older keys hold the list itself, not its hash
        if options is None:
            try:
                raw = await self.client.get(self._options_key(str(value.get("options_sha256"))))
            except (RedisError, OSError) as exc:
                self._count_failure("get", type(exc).__name__)
                return None
            try:
                options = orjson.loads(raw) if raw is not None else []
            except orjson.JSONDecodeError:
                options = None
        if not isinstance(options, list):
            self._count_failure("get", "damaged option list")
            return None
        return feedback_view(decision_id, [str(o) for o in options], value.get("answer"), value)

    @property
    def failing(self) -> str | None:
        return self.jsonl.failing

    async def recheck(self) -> str | None:
        return await self.jsonl.recheck()

    @property
    def spooled(self) -> tuple[int, int]:
        return self.jsonl.spooled

    async def add_feedback(self, decision_id: str, label: str, *, trusted: bool) -> None:
        data = await self.jsonl.add_feedback_encoded(decision_id, label, trusted=trusted)
        self._enqueue(data)

    async def add_event(self, record: EventRecord | dict[str, Any]) -> None:
        data = await self.jsonl.add_event_encoded(record)
        self._enqueue(data)

    async def flush(self) -> bool:
        """Send everything queued so far to Redis now (after any batch already on its way);
        True when nothing is left unsent."""
        async with self._lock():
            while await self._send_batch():
                if not self.n_pending:
                    return True
        return False

    async def aclose(self) -> None:
        if self._flusher_running():
            assert self._flusher is not None
            self._closing.set()
            self._wake.set()
            await self._flusher  # it tries once more to send what is queued, then ends
            self._closing.clear()
        await self.flush()
        self._flusher = None
        await self.jsonl.aclose()
        await self.client.aclose()

    def _lock(self) -> asyncio.Lock:
        if not self._flusher_running():  # a lock of an earlier event loop must not be awaited
            self._sending = asyncio.Lock()
        return self._sending

    def _flusher_running(self) -> bool:
        return (self._flusher is not None and not self._flusher.done()
                and self._flusher.get_loop() is asyncio.get_running_loop())

    def _enqueue(self, data: bytes) -> None:
        self._seq += 1
        self._pending.append((self._seq, data))
        self._pending_bytes += len(data)
        while len(self._pending) > self.max_pending or (
                self._pending_bytes > self.max_pending_bytes and len(self._pending) > 1):
            self._pending_bytes -= len(self._pending.popleft()[1])
            self.dropped += 1
            self._count_failure("append", "queue full")
        if not self._flusher_running():
            if self._flusher is not None:  # a task of an earlier event loop: start afresh
                self._wake, self._closing, self._sending = (
                    asyncio.Event(), asyncio.Event(), asyncio.Lock())
            self._flusher = asyncio.get_running_loop().create_task(self._flush_loop())
        self._wake.set()

    async def _flush_loop(self) -> None:
        while True:
            await self._wake.wait()
            closing = self._closing.is_set()
            if not closing:
                # A failed Redis is retried after retry_interval_s, not on every new record;
                # otherwise let the records of the next few ms join this batch.
                delay = max(self.batch_window_s, self._retry_at - time.monotonic())
                try:
                    async with asyncio.timeout(delay):
                        await self._closing.wait()
                except TimeoutError:
                    pass
            self._wake.clear()
            async with self._sending:
                sent = await self._send_batch()
            if self._closing.is_set():
                return
            if self.n_pending:  # more keys than one batch, or a failure to retry
                if not sent:
                    self._retry_at = time.monotonic() + self.retry_interval_s
                self._wake.set()

    async def _send_batch(self) -> bool:
        """One pipeline: this replica's marker, up to ``keys_per_batch`` queued stream entries
        (and ``max_batch_bytes``), up to ``keys_per_batch`` per-decision keys. False (and everything kept for later) on failure."""
        entries: list[tuple[int, bytes]] = []
        size = 0
        for queued in self._pending:  # a bounded pipeline: a huge one would pass the socket timeout
            if len(entries) >= self.keys_per_batch or (entries and size > self.max_batch_bytes):
                break
            entries.append(queued)
            size += len(queued[1])
        ids = self.jsonl.index.unsynced(self.keys_per_batch)
        if not entries and not ids:
            return True
        from redis.exceptions import RedisError

        index = self.jsonl.index
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.exists(self._marker)
                pipe.set(self._marker, b"1", ex=self.ttl_s)
                for _, data in entries:
                    pipe.xadd(self.stream, {"data": data}, maxlen=self.max_stream_len,
                              approximate=True)
                options_sent: set[str] = set()
                for decision_id in ids:
                    entry = index.entry(decision_id)
                    if entry is None:  # evicted meanwhile (unsynced marks go with entries)
                        continue
                    options, answer, facts = entry
                    digest = self._options_digest(options)
                    if digest not in options_sent:  # each list once a batch, its TTL renewed
                        options_sent.add(digest)
                        pipe.set(self._options_key(digest), orjson.dumps(options), ex=self.ttl_s)
                    pipe.set(self._key(decision_id), orjson.dumps(
                        {**facts, "answer": answer, "options_sha256": digest}), ex=self.ttl_s)
                results = await pipe.execute()
        except (RedisError, OSError) as exc:  # OSError covers TimeoutError
            self._count_failure("append", type(exc).__name__, n_records=len(entries) + len(ids))
            return False
        last_sent = entries[-1][0] if entries else 0
        while self._pending and self._pending[0][0] <= last_sent:  # newer ones stay queued
            self._pending_bytes -= len(self._pending.popleft()[1])
        index.mark_synced(ids)
        if not results[0] and self._known:
            # Redis lost what this replica wrote (a restart without persistence, a flush): every
            # decision still in the index gets its key again, in batches.
            index.mark_all_unsynced()
            if index.n_unsynced:
                logger.warning("decision log: redis lost this replica's keys (restart without "
                               "persistence?); re-sending %d", index.n_unsynced)
        self._known, self._retry_at = True, 0.0
        return True

    def _count_failure(self, operation: str, reason: str, *, n_records: int = 1) -> None:
        before = self.redis_errors
        self.redis_errors += n_records
        if before == 0 or before // 1000 != self.redis_errors // 1000:
            logger.warning("decision log: redis %s failed (%s, %d so far); the JSONL file has "
                           "the record, Redis gets it when it answers again", operation, reason,
                           self.redis_errors)
