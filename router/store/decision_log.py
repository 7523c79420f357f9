"""The decision log: every decision and every feedback label, append-only, for audit and for
recalibration from production traffic (router/tuning/log_export.py -> ``slotgate tune``).

Durability: the JSONL file is the record of truth. Each record is one ``os.write`` on an
O_APPEND descriptor before ``append`` returns (so before the caller's 2xx): it survives the
process being killed; ``fsync`` runs at most every ``fsync_interval_s`` (0: on every record) and
on ``aclose``, so a machine crash loses at most that interval. With Redis configured, records are
*also* sent to Redis (``redis_log.py``), write-behind: batched off the request path a few ms
later. The JSONL copy means a Redis restart without persistence, an outage or records still
queued at a crash lose nothing, and fail no request.

A file that cannot take a record (a full disk: ENOSPC, EIO) fails no decision either: the
decision was answered, so it and every later decision or event are kept in memory, in order
(the spool, at most ``spool_bytes``), and written before the next record once the file takes
writes again; a record beyond the spool is dropped and counted (``on_unlogged``). A process
that dies with records spooled loses them. ``failing`` says why the file fails (for /readyz);
``recheck`` tries the file again by itself (the spool, or a one-byte probe beside the log) at
most every ``recheck_interval_s``, so a replica taken out of rotation sees space come back
without traffic. One warning says so when writing stops and one when it works again, never one
per record. A short write is rolled back (truncated) and, after any failure, a torn last line is
ended before the next record, so no line is torn or glued to the next. A feedback label the file
cannot take is refused (``LogUnavailable``, 503): the client can send it again.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from router.errors import LogUnavailable
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
DEFAULT_SPOOL_BYTES = 16 * 2**20  # records kept in memory while the file cannot take them

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
    async def add_feedback(self, decision_id: str, label: str, *, trusted: bool) -> None:
        """Store the true answer of a logged decision, and whether its labeller is trusted."""

    async def add_event(self, record: EventRecord | dict[str, Any]) -> None:
        """Store an audit or alarm record (never returned by ``get``)."""
        raise NotImplementedError(f"{type(self).__name__} does not store events")

    async def aclose(self) -> None:
        """Flush everything to disk. Idempotent; a later append reopens."""

    @property
    def failing(self) -> str | None:
        """Why the log cannot store records now (for /readyz), or None while it can."""
        return None

    async def recheck(self) -> str | None:
        """``failing``, after trying the store again where it failed (rate-limited)."""
        return self.failing

    @property
    def spooled(self) -> tuple[int, int]:
        """(records, bytes) answered but not yet stored, kept in memory until the store takes them."""
        return 0, 0


class JsonlDecisionLog(DecisionLog):
    """One JSON object per line. ``get`` is served by a DecisionIndex of recent decisions (rebuilt
    from the file at start-up, damaged lines skipped and counted) holding only what feedback
    needs, bounded by entries and bytes: a 900 KB message costs the index what a 20-byte one
    does. The spool (the module docstring) holds whole lines, oldest first."""

    def __init__(self, path: Path | str, *, fsync_interval_s: float = 1.0,
                 max_index: int = 100_000, max_index_bytes: int = 32 * 2**20,
                 spool_bytes: int = DEFAULT_SPOOL_BYTES, recheck_interval_s: float = 1.0,
                 on_unlogged: Callable[[str], None] | None = None) -> None:
        self.path = Path(path)
        self.fsync_interval_s = fsync_interval_s
        self.spool_bytes = spool_bytes
        self.recheck_interval_s = recheck_interval_s
        self.on_unlogged = on_unlogged  # (record kind) -> None, for each record not written
        self._failing: str | None = None
        self._unlogged = 0  # records dropped or refused since writing last failed
        self._kept = 0  # records spooled since writing last failed
        self._spool: deque[bytes] = deque()
        self._spool_size = 0
        self._fd: int | None = None
        self._last_fsync = time.monotonic()
        self._last_try = 0.0  # monotonic time the file was last tried
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
        await self._write(data, "decision")
        self._remember(decision, unsynced=unsynced)
        return data

    async def get(self, decision_id: str) -> DecisionView | None:
        return self.index.get(decision_id)

    async def add_feedback(self, decision_id: str, label: str, *, trusted: bool) -> None:
        await self.add_feedback_encoded(decision_id, label, trusted=trusted)

    async def add_feedback_encoded(self, decision_id: str, label: str, *, trusted: bool) -> bytes:
        data = encode(FeedbackRecord(decision_id=decision_id, label=label, trusted=trusted))
        if not await self._write(data, "feedback", spool=False):
            raise LogUnavailable(f"the decision log cannot store the label now ({self._failing}); "
                                 "send it again later", field="label")
        return data

    async def add_event(self, record: EventRecord | dict[str, Any]) -> None:
        await self.add_event_encoded(record)

    async def add_event_encoded(self, record: EventRecord | dict[str, Any]) -> bytes:
        event = as_event(record)
        data = encode(event)
        await self._write(data, event.type)
        return data

    async def aclose(self) -> None:
        if self._spool:
            try:
                self._prepare()
            except OSError as exc:
                logger.error("decision log %s: %d answered records kept in memory are lost at "
                             "shutdown: %s", self.path, len(self._spool), exc.strerror or exc)
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                await asyncio.to_thread(_fsync_close, fd)
            except OSError as exc:  # a full disk at shutdown: said, and the shutdown goes on
                logger.error("decision log %s: the last records may not be on disk: %s",
                             self.path, exc.strerror or exc)

    @property
    def failing(self) -> str | None:
        return self._failing

    @property
    def spooled(self) -> tuple[int, int]:
        return len(self._spool), self._spool_size

    async def recheck(self) -> str | None:
        """While failing, and at most every ``recheck_interval_s``: the spool written, or (with
        none) a one-byte probe file beside the log; why it still fails, or None."""
        if self._failing is None or time.monotonic() - self._last_try < self.recheck_interval_s:
            return self._failing
        self._last_try = time.monotonic()
        try:
            probe = not self._spool  # else writing the spool is the test
            self._prepare()
            if probe:
                _probe(self.path)
        except OSError:
            return self._failing
        if await self._synced():
            self._writing_again()
        return self._failing

    async def _write(self, data: bytes, kind: str, *, spool: bool = True) -> bool:
        """One record as one line after any spooled ones; True when it is in the file. A record
        the file cannot take is spooled (``spool``, within its bound) or counted and dropped (the
        module docstring); nothing is raised."""
        line = data + b"\n"
        self._last_try = time.monotonic()
        try:
            fd = self._prepare()
            # One write per record on O_APPEND: lines from concurrent writers never interleave.
            _write_whole(fd, line)
        except OSError as exc:
            self._not_written(kind, exc, line if spool else None)
            return False
        if await self._synced():
            self._writing_again()
        return True

    def _prepare(self) -> int:
        """The file open, a torn last line ended after a failure, and the spool written to it,
        oldest first; raises OSError at the first line it cannot write (that line and those after
        it stay spooled)."""
        if self._fd is None:
            self._fd = _open_for_append(self.path)
        elif self._failing is not None:
            _end_torn_line(self.path, self._fd)
        while self._spool:
            _write_whole(self._fd, self._spool[0])
            self._spool_size -= len(self._spool.popleft())
        return self._fd

    async def _synced(self) -> bool:
        """fsync when one is due; False when it failed (the lines are written; whether they
        reach the disk is not known, so the log is failing until a later write goes through)."""
        if self._fd is None or time.monotonic() - self._last_fsync < self.fsync_interval_s:
            return True
        self._last_fsync = time.monotonic()
        try:
            await asyncio.to_thread(os.fsync, self._fd)
        except OSError as exc:
            self._failed(exc)
            return False
        return True

    def _not_written(self, kind: str, exc: OSError, line: bytes | None) -> None:
        if line is not None and self._spool_size + len(line) <= self.spool_bytes:
            self._spool.append(line)
            self._spool_size += len(line)
            self._kept += 1
        else:
            self._unlogged += 1
            if self.on_unlogged is not None:
                self.on_unlogged(kind)
        self._failed(exc)

    def _failed(self, exc: OSError) -> None:
        if self._failing is None:
            self._failing = f"cannot write {self.path}: {exc.strerror or exc}"
            logger.error("decision log %s: %s; decisions are still answered, and kept in memory "
                         "(up to log.spool_bytes, %d bytes; beyond it they are not logged: "
                         "slotgate_unlogged_records_total) until it can write again; /readyz says "
                         "so", self.path, exc.strerror or exc, self.spool_bytes)

    def _writing_again(self) -> None:
        if self._failing is not None and not self._spool:
            logger.warning("decision log %s: writing again; %d records kept in memory were "
                           "written, %d were not logged", self.path, self._kept, self._unlogged)
            self._failing, self._kept, self._unlogged = None, 0, 0

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


def _probe(path: Path) -> None:
    """One byte written to a scratch file beside the log, then removed: whether the log's
    filesystem takes a write now, without adding a line to the log."""
    scratch = path.with_name(f".{path.name}.probe")
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        _write_whole(fd, b"\n")
    finally:
        os.close(fd)
        scratch.unlink(missing_ok=True)


def _open_for_append(path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        _end_torn_line(path, fd)  # a crash mid-write can leave a torn last line
    except OSError:
        os.close(fd)
        raise
    return fd


def _end_torn_line(path: Path, fd: int) -> None:
    """End a torn last line, so the next record starts on a line of its own."""
    size = os.fstat(fd).st_size
    if size:
        with path.open("rb") as f:
            f.seek(size - 1)
            if f.read(1) != b"\n":
                _write_whole(fd, b"\n")


def _write_whole(fd: int, data: bytes) -> None:
    """All of ``data`` at the end of the file, or none of it: a short write (the disk filled
    mid-record) is completed or, when the rest cannot be written, truncated away."""
    written = 0
    try:
        while written < len(data):
            n = os.write(fd, data[written:])
            if n == 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            written += n
    except OSError:
        if written:
            os.ftruncate(fd, os.fstat(fd).st_size - written)
        raise


def _fsync_close(fd: int) -> None:
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
