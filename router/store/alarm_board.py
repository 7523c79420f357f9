"""Policy alarms shared by the replicas through Redis. A replica that raises an alarm posts it;
every replica reads the records of the policies it serves every ``monitoring.alarm_sync_s``,
latches the alarms it has not raised itself, applies an operator's clear, and posts again an
alarm it holds that Redis lost (a restart with an empty store, an expired key).

Keys: ``slotgate:v1:alarm:{sha256 of the policy id}:{kind}`` for ``drift``, ``accuracy`` and
``cost`` (a broken cost promise; the first alarm of a kind kept) and ``...:clear`` (the latest
clear, overwritten), each an ``AlarmRecord``'s JSON (router/store/records.py) expiring with the
cache's TTL. A clear record, however it is posted, ends the policy's alarm keys raised at or
before its time (one Lua script: the comparison and the deletes are atomic), and an alarm key
raised at or before the standing clear is overwritten by the next alarm of its kind, so a
cleared alarm never blocks a later one; an alarm raised after the clear stays. Ids are hashed so
no text reaches a key. A re-tuned policy has a new id, so its replicas start clean. Redis
failing costs the sharing only (logged once a minute); a damaged record costs its own key only
(logged once a minute), never the others'."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
from collections.abc import Sequence
from typing import Any, get_args

from pydantic import ValidationError

from router.store.records import AlarmRecord, AlarmRecordKind, encode
from router.store.redis_client import redis_client, redis_errors

logger = logging.getLogger(__name__)
KEY_PREFIX = "slotgate:v1:alarm:"
KINDS: tuple[AlarmRecordKind, ...] = get_args(AlarmRecordKind)
ALARM_KINDS = tuple(kind for kind in KINDS if kind != "clear")  # what a clear supersedes
LOG_INTERVAL_S = 60.0

# KEYS: the clear key, then the policy's alarm keys; ARGV: the clear record, the TTL. An alarm
# key whose record's time is at or before the clear's goes; a record with no numeric time (a
# damaged one) is left to expire: its time cannot be compared.
_POST_CLEAR = """
local clear = cjson.decode(ARGV[1])
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
local ended = 0
for i = 2, #KEYS do
  local blob = redis.call('GET', KEYS[i])
  if blob then
    local ok, alarm = pcall(cjson.decode, blob)
    if ok and type(alarm) == 'table' and type(alarm.time) == 'number'
        and alarm.time <= clear.time then
      ended = ended + redis.call('DEL', KEYS[i])
    end
  end
end
return ended
"""

# KEYS: the alarm's key, the policy's clear key; ARGV: the alarm record, the TTL. The alarm fills
# an empty key, or one holding an alarm raised at or before the standing clear; one raised at or
# before that clear itself is not posted. Returns 1 when posted.
_POST_ALARM = """
local function time_of(blob)
  if not blob then return nil end
  local ok, record = pcall(cjson.decode, blob)
  if ok and type(record) == 'table' and type(record.time) == 'number' then
    return record.time
  end
  return nil
end
local cleared = time_of(redis.call('GET', KEYS[2]))
local raised = cjson.decode(ARGV[1]).time
if cleared and raised <= cleared then return 0 end
local held = redis.call('GET', KEYS[1])
if held then
  local held_at = time_of(held)
  if not (cleared and held_at and held_at <= cleared) then return 0 end
end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
return 1
"""


def alarm_key(policy_id: str, kind: str) -> str:
    return f"{KEY_PREFIX}{hashlib.sha256(policy_id.encode()).hexdigest()}:{kind}"


def parse_record(blob: bytes, key: str) -> AlarmRecord:
    """The alarm record stored under ``key``: one strict parse (no string for a number, no
    boolean for a decision count), and it must be the record of the policy and kind its key
    names. Raises ValueError naming the field that is wrong."""
    try:
        record = AlarmRecord.model_validate_json(blob, strict=True)
    except ValidationError as exc:
        raise ValueError("; ".join(f"{'.'.join(map(str, e['loc'])) or 'record'}: {e['msg']}"
                                   for e in exc.errors())) from exc
    if alarm_key(record.policy_id, record.kind) != key:
        if not key.endswith(f":{record.kind}"):
            raise ValueError(f"kind: {record.kind!r} is not the kind its key names")
        raise ValueError(f"policy_id: {record.policy_id!r} is not the policy its key names")
    return record


class RedisAlarmBoard:
    def __init__(self, url: str, *, ttl_s: int, timeout_s: float = 0.25) -> None:
        self.ttl_s = int(ttl_s)
        self.client: Any = redis_client(url, timeout_s=timeout_s)
        self._last_log: dict[str, float] = {}

    async def post(self, record: AlarmRecord) -> None:
        """Share an alarm record: a clear record replaces the one before it and ends the
        policy's alarms raised at or before it (``_post_clear``); an alarm fills an empty key or
        one whose alarm the standing clear superseded, and is not posted when that clear
        supersedes it too."""
        try:
            if record.kind == "clear":
                await self._post_clear(record)
            else:
                await self.client.eval(
                    _POST_ALARM, 2, alarm_key(record.policy_id, record.kind),
                    alarm_key(record.policy_id, "clear"), encode(record), self.ttl_s)
        except redis_errors() as exc:
            self._failed("post", exc)

    async def clear(self, policy_id: str, at: float, detail: str) -> None:
        """An operator's clear: the clear record, and the alarms it supersedes deleted, at
        once. Raises the client's error (the CLI says so; nothing is half done)."""
        await self._post_clear(AlarmRecord(policy_id=policy_id, kind="clear", decision=0,
                                           time=at, detail=detail))

    async def _post_clear(self, record: AlarmRecord) -> int:
        """The clear record set, and the policy's alarm keys raised at or before its time
        deleted, in one script; how many were deleted. Raises the client's error."""
        keys = [alarm_key(record.policy_id, kind) for kind in ("clear", *ALARM_KINDS)]
        return int(await self.client.eval(_POST_CLEAR, len(keys), *keys, encode(record),
                                          self.ttl_s))

    async def read(self, policy_ids: Sequence[str]) -> list[AlarmRecord] | None:
        """The shared records of these policies, clears included; None while Redis fails."""
        if not policy_ids:
            return []
        keys = [alarm_key(p, kind) for p in policy_ids for kind in KINDS]
        try:
            blobs = await self.client.mget(keys)
        except redis_errors() as exc:
            self._failed("read", exc)
            return None
        records = []
        for key, blob in zip(keys, blobs, strict=True):
            if blob is None:
                continue
            try:
                records.append(parse_record(blob, key))
            except ValueError as exc:  # never trusted, and never in the way of the others
                self._log_once("damaged", "shared policy alarms: damaged record under %s "
                               "skipped (%s); the other policies' records still count", key, exc)
        return records

    async def policy_ids(self) -> set[str]:
        """The policy ids of every readable record on the board (ids are hashed in keys: read
        them back). Raises the client's error."""
        ids = set()
        async for key in self.client.scan_iter(match=KEY_PREFIX + "*", count=500):
            blob = await self.client.get(key)
            if blob is None:
                continue
            with contextlib.suppress(ValueError):  # a damaged record names no id to trust
                ids.add(parse_record(blob, key.decode()).policy_id)
        return ids

    async def aclose(self) -> None:
        await self.client.aclose()

    def _failed(self, operation: str, exc: BaseException) -> None:
        self._log_once("redis", "shared policy alarms: redis %s failed (%s: %s); each replica "
                       "acts on its own alarms meanwhile", operation, type(exc).__name__, exc)

    def _log_once(self, topic: str, message: str, *args: Any) -> None:
        """At most one line a minute per topic: a sync every 2 s must not flood the log."""
        now = time.monotonic()
        if now - self._last_log.get(topic, -LOG_INTERVAL_S) >= LOG_INTERVAL_S:
            self._last_log[topic] = now
            logger.warning(message, *args)
