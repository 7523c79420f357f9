"""Runs the app under uvicorn: ``slotgate serve [--config slotgate.yaml] [--host] [--port]``.
uvloop and httptools are used when installed (uvicorn[standard]); settings are read once here."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from router.settings import load_settings

log = logging.getLogger("slotgate")
DEFAULT_CONFIG = Path("slotgate.yaml")  # the repo's own config, read from the working directory


def serve(*, config: Path | None = None, host: str | None = None, port: int | None = None) -> None:
    """Load settings (YAML, then SLOTGATE_* environment; ``host``/``port`` win) and serve until
    SIGINT/SIGTERM, which drains in-flight requests and flushes the decision log."""
    import uvicorn

    from router.http.app import create_app

    if config is None and DEFAULT_CONFIG.is_file():
        config = DEFAULT_CONFIG
    overrides = {k: v for k, v in {"host": host, "port": port}.items() if v is not None}
    settings = load_settings(config, **overrides)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log.info("fast backend %s, slow model %s, cache %s, policies %s",
             settings.fast.kind, settings.slow.model or "NONE (escalation unavailable)",
             "redis" if settings.cache.redis_url else "in-process",
             [str(p) for p in settings.policy.files] or "none (fallback threshold only)")
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        loop="uvloop" if _installed("uvloop") else "asyncio",
        http="httptools" if _installed("httptools") else "h11",
        log_level="info",
        # Off by default: a line per request (and the secret-redaction filter litellm hangs on
        # uvicorn's loggers) cost 5-9% of the server's CPU, and the decision log and /metrics
        # already record every request.
        access_log=settings.access_log,
        timeout_graceful_shutdown=30,
    )


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None
