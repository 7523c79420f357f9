"""The fast reads of a routing service: through the read cache (keyed by the tier's
fingerprint), one backend call for identical reads in flight (``SharedReads``), each call under
the tier's concurrency cap, timeout and input cut, its answers checked against the options
asked. A failed read is counted and becomes a ``FastRead`` whose ``failure`` says why; it is
never cached."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import orjson

from policies.types import DecisionRequest, OptionScores
from router.errors import BackendError, BackendMalformed, BackendTimeout
from router.routing.ports import NOT_READ, FastRead, ReadCache
from router.routing.shared_reads import SharedReads
from router.routing.tiers import FastTier
from router.store.cache import read_key
from router.store.metrics import Metrics

_T = TypeVar("_T")
_S = TypeVar("_S", bound=OptionScores | None)
# A question the server skipped, in the read cache (the cache holds reads; a skip is one).
_SKIPPED = b'{"skipped":true}'


class FastReads:
    """Reads of requests by a fast tier (default: the first), through the read cache."""

    def __init__(self, first: FastTier, *, cache: ReadCache, metrics: Metrics) -> None:
        self.first = first
        self.cache = cache
        self.metrics = metrics
        self.shared = SharedReads()  # identical fast reads at once: one backend read

    async def read(
        self, requests: Sequence[DecisionRequest], *, namespace: str, fingerprint: str,
        needed: Sequence[bool] | None = None, tier: FastTier | None = None,
    ) -> list[FastRead]:
        """The reads of ``requests`` by ``tier``, those ``needed`` (default: all) through the
        read cache and the backend; the others are ``NOT_READ``. A backend that reads jointly
        reads the whole batch when any question needs it (its answers depend on their
        co-questions)."""
        tier = tier or self.first
        if needed is not None and not all(needed) and (
                not any(needed) or not tier.backend.reads_jointly):
            return await self._read_needed(requests, needed, namespace=namespace,
                                           fingerprint=fingerprint, tier=tier)
        backend = tier.backend
        keys = [read_key(namespace, r, fingerprint, backend.read_inputs(r, requests))
                for r in requests]
        if backend.reads_jointly:  # a joint read's answers depend on each other: read all again
            return await self.read_through_cache(requests, keys, backend.read, tier=tier)
        return await self._read_each(requests, keys, tier)

    async def _read_needed(
        self, requests: Sequence[DecisionRequest], needed: Sequence[bool], *, namespace: str,
        fingerprint: str, tier: FastTier,
    ) -> list[FastRead]:
        """Only the ``needed`` requests read (each on its own); the others ``NOT_READ``."""
        reads = [NOT_READ] * len(requests)
        wanted = [i for i, need in enumerate(needed) if need]
        if not wanted:
            return reads
        fresh = await self.read([requests[i] for i in wanted], namespace=namespace,
                                fingerprint=fingerprint, tier=tier)
        for i, read in zip(wanted, fresh, strict=True):
            reads[i] = read
        return reads

    async def _read_each(self, requests: Sequence[DecisionRequest], keys: list[str],
                         tier: FastTier) -> list[FastRead]:
        """Each request from the cache, else read; a read another decision is making now (the
        same key) is waited for, not made again."""
        blobs = await self.look_up(keys)
        reads = [FastRead(decode_scores(blob, request), cached=True)
                 for blob, request in zip(blobs, requests, strict=True)]
        misses = [i for i, read in enumerate(reads) if read.scores is None]
        self.metrics.cache_lookups(store="read", hits=len(reads) - len(misses),
                                   misses=len(misses))
        if not misses:
            return reads

        async def read_backend(wanted: list[DecisionRequest]) -> list[OptionScores]:
            return await self.read_upstream(wanted, tier.backend.read, tier=tier)

        outcomes = await self.shared.read([keys[i] for i in misses],
                                          [requests[i] for i in misses], read_backend,
                                          self._store)
        counted: set[int] = set()  # one failed backend call counts once
        for i, outcome in zip(misses, outcomes, strict=True):
            if outcome.error is None:
                reads[i] = FastRead(outcome.scores, cached=outcome.shared)
                continue
            count = not outcome.shared and id(outcome.error) not in counted
            counted.add(id(outcome.error))
            reads[i] = FastRead(None, cached=False,
                                failure=self.read_failed(outcome.error, count=count))
        self.metrics.reads_shared(sum(outcome.shared for outcome in outcomes))
        return reads

    async def read_through_cache(
        self, requests: Sequence[DecisionRequest], keys: Sequence[str],
        read: Callable[[list[DecisionRequest]], Awaitable[Sequence[OptionScores | None]]],
        *, tier: FastTier | None = None,
    ) -> list[FastRead]:
        """The reads of ``requests`` that depend on each other (a joint read, a staged body read
        by its server), under ``keys``: all from the read cache, or, when any is missing, all
        read again by ``read`` (made as ``read_upstream`` makes every backend call) and stored.
        A read the server skipped (None from ``read``) is cached as a skip: no scores, no
        failure. A failed read gives every request the failure."""
        blobs = await self.look_up(keys)
        cached = [_cached_read(blob, request) for blob, request in zip(blobs, requests,
                                                                       strict=True)]
        hits = [c for c in cached if c is not None]
        self.metrics.cache_lookups(store="read", hits=len(hits), misses=len(cached) - len(hits))
        if len(hits) == len(cached):
            return hits
        try:
            fresh = await self.read_upstream(requests, read, tier=tier)
        except BackendError as exc:
            failure = self.read_failed(exc)
            return [FastRead(None, cached=False, failure=failure) for _ in requests]
        await self.cache.set_many([(key, _SKIPPED if scores is None else encode_scores(scores))
                                   for key, scores in zip(keys, fresh, strict=True)])
        return [FastRead(scores, cached=False) for scores in fresh]

    async def _store(self, reads: list[tuple[str, OptionScores]]) -> None:
        await self.cache.set_many([(key, encode_scores(scores)) for key, scores in reads])

    async def look_up(self, keys: Sequence[str]) -> list[bytes | None]:
        """The read cache's blobs for ``keys`` (None where absent), timed as the cache stage."""
        t0 = time.perf_counter()
        blobs = await self.cache.get_many(keys)
        self.metrics.stage("cache", time.perf_counter() - t0)
        return blobs

    def read_failed(self, exc: BackendError, *, count: bool = True) -> str:
        """A failed read, counted (``count``: not again for the decisions that shared it); the
        text leads the escalations' notes."""
        kind = type(exc).__name__
        if count:
            self.metrics.backend_error(kind)
        return f"fast backend failed ({kind}: {exc.message})"

    async def read_upstream(
        self, requests: Sequence[DecisionRequest],
        read: Callable[[list[DecisionRequest]], Awaitable[Sequence[_S]]],
        *, tier: FastTier | None = None,
    ) -> list[_S]:
        """``read`` (a call of ``tier``'s backend, default the first's) of ``requests`` as
        every fast read is made: states cut to its ``max_input_chars``, under the tier's
        concurrency cap and the timeout, the answers checked against the options asked (None:
        a question the backend's server skipped). Raises ``BackendError``; ``read_failed``
        counts it."""
        tier = tier or self.first
        bounded = [_bounded(r, tier.settings.max_input_chars) for r in requests]
        scores = list(await self._timed_read(lambda: read(bounded), tier))
        _check_options(scores, requests)
        return scores

    async def _timed_read(self, read: Callable[[], Awaitable[_T]], tier: FastTier) -> _T:
        """One backend call under a tier's concurrency cap and timeout; the wait queue is
        bounded (429 beyond it) and the timeout covers the read only, so queueing shows up as
        429s, not as escalations."""
        timeout_s = tier.settings.timeout_s
        async with tier.limit.acquire():
            t0 = time.perf_counter()
            try:
                async with asyncio.timeout(timeout_s):
                    return await read()
            except TimeoutError as exc:
                raise BackendTimeout(f"the fast read took longer than {timeout_s} s") from exc
            except ValueError as exc:  # a read OptionScores refused: NaN, outside [0, 1], ...
                raise BackendMalformed(f"the fast backend's read is invalid: {exc}") from exc
            finally:
                self.metrics.stage("fast", time.perf_counter() - t0)

def _check_options(scores: Sequence[OptionScores | None],
                   requests: Sequence[DecisionRequest]) -> None:
    if len(scores) != len(requests) or any(
        s is not None and s.options != r.option_names for s, r in zip(scores, requests)
    ):
        raise BackendMalformed("the fast backend answered other options than were asked")


def _bounded(request: DecisionRequest, max_chars: int) -> DecisionRequest:
    """The request as the fast tier reads it: the head of the state, at most ``max_chars``. A
    read of a 900 KB message outlives its timeout and, in a thread, keeps running after it."""
    if len(request.state) <= max_chars:
        return request
    return dataclasses.replace(request, state=request.state[:max_chars])


def encode_scores(scores: OptionScores) -> bytes:
    """A read as the read cache keeps it."""
    return orjson.dumps({"options": scores.options, "proba": scores.proba})


# A question the server skipped, in the read cache (the cache holds reads; a skip is one).
_SKIPPED = b'{"skipped":true}'


def _cached_read(blob: bytes | None, request: DecisionRequest) -> FastRead | None:
    """A cached read (a skip is one), or None when absent or unusable."""
    if blob == _SKIPPED:
        return FastRead(None, cached=True)
    scores = decode_scores(blob, request)
    return None if scores is None else FastRead(scores, cached=True)


def decode_scores(blob: bytes | None, request: DecisionRequest) -> OptionScores | None:
    """A cached read, or None when absent or unusable (then it is read again, never trusted)."""
    if blob is None:
        return None
    try:
        payload = orjson.loads(blob)
        scores = OptionScores(tuple(payload["options"]), tuple(payload["proba"]))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None
    return scores if scores.options == request.option_names else None
