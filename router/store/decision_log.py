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
import logging
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from router.store.decision_index import DecisionIndex
from router.store.log_reader import read_log
from router.store.records import (
    AlarmRecord,
    AuditRecord,
    DecisionRecord,
    DecisionView,
    FeedbackRecord,
    as_decision,
    encode,
    record_adapter,
)

logger = logging.getLogger(__name__)

EventRecord = AuditRecord | AlarmRecord


class DecisionLog(ABC):
    """Append-only store of typed records (``router.store.records``): decisions, their
    feedback, and events (audits, alarms)."""

    @abstractmethod
    async def append(self, record: DecisionRecord | dict[str, Any]) -> None:
        """Store one decision record durably (see the module docstring) before returning. A
        mapping is validated into a ``DecisionRecord`` first (ValueError when it is not one)."""

    @abstractmethod
    async def get(self, decision_id: str) -> DecisionView | None:
        """What feedback needs of a decision, or None when unknown. The full record is in the
        file, not in memory."""

    @abstractmethod
    async def add_feedback(self, decision_id: str, label: str) -> None:
        """Store the true answer of a logged decision."""

    async def add_event(self, record: EventRecord | dict[str, Any]) -> None:
        """Store an audit or alarm record (never returned by ``get``)."""
        raise NotImplementedError(f"{type(self).__name__} does not store events")

    async def aclose(self) -> None:
        """Flush everything to disk. Idempotent; a later append reopens."""


class JsonlDecisionLog(DecisionLog):
    """One JSON object per line. ``get`` is served by a DecisionIndex of recent decisions (rebuilt
    from the file at start-up, damaged lines skipped and counted) holding only what feedback
    needs, bounded by entries and bytes: a 900 KB message costs the index what a 20-byte one
    does."""

    def __init__(self, path: Path | str, *, fsync_interval_s: float = 1.0,
                 max_index: int = 100_000, max_index_bytes: int = 32 * 2**20) -> None:
        self.path = Path(path)
        self.fsync_interval_s = fsync_interval_s
        self._fd: int | None = None
        self._last_fsync = time.monotonic()
        self.index = DecisionIndex(max_entries=max_index, max_bytes=max_index_bytes)
        for record in read_log(self.path):
            if isinstance(record, DecisionRecord):
                self._remember(record)

    async def append(self, record: DecisionRecord | dict[str, Any]) -> None:
        await self.append_encoded(record)

    async def append_encoded(self, record: DecisionRecord | dict[str, Any], *,
                             unsynced: bool = False) -> bytes:
        """``append``, returning the record's JSON (no newline) for other copies to reuse;
        ``unsynced`` marks it in the index as not yet in Redis."""
        decision = as_decision(record)
        data = encode(decision)
        await self._write(data)
        self._remember(decision, unsynced=unsynced)
        return data

    async def get(self, decision_id: str) -> DecisionView | None:
        return self.index.get(decision_id)

    async def add_feedback(self, decision_id: str, label: str) -> None:
        await self.add_feedback_encoded(decision_id, label)

    async def add_feedback_encoded(self, decision_id: str, label: str) -> bytes:
        data = encode(FeedbackRecord(decision_id=decision_id, label=label))
        await self._write(data)
        return data

    async def add_event(self, record: EventRecord | dict[str, Any]) -> None:
        await self.add_event_encoded(record)

    async def add_event_encoded(self, record: EventRecord | dict[str, Any]) -> bytes:
        data = encode(as_event(record))
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

    def _remember(self, record: DecisionRecord, *, unsynced: bool = False) -> None:
        self.index.add(record.decision_id, record.options, record.answer,
                       {"namespace": record.namespace, "policy_id": record.policy_id,
                        "route": record.route, "escalated": record.escalated},
                       unsynced=unsynced)


def as_event(record: EventRecord | dict[str, Any]) -> EventRecord:
    """An audit or alarm record, validated when it came as a mapping."""
    if isinstance(record, AuditRecord | AlarmRecord):
        return record
    event = record_adapter.validate_python({"time": time.time(), **record})
    if not isinstance(event, AuditRecord | AlarmRecord):
        raise ValueError(  # noqa: TRY004 - bad input, as pydantic reports it
            "an event record is an audit or an alarm, not a decision or feedback")
    return event


def read_records(path: Path, *, events: bool = False) -> Iterator[dict[str, Any]]:
    """The valid records of a JSONL log as plain dicts (those of a decision: decisions, feedback,
    audits; alarms too with ``events``): for tests and scripts. Code reads typed records
    (``router.store.log_reader.read_log``)."""
    for record in read_log(path):
        if events or not isinstance(record, AlarmRecord):
            yield record.model_dump()


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
