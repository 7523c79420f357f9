"""Policy alarms shared by the replicas through Redis. A replica that raises an alarm posts it;
every replica reads the alarms of the policies it serves every ``monitoring.alarm_sync_s`` and
latches any it has not raised itself, so an alarm acts on the whole fleet, not on the one
process whose share of the traffic showed it.

Key: ``slotgate:v1:alarm:{sha256 of the policy id}`` (ids come from policy files; hashed so no
text reaches a key), the alarm record as JSON, the first alarm kept (``SET NX``), expiring with
the cache's TTL. A re-tuned policy has a new id, so its replicas start clean without anyone
deleting anything. Redis failing costs the sharing only: posts and reads are dropped (logged
once a minute), each replica's own alarms still act."""

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
LOG_INTERVAL_S = 60.0


def alarm_key(policy_id: str) -> str:
    return KEY_PREFIX + hashlib.sha256(policy_id.encode()).hexdigest()


class RedisAlarmBoard:
    def __init__(self, url: str, *, ttl_s: int, timeout_s: float = 0.25) -> None:
        self.ttl_s = int(ttl_s)
        self.client: Any = redis_client(url, timeout_s=timeout_s)
        self._last_log = -LOG_INTERVAL_S

    async def post(self, record: dict[str, Any]) -> None:
        """Share an alarm record (``policy_id``, ``kind``, ``decision``, ``time``, ``detail``)."""
        try:
            await self.client.set(alarm_key(str(record["policy_id"])), orjson.dumps(record),
                                  nx=True, ex=self.ttl_s)
        except redis_errors() as exc:
            self._failed("post", exc)

    async def read(self, policy_ids: Sequence[str]) -> list[dict[str, Any]]:
        """The shared alarm records of these policies (none while Redis fails)."""
        if not policy_ids:
            return []
        try:
            blobs = await self.client.mget([alarm_key(p) for p in policy_ids])
        except redis_errors() as exc:
            self._failed("read", exc)
            return []
        records = []
        for blob in blobs:
            try:
                record = orjson.loads(blob) if blob is not None else None
            except orjson.JSONDecodeError:
                record = None  # not ours, or damaged: never trusted
            if isinstance(record, dict) and {"policy_id", "kind", "decision", "time",
                                             "detail"} <= record.keys():
                records.append(record)
        return records

    async def aclose(self) -> None:
        await self.client.aclose()

    def _failed(self, operation: str, exc: BaseException) -> None:
        now = time.monotonic()
        if now - self._last_log >= LOG_INTERVAL_S:
            self._last_log = now
            logger.warning("shared policy alarms: redis %s failed (%s: %s); each replica acts on "
                           "its own alarms meanwhile", operation, type(exc).__name__, exc)
