"""The one reader of decision logs: streams JSONL files (and the Redis stream) as typed records
(``router.store.records``), skipping damaged lines and counting them. Nothing here raises on a
bad line or recurses on deep nesting (orjson stops at depth 1024 with a JSONDecodeError); each
file read ends with one summary warning when lines were skipped."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from router.store.records import (
    RECORD_TYPES,
    AlarmRecord,
    AuditRecord,
    DecisionRecord,
    FeedbackRecord,
    record_adapter,
)

logger = logging.getLogger("slotgate.log")

AnyRecord = DecisionRecord | FeedbackRecord | AuditRecord | AlarmRecord


@dataclass
class ReadCounts:
    """What a read skipped: ``damaged`` lines (not JSON, too deeply nested, not a valid record)
    and records of a ``type`` this version does not know (written by a newer one)."""

    records: int = 0
    damaged: int = 0
    unknown_type: int = 0
    first_damage: str | None = None  # "SOURCE line N: why", of the first damaged line

    def warn(self, source: str, before: tuple[int, int]) -> None:
        """The one summary line of a source read, when it skipped anything."""
        damaged, unknown = self.damaged - before[0], self.unknown_type - before[1]
        if not damaged and not unknown:
            return
        text = f"decision log {source}: {damaged} damaged line(s) skipped"
        if damaged and self.first_damage:
            text += f" (first: {self.first_damage})"
        if unknown:
            text += f"; {unknown} record(s) of a type this version does not read skipped"
        logger.warning("%s", text)


class DamagedRecord(ValueError):
    """A log line that is not a record of a known type; ``unknown_type`` when it is a well-formed
    record of a type this version does not read."""

    def __init__(self, reason: str, *, unknown_type: bool = False) -> None:
        super().__init__(reason)
        self.unknown_type = unknown_type


def parse_record(data: bytes | str) -> AnyRecord:
    """One line (or stream entry) as a typed record; ``DamagedRecord`` saying why not."""
    try:
        obj: Any = orjson.loads(data)
    except orjson.JSONDecodeError as exc:  # also "depth limit exceeded", never a RecursionError
        raise DamagedRecord(f"not JSON ({exc})") from exc
    if not isinstance(obj, dict):
        raise DamagedRecord(f"a JSON {type(obj).__name__}, not an object")
    kind = obj.get("type")
    if kind is None and "decision_id" in obj:  # older logs' decisions carry no type
        obj["type"] = kind = "decision"
    if kind not in RECORD_TYPES:
        raise DamagedRecord(f"unknown record type {kind!r}", unknown_type=isinstance(kind, str))
    try:
        return record_adapter.validate_python(obj)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"][1:]) or "record"
        raise DamagedRecord(f"{kind} record, field {where!r}: {first['msg']}") from exc


def read_log(path: Path, *, counts: ReadCounts | None = None,
             quiet: bool = False) -> Iterator[AnyRecord]:
    """Every valid record of a JSONL log, in file order, streamed (memory does not grow with
    the file). A missing file holds no records. Damaged lines are skipped and counted in
    ``counts``; unless ``quiet``, one warning sums them up when the file has been read."""
    counts = counts if counts is not None else ReadCounts()
    if not path.is_file():
        return
    before = (counts.damaged, counts.unknown_type)
    with path.open("rb") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = parse_record(line)
            except DamagedRecord as exc:
                _count(counts, exc, f"{path.name} line {number}")
                continue
            counts.records += 1
            yield record
    if not quiet:
        counts.warn(str(path), before)


def read_logs(paths: Iterable[Path], *, redis_stream: tuple[str, str] | None = None,
              counts: ReadCounts | None = None, quiet: bool = False) -> Iterator[AnyRecord]:
    """The records of several logs (one per replica) and, with ``redis_stream`` (url, stream
    name), of the Redis stream every replica writes to, one after the other."""
    for path in paths:
        yield from read_log(path, counts=counts, quiet=quiet)
    if redis_stream is not None:
        yield from read_stream(*redis_stream, counts=counts, quiet=quiet)


def read_stream(url: str, stream: str, *, chunk: int = 1000, counts: ReadCounts | None = None,
                quiet: bool = False) -> Iterator[AnyRecord]:
    """Every record of the decision log's Redis stream, oldest first, read in chunks."""
    import redis

    counts = counts if counts is not None else ReadCounts()
    before = (counts.damaged, counts.unknown_type)
    client: Any = redis.Redis.from_url(url)  # redis-py's sync stubs type replies loosely
    try:
        start = "-"
        while True:
            entries = client.xrange(stream, min=start, max="+", count=chunk)
            for entry_id, fields in entries:
                try:
                    record = parse_record(fields.get(b"data", b""))
                except DamagedRecord as exc:
                    _count(counts, exc, f"entry {entry_id.decode()}")
                    continue
                counts.records += 1
                yield record
            if len(entries) < chunk:
                break
            start = "(" + entries[-1][0].decode()  # exclusive: after the last one read
    finally:
        client.close()
    if not quiet:
        counts.warn(f"redis stream {stream}", before)


def _count(counts: ReadCounts, exc: DamagedRecord, where: str) -> None:
    if exc.unknown_type:
        counts.unknown_type += 1
        return
    counts.damaged += 1
    if counts.first_damage is None:
        counts.first_damage = f"{where}: {str(exc)[:200]}"
