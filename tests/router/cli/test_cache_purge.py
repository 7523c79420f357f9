"""``slotgate cache purge`` against a real Redis: the reads one tier left in the shared read
cache go (by fingerprint, or by the policy that names the tier), every other tier's stay."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from typer.testing import CliRunner

from policies.types import DecisionRequest, Option
from router.cli.app import app
from router.store.cache import RedisCache, read_key


def request(state: str) -> DecisionRequest:
    return DecisionRequest("q", "which?", (Option("a"), Option("b")), state)


def fill(redis_url: str, namespace: str) -> dict[str, list[str]]:
    keys = {fp: [read_key(namespace, request(f"message {i}"), fp) for i in range(30)]
            for fp in ("fp-broken", "fp-fine")}

    async def store() -> None:
        cache = RedisCache(redis_url, ttl_s=60)
        await cache.set_many([(key, b"{}") for group in keys.values() for key in group])
        await cache.client.aclose()

    asyncio.run(store())
    return keys


def present(redis_url: str, keys: list[str]) -> int:
    async def count() -> int:
        cache = RedisCache(redis_url, ttl_s=60)
        found = await cache.get_many(keys)
        await cache.client.aclose()
        return sum(v is not None for v in found)

    return asyncio.run(count())


def test_purge_by_fingerprint_removes_that_tiers_reads_only(
        redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SLOTGATE_CACHE__REDIS_URL", redis_url)
    keys = fill(redis_url, "purge-test")
    result = CliRunner().invoke(app, ["cache", "purge", "--fingerprint", "fp-broken"])
    assert result.exit_code == 0, result.output
    assert "purged 30 cached reads of fingerprint fp-broken" in result.output
    assert present(redis_url, keys["fp-broken"]) == 0
    assert present(redis_url, keys["fp-fine"]) == 30


def test_purge_names_exactly_one_target_and_needs_redis(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SLOTGATE_CACHE__REDIS_URL", raising=False)
    both = CliRunner().invoke(app, ["cache", "purge", "--fingerprint", "a", "--tier", "b"])
    assert both.exit_code == 2 and "name exactly one" in both.output
    none = CliRunner().invoke(app, ["cache", "purge", "--fingerprint", "a"])
    assert none.exit_code == 2 and "cache.redis_url" in none.output
