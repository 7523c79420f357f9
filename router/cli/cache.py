"""``slotgate cache purge``: remove from the shared read cache (Redis) every read a fast tier
made, after the tier was broken and fixed without changing its fingerprint. Named by a policy
(each of its tiers' fingerprints, from its file), by a configured tier (its backend built to
learn its fingerprint) or by a fingerprint as logs and policy files show it. The in-process
cache lives in each server process and goes with it: restart the server instead."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from router.cli.common import fail
from router.cli.help import PlainHelp

app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None,
                  help="The shared read cache: purge what a tier read (docs/reliability.md).")


@app.command(cls=PlainHelp)
def purge(
    policy: Annotated[str | None, typer.Option(
        help="A policy file, or a configured policy's id or name: every tier it reads.")] = None,
    tier: Annotated[str | None, typer.Option(
        help="A configured tier's name (tiers[].name): its backend is built to learn its "
             "fingerprint.")] = None,
    fingerprint: Annotated[str | None, typer.Option(
        help="A tier's backend fingerprint, as policy files and decision logs record it.")] = None,
    config: Annotated[Path | None, typer.Option(
        help="The settings file (default ./slotgate.yaml): where cache.redis_url is.")] = None,
) -> None:
    """Purge a tier's reads from the Redis read cache, on every replica at once."""
    from router.settings import load_settings
    from router.store.cache import RedisCache, read_pattern

    if sum(v is not None for v in (policy, tier, fingerprint)) != 1:
        fail("--policy, --tier, --fingerprint: name exactly one")
    settings = load_settings(config if config is not None else _default_config())
    if settings.cache.redis_url is None:
        fail("cache.redis_url: no Redis is configured; the in-process read cache lives in each "
             "server process and goes when it restarts")
    prints = _fingerprints(policy=policy, tier=tier, fingerprint=fingerprint, config=config)
    cache = RedisCache(settings.cache.redis_url, ttl_s=settings.cache.ttl_s, timeout_s=5.0)

    async def run() -> list[int]:
        try:
            return [await cache.purge(read_pattern(fp)) for fp in prints]
        finally:
            await cache.client.aclose()

    from router.store.redis_client import redis_errors

    try:
        removed = asyncio.run(run())
    except redis_errors() as exc:  # a Redis that does not answer: one line, exit 2
        fail(f"cache.redis_url: Redis did not answer ({type(exc).__name__}: {exc})")
    for fp, n in zip(prints, removed, strict=True):
        typer.echo(f"purged {n} cached reads of fingerprint {fp}")


def _fingerprints(*, policy: str | None, tier: str | None, fingerprint: str | None,
                  config: Path | None) -> list[str]:
    if fingerprint is not None:
        return [fingerprint]
    if policy is not None:
        from router.cli.policy_ref import read_policy

        _, file = read_policy(policy)
        if file.cascade is None:
            return [file.backend_fingerprint]
        return [t.backend_fingerprint for t in file.cascade.tiers]
    from router.backends.factory import build_backend, learn_upstreams
    from router.settings import load_settings

    settings = load_settings(config if config is not None else _default_config())
    named = [t for t in settings.all_tiers if t.name == tier]
    if not named:
        fail(f"--tier: no configured tier is named {tier!r} (configured: "
             + ", ".join(t.name for t in settings.all_tiers) + ")")
    backend = build_backend(named[0])
    asyncio.run(learn_upstreams([("--tier", backend)]))
    return [backend.fingerprint]


def _default_config() -> Path | None:
    path = Path("slotgate.yaml")
    return path if path.is_file() else None
