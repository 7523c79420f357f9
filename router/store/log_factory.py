"""The app's decision log, chosen by settings: the JSONL file alone, or the Redis stream on top of
it. Its own module so that ``decision_log`` (the file) and ``redis_log`` (the stream, which
builds on the file) import one way only."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from router.store.decision_log import DecisionLog, JsonlDecisionLog
from router.store.redis_log import RedisStreamDecisionLog

if TYPE_CHECKING:
    from router.settings import Settings


def make_decision_log(settings: Settings, *,
                      on_unlogged: Callable[[str], None] | None = None) -> DecisionLog:
    """The Redis stream (plus JSONL) when a Redis URL is configured, else the JSONL file;
    ``on_unlogged(kind)`` counts each record the file could neither take nor spool."""
    jsonl = JsonlDecisionLog(settings.log.decision_log_path, max_index=settings.log.max_index,
                             max_index_bytes=settings.log.max_index_bytes,
                             spool_bytes=settings.log.spool_bytes, on_unlogged=on_unlogged)
    if settings.cache.redis_url:
        return RedisStreamDecisionLog(settings.cache.redis_url, settings.log.redis_stream,
                                      jsonl=jsonl, ttl_s=settings.cache.ttl_s)
    return jsonl
