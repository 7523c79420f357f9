"""Runs the app under uvicorn: ``slotgate serve [--config slotgate.yaml] [--host] [--port]``.
uvloop and httptools are used when installed (uvicorn[standard]); settings are read once here."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
from pathlib import Path

from router.errors import ConfigError
from router.settings import Settings, load_settings

log = logging.getLogger("slotgate")
DEFAULT_CONFIG = Path("slotgate.yaml")  # the repo's own config, read from the working directory


def default_config(config: Path | None) -> Path | None:
    """``config``, else ./slotgate.yaml when present: every command reads the same settings."""
    if config is None and DEFAULT_CONFIG.is_file():
        return DEFAULT_CONFIG
    return config


def serve(*, config: Path | None = None, host: str | None = None, port: int | None = None) -> None:
    """Load settings (YAML, then SLOTGATE_* environment; ``host``/``port`` win) and serve until
    SIGINT/SIGTERM, which drains in-flight requests and flushes the decision log.

    Everything a decision needs is checked before uvicorn starts (router/http/startup.py): the
    settings, the decision log path, the fast model and the policy files. A problem raises
    ConfigError naming the setting or file (the CLI prints it and exits 2)."""
    import uvicorn

    from router import parse_lock
    from router.backends.factory import build_backend, learn_upstreams
    from router.http.app import create_app
    from router.http.startup import check_decision_log
    from router.monitoring.checkpoint import check_unclaimed
    from router.routing.registry import PolicyRegistry

    # First: from here on several threads may format tracebacks or compile Triton kernels at
    # once, and CPython 3.11's AST construction is not safe across threads (router/parse_lock.py).
    parse_lock.install()
    overrides = {k: v for k, v in {"host": host, "port": port}.items() if v is not None}
    chosen = default_config(config)
    try:
        settings = load_settings(chosen, **overrides)
        check_decision_log(settings.log.decision_log_path)
        check_unclaimed(settings.log.decision_log_path)  # one replica per checkpoint
        backend = build_backend(settings.fast)
        tiers = {tier.name: build_backend(tier) for tier in settings.tiers}
        asyncio.run(learn_upstreams([("fast.url", backend)] + [
            (f"tiers.{name}.url", later) for name, later in tiers.items()], strict=False))
        PolicyRegistry.load(
            settings.policy, backend_fingerprint=backend.fingerprint,
            tiers=[(settings.fast.name, backend.fingerprint)]
            + [(name, later.fingerprint) for name, later in tiers.items()])
    except ConfigError as exc:
        if chosen is None:  # the defaults alone serve nothing: say where a config was looked for
            exc.message = (f"no slotgate.yaml found in {Path.cwd()} and no --config given "
                           f"(the settings are the defaults and SLOTGATE_* variables): {exc.message}")
        raise
    configure_logging()
    log.info("fast backend %s%s, slow model %s, cache %s, policies %s",
             settings.fast.kind, "".join(f", then tier {t.name} ({t.kind})" for t in settings.tiers),
             settings.slow.model or "NONE (escalation unavailable)",
             "redis" if settings.cache.redis_url else "in-process",
             [str(p) for p in settings.policy.files] or "none (fallback threshold only)")
    uvicorn.run(
        create_app(settings, backend=backend, tiers=tiers, close_backend=True),
        host=settings.host,
        port=settings.port,
        loop="uvloop" if _installed("uvloop") else "asyncio",
        http=http_protocol(settings),
        log_level="info",
        # Off by default: a line per request (and the secret-redaction filter litellm hangs on
        # uvicorn's loggers) cost 5-9% of the server's CPU, and the decision log and /metrics
        # already record every request.
        access_log=settings.access_log,
        timeout_graceful_shutdown=30,
        # uvicorn's own default (5 s) equals httpx's pool expiry: the two close and reuse one
        # connection at the same moment, and the client's request meets a closed socket.
        timeout_keep_alive=settings.keep_alive_s,
    )


def configure_logging() -> None:
    """INFO lines from slotgate and uvicorn on stderr. watchfiles, which watches the policy
    files' folders for live reload, logs every change it sees at INFO: the decision log beside
    the policy file changes on every request, so it is kept to warnings."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("watchfiles").setLevel(logging.WARNING)


def http_protocol(settings: Settings) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (httptools when installed, else h11) with the connection cap
    (router/http/connections.py): ``max_connections``, else the open-file limit less a reserve."""
    from router.http.connections import capped_protocol, default_max_connections

    base: type[asyncio.Protocol]
    if _installed("httptools"):
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        base = HttpToolsProtocol
    else:
        from uvicorn.protocols.http.h11_impl import H11Protocol

        base = H11Protocol
    return capped_protocol(base, settings.max_connections or default_max_connections())


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None
