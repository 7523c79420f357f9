"""``slotgate export-log``: the decision log (files and/or the replicas' Redis stream) joined
with its labels, as a predictions file ``slotgate tune`` reads."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from router.cli.common import check_out, fail

if TYPE_CHECKING:
    from router.settings import Settings


def export_log(
    out: Annotated[Path, typer.Option(help="Predictions JSONL to write (input of `slotgate tune`).")],
    config: Annotated[Path | None, typer.Option(help="slotgate YAML config naming the log "
                                                "(default: ./slotgate.yaml when present).")] = None,
    log: Annotated[list[Path] | None, typer.Option(
        help="Decision log JSONL (default: the config's). Repeat it to join the logs of several "
             "replicas: feedback sent to one replica for a decision made on another is in the "
             "other's log.")] = None,
    signature: Annotated[str | None, typer.Option(
        help="The question to export: a policy file's `signature` (scope-v2: and 64 hex "
             "digits) or a logged decision's (64 hex digits). Default: the log's one question; "
             "of several, the one the configured default policy answers.")] = None,
    labelled_only: Annotated[bool, typer.Option(help="Only decisions with feedback.")] = False,
    audit_labels: Annotated[bool, typer.Option(help="Label decisions without feedback by their "
                                               "audit (the slow model's answer); a human label "
                                               "wins.")] = False,
    untrusted_labels: Annotated[bool, typer.Option(
        help="Also export the labels of API keys without the `trusted` feedback role "
             "(feedback.roles); by default only trusted keys' labels re-tune a policy.")]
        = False,
    reference: Annotated[str, typer.Option(help="human: labels are /v1/feedback only; slow: "
                                           "where none, the slow model's answer (shadow mode, "
                                           "audits, escalations); `tune` on it promises "
                                           "agreement with the slow model.")] = "human",
    redis_url: Annotated[str | None, typer.Option(
        help="Also read the Redis stream every replica writes its records to (alone, without "
             "--log, only the stream is read).")] = None,
    stream: Annotated[str, typer.Option(help="The stream's name (log.redis_stream).")]
        = "slotgate:v1:log",
) -> None:
    """Join the decision log with its feedback labels into a predictions file."""
    from redis.exceptions import RedisError

    from router.tuning.log_export import default_policy, export_predictions
    from router.tuning.predictions import PredictionsError

    if reference not in ("human", "slow"):
        fail(f"--reference must be human or slow, got {reference!r}")
    check_out(out, "--out")
    settings = _settings(config, needed=not log and not redis_url)
    sources = _sources(log, settings, redis=redis_url is not None)
    default = None if signature is not None or settings is None else default_policy(settings)
    tally: dict[str, int] = {}
    chosen: dict[str, str] = {}
    try:
        n = export_predictions(sources, out, signature=signature,
                               default=default[0] if default else None,
                               labelled_only=labelled_only, audit_labels=audit_labels,
                               untrusted_labels=untrusted_labels,
                               redis_stream=(redis_url, stream) if redis_url else None,
                               reference_slow=reference == "slow", tally=tally, chosen=chosen)
    except PredictionsError as exc:
        fail(exc.message)
    except (RedisError, OSError) as exc:
        fail(f"--redis-url: cannot read stream {stream!r}: {exc}")
    names = [*map(str, sources), *([f"redis stream {stream}"] if redis_url else [])]
    _print_summary(n, names, out, tally=tally, chosen=chosen,
                   default_name=default[1] if default else None,
                   untrusted_labels=untrusted_labels)


def _settings(config: Path | None, *, needed: bool) -> Settings | None:
    """The settings `serve` reads (--config, else ./slotgate.yaml, then SLOTGATE_*); a problem
    with them exits 2 when they are ``needed`` (no --log, no --redis-url), else they are None."""
    from router.errors import ConfigError
    from router.http.server import default_config
    from router.settings import load_settings

    try:
        return load_settings(default_config(config))
    except ConfigError as exc:
        if needed:
            fail(exc.message)
        return None


def _sources(log: list[Path] | None, settings: Settings | None, *, redis: bool) -> list[Path]:
    """The decision logs to read: --log, else (with no --redis-url) the configured one; each
    must be a file."""
    sources = log if log else [] if redis or settings is None else [
        settings.log.decision_log_path]
    for source in sources:
        if not source.is_file():
            fail(f"decision log {source}: file not found")
    return sources


def _print_summary(n: int, names: list[str], out: Path, *, tally: dict[str, int],
                   chosen: dict[str, str], default_name: str | None,
                   untrusted_labels: bool) -> None:
    """What was exported: the question (when the log holds others), the rows and their labels'
    sources, and the untrusted labels joined or left out."""
    if chosen.get("others"):
        typer.echo(f"exported the question {chosen['signature']}"
                   + (f" (the default policy {default_name!r} answers it)" if default_name
                      else "")
                   + f"; the log also holds (export one with --signature): {chosen['others']}")
    typer.echo(f"wrote {n} predictions from {', '.join(names)} to {out}: labels "
               f"{tally['human']} human (/v1/feedback), {tally['slow']} the slow model's, "
               f"{tally['unlabelled']} none")
    if tally["untrusted"]:
        typer.echo(f"including {tally['untrusted']} untrusted label(s) (keys without the "
                   "trusted feedback role)" if untrusted_labels else
                   f"{tally['untrusted']} untrusted label(s) left out (--untrusted-labels "
                   "includes them)")
