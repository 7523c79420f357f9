"""``slotgate serve``: the routing proxy under uvicorn."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from router.cli.common import fail


def serve(
    config: Annotated[Path | None, typer.Option(help="slotgate YAML config (default: ./slotgate.yaml "
                                                "when present).")] = None,
    host: Annotated[str | None, typer.Option(help="Interface (default: the config's).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default: the config's).")] = None,
) -> None:
    """Run the routing proxy (OpenAI and System One routes) under uvicorn."""
    from router.errors import ConfigError
    from router.http.server import serve as run_server

    try:
        run_server(config=config, host=host, port=port)
    except ConfigError as exc:  # settings, decision log, model or policy: named in the message
        fail(exc.message)
