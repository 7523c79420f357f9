"""The decision log: every decision and every feedback label, append-only, for audit and for
recalibration from production traffic (``export_predictions`` -> ``slotgate tune``).

Durability: the JSONL file is the record of truth. Each record is one ``os.write`` on an
O_APPEND descriptor before ``append`` returns (so before the caller's 2xx): it survives the
process being killed; ``fsync`` runs at most every ``fsync_interval_s`` (0: on every record) and
on ``aclose``, so a machine crash loses at most that interval. With Redis configured, records are
*also* added to a Redis stream (and a per-decision key with a TTL, for ``get``), write-behind:
batched off the request path a few ms later. The JSONL copy means a Redis restart without
persistence, an outage or records still queued at a crash lose nothing, and fail no request.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import time
from abc import ABC, abstractmethod
from collections import OrderedDict, deque
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from router.settings import Settings

logger = logging.getLogger(__name__)


class DecisionLog(ABC):
    """Append-only store of decision records (dicts with a ``decision_id``) and feedback."""

    @abstractmethod
    async def append(self, record: dict[str, Any]) -> None:
        """Store one decision record durably (see the module docstring) before returning."""

    @abstractmethod
    async def get(self, decision_id: str) -> dict[str, Any] | None:
        """A recent decision's record, or None when unknown."""

    @abstractmethod
    async def add_feedback(self, decision_id: str, label: str) -> None:
        """Store the true answer of a logged decision."""

    async def add_event(self, record: dict[str, Any]) -> None:
        """Store a record that is neither a decision nor feedback (an audit label, a monitoring
        alarm): it carries its own ``type`` and is never returned by ``get``."""
        raise NotImplementedError(f"{type(self).__name__} does not store events")

    async def aclose(self) -> None:
        """Flush everything to disk. Idempotent; a later append reopens."""


class JsonlDecisionLog(DecisionLog):
    """One JSON object per line; an in-memory index of the last ``max_index`` decisions (rebuilt
    from the file's tail at start-up) serves ``get``. The index holds each record's JSON bytes,
    not the dict: 100k dicts of dicts would be ~2M objects for every full collection to walk."""

    def __init__(self, path: Path | str, *, fsync_interval_s: float = 1.0,
                 max_index: int = 100_000) -> None:
        self.path = Path(path)
        self.fsync_interval_s = fsync_interval_s
        self.max_index = max_index
        self._fd: int | None = None
        self._last_fsync = time.monotonic()
        self._index: OrderedDict[str, bytes] = OrderedDict()
        for record in read_records(self.path):
            if record.get("type", "decision") == "decision":
                self._remember(str(record["decision_id"]), encode_record(record))

    async def append(self, record: dict[str, Any]) -> None:
        await self.append_encoded(record)

    async def append_encoded(self, record: dict[str, Any]) -> bytes:
        """``append``, returning the record's JSON (no newline) for other copies to reuse."""
        if not record.get("decision_id"):
            raise ValueError("record needs a decision_id")
        data = encode_record({"type": "decision", **record})
        await self._write(data)
        self._remember(str(record["decision_id"]), data)
        return data

    async def get(self, decision_id: str) -> dict[str, Any] | None:
        data = self._index.get(decision_id)
        if data is None:
            return None
        record: dict[str, Any] = orjson.loads(data)
        return record

    async def add_feedback(self, decision_id: str, label: str) -> None:
        await self.add_feedback_encoded(decision_id, label)

    async def add_feedback_encoded(self, decision_id: str, label: str) -> bytes:
        data = encode_record(feedback_record(decision_id, label))
        await self._write(data)
        return data

    async def add_event(self, record: dict[str, Any]) -> None:
        await self.add_event_encoded(record)

    async def add_event_encoded(self, record: dict[str, Any]) -> bytes:
        if record.get("type") in (None, "decision", "feedback"):
            raise ValueError("an event record needs its own type (not decision or feedback)")
        data = encode_record({"time": time.time(), **record})
        await self._write(data)
        return data

    async def aclose(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            await asyncio.to_thread(_fsync_close, fd)

    async def _write(self, data: bytes) -> None:
        if self._fd is None:
            self._fd = _open_for_append(self.path)
        # One write per record on O_APPEND: lines from concurrent writers never interleave.
        os.write(self._fd, data + b"\n")
        if time.monotonic() - self._last_fsync >= self.fsync_interval_s:
            self._last_fsync = time.monotonic()
            await asyncio.to_thread(os.fsync, self._fd)

    def _remember(self, decision_id: str, data: bytes) -> None:
        # A compact copy: orjson's output keeps its ~4 KiB working buffer (see MemoryCache).
        self._index[decision_id] = bytes(memoryview(data))
        self._index.move_to_end(decision_id)
        while len(self._index) > self.max_index:
            self._index.popitem(last=False)


class RedisStreamDecisionLog(DecisionLog):
    """XADD to a Redis stream plus a per-decision key with a TTL, on top of the JSONL file (which
    is written first and is what ``export_predictions`` reads).

    Write-behind: ``append`` writes the JSONL line and queues the record; a background task sends
    what was queued in the last ``batch_window_s`` as one pipeline, so a decision served from the
    Redis cache costs one round trip on its request path (the cache read), and the log about
    1/batch more, later. Redis failures (and records dropped past ``max_pending`` while Redis is
    slower than traffic) are logged and counted per record, never raised: the JSONL copy already
    holds the record."""

    def __init__(self, url: str, stream: str, *, also_jsonl: Path | str,
                 ttl_s: int = 7 * 24 * 3600, max_stream_len: int = 1_000_000,
                 timeout_s: float = 0.25, batch_window_s: float = 0.002,
                 max_pending: int = 10_000) -> None:
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        self.stream = stream
        self.ttl_s = ttl_s
        self.max_stream_len = max_stream_len
        self.batch_window_s = batch_window_s
        self.max_pending = max_pending
        self.jsonl = JsonlDecisionLog(also_jsonl)
        self.redis_errors = 0
        self.client: Any = aioredis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0))
        # (stream entry, decision id for the per-decision key or None for feedback), oldest first
        self._pending: deque[tuple[bytes, str | None]] = deque()
        # The flusher task and its event and lock belong to the event loop that created them.
        self._flusher: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._sending = asyncio.Lock()  # one batch at a time: the stream keeps the log's order
        self._closing = False

    def _key(self, decision_id: str) -> str:
        # Ids come from clients (feedback): hashed, so nothing they hold reaches a key.
        return f"{self.stream}:decision:{hashlib.sha256(decision_id.encode()).hexdigest()}"

    async def append(self, record: dict[str, Any]) -> None:
        data = await self.jsonl.append_encoded(record)
        self._enqueue(data, str(record["decision_id"]))

    async def get(self, decision_id: str) -> dict[str, Any] | None:
        """This process's index first; Redis holds what other processes (workers) logged."""
        local = await self.jsonl.get(decision_id)
        if local is not None:
            return local
        raw = await self._redis("get", self.client.get, self._key(decision_id))
        if raw is None:
            return None
        value: dict[str, Any] = orjson.loads(raw)
        return value

    async def add_feedback(self, decision_id: str, label: str) -> None:
        data = await self.jsonl.add_feedback_encoded(decision_id, label)
        self._enqueue(data, None)

    async def add_event(self, record: dict[str, Any]) -> None:
        data = await self.jsonl.add_event_encoded(record)
        self._enqueue(data, None)

    async def flush(self) -> None:
        """Send everything queued so far to Redis now (after any batch already on its way)."""
        if not self._flusher_running():
            await self._send(self._take())
            return
        async with self._sending:
            await self._send(self._take())

    async def aclose(self) -> None:
        if self._flusher_running():
            assert self._flusher is not None
            self._closing = True
            self._wake.set()
            await self._flusher  # it sends what is queued, then ends
            self._closing = False
        await self.flush()
        self._flusher = None
        await self.jsonl.aclose()
        await self.client.aclose()

    def _flusher_running(self) -> bool:
        return (self._flusher is not None and not self._flusher.done()
                and self._flusher.get_loop() is asyncio.get_running_loop())

    def _enqueue(self, data: bytes, decision_id: str | None) -> None:
        if len(self._pending) >= self.max_pending:
            self._pending.popleft()
            self._count_failure("append", "queue full")
        self._pending.append((data, decision_id))
        if not self._flusher_running():
            if self._flusher is not None:  # a task of an earlier event loop: start afresh
                self._wake, self._sending = asyncio.Event(), asyncio.Lock()
            self._flusher = asyncio.get_running_loop().create_task(self._flush_loop())
        self._wake.set()

    async def _flush_loop(self) -> None:
        while True:
            await self._wake.wait()
            if not self._closing:  # let the records of the next few ms join this batch
                await asyncio.sleep(self.batch_window_s)
            self._wake.clear()
            async with self._sending:
                await self._send(self._take())
            if self._closing:
                return

    def _take(self) -> list[tuple[bytes, str | None]]:
        batch = list(self._pending)
        self._pending.clear()
        return batch

    async def _send(self, batch: list[tuple[bytes, str | None]]) -> None:
        if not batch:
            return
        from redis.exceptions import RedisError

        try:
            async with self.client.pipeline(transaction=False) as pipe:
                for data, decision_id in batch:
                    pipe.xadd(self.stream, {"data": data}, maxlen=self.max_stream_len,
                              approximate=True)
                    if decision_id is not None:
                        pipe.set(self._key(decision_id), data, ex=self.ttl_s)
                await pipe.execute()
        except (RedisError, OSError) as exc:  # OSError covers TimeoutError
            self._count_failure("append", type(exc).__name__, n_records=len(batch))

    async def _redis(self, operation: str, call: Any, *args: Any, **kwargs: Any) -> Any:
        from redis.exceptions import RedisError

        try:
            return await call(*args, **kwargs)
        except (RedisError, OSError) as exc:  # OSError covers TimeoutError
            self._count_failure(operation, type(exc).__name__)
            return None

    def _count_failure(self, operation: str, reason: str, *, n_records: int = 1) -> None:
        before = self.redis_errors
        self.redis_errors += n_records
        if before == 0 or before // 1000 != self.redis_errors // 1000:
            logger.warning("decision log: redis %s failed (%s, %d so far); the JSONL file has "
                           "the record", operation, reason, self.redis_errors)


def make_decision_log(settings: Settings) -> DecisionLog:
    """The Redis stream (plus JSONL) when a Redis URL is configured, else the JSONL file."""
    if settings.cache.redis_url:
        return RedisStreamDecisionLog(settings.cache.redis_url, settings.log.redis_stream,
                                      also_jsonl=settings.log.decision_log_path,
                                      ttl_s=settings.cache.ttl_s)
    return JsonlDecisionLog(settings.log.decision_log_path)


def feedback_record(decision_id: str, label: str) -> dict[str, Any]:
    return {"type": "feedback", "decision_id": decision_id, "label": label, "time": time.time()}


def encode_record(record: dict[str, Any]) -> bytes:
    """A record's JSON, serialised once for the file, the index and Redis alike."""
    try:
        return orjson.dumps(record, default=_jsonable, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError:  # orjson.JSONEncodeError: e.g. non-string keys, integers past 64 bits
        return json.dumps(record, ensure_ascii=False, separators=(",", ":"),
                          default=_jsonable).encode()


def read_records(path: Path, *, events: bool = False) -> Iterator[dict[str, Any]]:
    """Every parseable record of a JSONL log; a torn last line (a crash mid-write) is skipped.
    Records without a decision id (monitoring alarms) only with ``events``."""
    if not path.is_file():
        return
    with path.open("rb") as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and (record.get("decision_id") or
                                             (events and record.get("type"))):
                yield record


def export_predictions(source: Settings | Path | str, out_path: Path | str, *,
                       signature: str | None = None, labelled_only: bool = False) -> int:
    """Join a JSONL decision log with its feedback into the predictions format (id, options, raw
    proba, label or null, signature, fingerprint, text); returns the rows written. A predictions
    file holds one question, so a log of several needs ``signature``. Decisions without a fast
    read (no proba) are left out; the latest feedback label wins."""
    from router.tuning.predictions import PredictionsError, write_predictions

    path = Path(source) if isinstance(source, str | Path) else source.log.decision_log_path
    decisions: dict[str, dict[str, Any]] = {}
    labels: dict[str, str] = {}
    for record in read_records(path):
        decision_id = str(record["decision_id"])
        if record.get("type") == "feedback":
            labels[decision_id] = str(record["label"])
        elif record.get("proba") is not None and record.get("options"):
            decisions[decision_id] = record
    by_signature: dict[str, list[str]] = {}
    for decision_id, record in decisions.items():
        by_signature.setdefault(_question(record), []).append(decision_id)
    if signature is None and len(by_signature) > 1:
        listing = ", ".join(f"{s} ({len(ids)} decisions)" for s, ids in
                            sorted(by_signature.items(), key=lambda kv: -len(kv[1])))
        raise PredictionsError(path, None, "signature", f"the log holds {len(by_signature)} "
                               f"different questions; choose one with --signature: {listing}")
    chosen = by_signature.get(signature, []) if signature else next(iter(by_signature.values()), [])
    rows = []
    for decision_id in chosen:
        record = decisions[decision_id]
        label = labels.get(decision_id)
        row = {"id": decision_id, "options": list(record["options"]),
               "proba": [float(p) for p in record["proba"]],
               "label": label if label in record["options"] else None}
        row.update({k: record[k] for k in ("signature", "fingerprint", "text") if record.get(k)})
        if row["label"] is not None or not labelled_only:
            rows.append(row)
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    write_predictions(Path(out_path), rows)
    return len(rows)


def _question(record: dict[str, Any]) -> str:
    """What one predictions file may hold: the signature, else the ordered options."""
    return str(record.get("signature") or json.dumps(record["options"]))


def _open_for_append(path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    # A crash mid-write can leave a torn last line; end it so the next record starts clean.
    size = os.fstat(fd).st_size
    if size:
        with path.open("rb") as f:
            f.seek(size - 1)
            if f.read(1) != b"\n":
                os.write(fd, b"\n")
    return fd


def _fsync_close(fd: int) -> None:
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _jsonable(value: Any) -> Any:
    """numpy scalars and arrays, paths and the like, as JSON can hold them."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)
