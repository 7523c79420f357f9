"""The ``slotgate`` commands that read the proxy's own settings (``--config``, else
./slotgate.yaml when present, then ``SLOTGATE_*``): ``serve`` and ``export-log``. Registered
on the one Typer app in router/tuning/cli.py; bad settings exit 2 with one message."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def export_log(
    out: Annotated[Path, typer.Option(help="Predictions JSONL to write (input of `slotgate tune`).")],
    config: Annotated[Path | None, typer.Option(help="slotgate YAML config naming the log "
                                                "(default: ./slotgate.yaml when present).")] = None,
    log: Annotated[list[Path] | None, typer.Option(
        help="Decision log JSONL (default: the config's). Repeat it to join the logs of several "
             "replicas: feedback sent to one replica for a decision made on another is in the "
             "other's log.")] = None,
    signature: Annotated[str | None, typer.Option(help="The question to export, when the log "
                                                  "holds several.")] = None,
    labelled_only: Annotated[bool, typer.Option(help="Only decisions with feedback.")] = False,
) -> None:
    """Join the decision log with its feedback labels into a predictions file."""
    from router.errors import ConfigError
    from router.http.server import default_config
    from router.settings import load_settings
    from router.store.decision_log import export_predictions
    from router.tuning.cli import check_out, fail
    from router.tuning.predictions import PredictionsError

    check_out(out, "--out")
    try:  # the same settings `serve` reads: --config, else ./slotgate.yaml, then SLOTGATE_*
        sources = log if log else [load_settings(default_config(config)).log.decision_log_path]
    except ConfigError as exc:
        fail(exc.message)
    for source in sources:
        if not source.is_file():
            fail(f"decision log {source}: file not found")
    try:
        n = export_predictions(sources, out, signature=signature, labelled_only=labelled_only)
    except PredictionsError as exc:
        fail(exc.message)
    typer.echo(f"wrote {n} predictions from {', '.join(map(str, sources))} to {out}")


def serve(
    config: Annotated[Path | None, typer.Option(help="slotgate YAML config (default: ./slotgate.yaml "
                                                "when present).")] = None,
    host: Annotated[str | None, typer.Option(help="Interface (default: the config's).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default: the config's).")] = None,
) -> None:
    """Run the routing proxy (OpenAI and System One routes) under uvicorn."""
    from router.errors import ConfigError
    from router.http.server import serve as run_server
    from router.tuning.cli import fail

    try:
        run_server(config=config, host=host, port=port)
    except ConfigError as exc:  # settings, decision log, model or policy: named in the message
        fail(exc.message)
