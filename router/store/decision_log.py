"""The decision log: every decision and every feedback label, append-only, for audit and for
recalibration from production traffic (router/tuning/log_export.py -> ``slotgate tune``).

Durability: the JSONL file is the record of truth. Each record is one ``os.write`` on an
O_APPEND descriptor before ``append`` returns (so before the caller's 2xx): it survives the
process being killed; ``fsync`` runs at most every ``fsync_interval_s`` (0: on every record) and
on ``aclose``, so a machine crash loses at most that interval. With Redis configured, records are
*also* sent to Redis (``redis_log.py``), write-behind: batched off the request path a few ms
later. The JSONL copy means a Redis restart without persistence, an outage or records still
queued at a crash lose nothing, and fail no request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from router.store.decision_index import DecisionIndex

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
        """What feedback needs of a decision (``decision_index.feedback_view``: id, options,
        answer, namespace, policy, route, escalated), or None when unknown. The full record is
        in the file, not in memory."""

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
    """One JSON object per line. ``get`` is served by a DecisionIndex of recent decisions (rebuilt
    from the file at start-up) holding only what feedback needs, bounded by entries and bytes:
    a 900 KB message costs the index what a 20-byte one does."""

    def __init__(self, path: Path | str, *, fsync_interval_s: float = 1.0,
                 max_index: int = 100_000, max_index_bytes: int = 32 * 2**20) -> None:
        self.path = Path(path)
        self.fsync_interval_s = fsync_interval_s
        self._fd: int | None = None
        self._last_fsync = time.monotonic()
        self.index = DecisionIndex(max_entries=max_index, max_bytes=max_index_bytes)
        for record in read_records(self.path):
            if record.get("type", "decision") == "decision":
                self._remember(record)

    async def append(self, record: dict[str, Any]) -> None:
        await self.append_encoded(record)

    async def append_encoded(self, record: dict[str, Any], *, unsynced: bool = False) -> bytes:
        """``append``, returning the record's JSON (no newline) for other copies to reuse;
        ``unsynced`` marks it in the index as not yet in Redis."""
        if not record.get("decision_id"):
            raise ValueError("record needs a decision_id")
        data = encode_record({"type": "decision", **record})
        await self._write(data)
        self._remember(record, unsynced=unsynced)
        return data

    async def get(self, decision_id: str) -> dict[str, Any] | None:
        return self.index.get(decision_id)

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

    def _remember(self, record: dict[str, Any], *, unsynced: bool = False) -> None:
        answer = record.get("answer")
        self.index.add(str(record["decision_id"]), [str(o) for o in record.get("options") or ()],
                       None if answer is None else str(answer), record, unsynced=unsynced)


def make_decision_log(settings: Settings) -> DecisionLog:
    """The Redis stream (plus JSONL) when a Redis URL is configured, else the JSONL file."""
    jsonl = JsonlDecisionLog(settings.log.decision_log_path, max_index=settings.log.max_index,
                             max_index_bytes=settings.log.max_index_bytes)
    if settings.cache.redis_url:
        from router.store.redis_log import RedisStreamDecisionLog

        return RedisStreamDecisionLog(settings.cache.redis_url, settings.log.redis_stream,
                                      jsonl=jsonl, ttl_s=settings.cache.ttl_s)
    return jsonl


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
