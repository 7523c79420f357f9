"""Policy alarms shared by the replicas through Redis. A replica that raises an alarm posts it;
every replica reads the records of the policies it serves every ``monitoring.alarm_sync_s``,
latches the alarms it has not raised itself, applies an operator's clear, and posts again an
alarm it holds that Redis lost (a restart with an empty store, an expired key).

Keys: ``slotgate:v1:alarm:{sha256 of the policy id}:{kind}`` for ``drift`` and ``accuracy`` (the
first alarm of a kind kept, ``SET NX``) and ``...:clear`` (the latest clear, overwritten), JSON,
expiring with the cache's TTL. Ids are hashed so no text reaches a key. A re-tuned policy has a
new id, so its replicas start clean. Redis failing costs the sharing only (logged once a
minute); a damaged record costs its own key only (logged once a minute), never the others'."""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Sequence
from typing import Any

import orjson

from router.store.redis_client import redis_client, redis_errors

logger = logging.getLogger(__name__)
KEY_PREFIX = "slotgate:v1:alarm:"
KINDS = ("drift", "accuracy", "clear")
LOG_INTERVAL_S = 60.0


def alarm_key(policy_id: str, kind: str) -> str:
    return f"{KEY_PREFIX}{hashlib.sha256(policy_id.encode()).hexdigest()}:{kind}"


def valid_record(record: Any, policy_id: str, kind: str) -> bool:
    """A record this version can act on, stored under its own policy's and kind's key."""
    return (isinstance(record, dict) and record.get("policy_id") == policy_id
            and record.get("kind") == kind
            and isinstance(record.get("decision"), int) and not isinstance(
                record.get("decision"), bool)
            and isinstance(record.get("time"), int | float)
            and isinstance(record.get("detail"), str))


class RedisAlarmBoard:
    def __init__(self, url: str, *, ttl_s: int, timeout_s: float = 0.25) -> None:
        self.ttl_s = int(ttl_s)
        self.client: Any = redis_client(url, timeout_s=timeout_s)
        self._last_log: dict[str, float] = {}

    async def post(self, record: dict[str, Any]) -> None:
        """Share an alarm record (``policy_id``, ``kind``, ``decision``, ``time``, ``detail``);
        a clear record replaces the one before it, an alarm only fills an empty key."""
        kind = str(record["kind"])
        try:
            await self.client.set(alarm_key(str(record["policy_id"]), kind),
                                  orjson.dumps(record), nx=kind != "clear", ex=self.ttl_s)
        except redis_errors() as exc:
            self._failed("post", exc)

    async def clear(self, policy_id: str, at: float, detail: str) -> None:
        """An operator's clear: the clear record, and the alarms it supersedes deleted, in one
        transaction. Raises the client's error (the CLI says so; nothing is half done)."""
        record = {"type": "alarm", "policy_id": policy_id, "kind": "clear", "decision": 0,
                  "time": at, "detail": detail}
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.set(alarm_key(policy_id, "clear"), orjson.dumps(record), ex=self.ttl_s)
            pipe.delete(alarm_key(policy_id, "drift"), alarm_key(policy_id, "accuracy"))
            await pipe.execute()

    async def read(self, policy_ids: Sequence[str]) -> list[dict[str, Any]] | None:
        """The shared records of these policies, clears included; None while Redis fails."""
        if not policy_ids:
            return []
        wanted = [(p, kind) for p in policy_ids for kind in KINDS]
        try:
            blobs = await self.client.mget([alarm_key(p, kind) for p, kind in wanted])
        except redis_errors() as exc:
            self._failed("read", exc)
            return None
        records = []
        for (policy_id, kind), blob in zip(wanted, blobs, strict=True):
            if blob is None:
                continue
            try:
                record = orjson.loads(blob)
            except orjson.JSONDecodeError:
                record = None
            if valid_record(record, policy_id, kind):
                records.append(record)
            else:  # not ours, or damaged: never trusted, and never in the way of the others
                self._log_once("damaged", "shared policy alarms: damaged record under %s skipped "
                               "(the other policies' records still count)",
                               alarm_key(policy_id, kind))
        return records

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
