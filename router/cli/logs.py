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
        help="The question to export: a policy file's `signature` (scope-v1:...) or a logged "
             "decision's. Default: the log's one question; of several, the one the configured "
             "default policy answers.")] = None,
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

    from router.errors import ConfigError
    from router.http.server import default_config
    from router.settings import load_settings
    from router.tuning.log_export import export_predictions
    from router.tuning.predictions import PredictionsError

    if reference not in ("human", "slow"):
        fail(f"--reference must be human or slow, got {reference!r}")
    check_out(out, "--out")
    try:  # the same settings `serve` reads: --config, else ./slotgate.yaml, then SLOTGATE_*
        settings = load_settings(default_config(config))
    except ConfigError as exc:
        if not log and not redis_url:
            fail(exc.message)
        settings = None
    sources = log if log else [] if redis_url or settings is None else [
        settings.log.decision_log_path]
    for source in sources:
        if not source.is_file():
            fail(f"decision log {source}: file not found")
    tally: dict[str, int] = {}
    chosen: dict[str, str] = {}
    default = None if signature is not None or settings is None else default_policy(settings)
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
    if chosen.get("others"):
        typer.echo(f"exported the question {chosen['signature']}"
                   + (f" (the default policy {default[1]!r} answers it)" if default else "")
                   + f"; the log also holds (export one with --signature): {chosen['others']}")
    names = [*map(str, sources), *([f"redis stream {stream}"] if redis_url else [])]
    typer.echo(f"wrote {n} predictions from {', '.join(names)} to {out}: labels "
               f"{tally['human']} human (/v1/feedback), {tally['slow']} the slow model's, "
               f"{tally['unlabelled']} none")
    if tally["untrusted"]:
        typer.echo(f"including {tally['untrusted']} untrusted label(s) (keys without the "
                   "trusted feedback role)" if untrusted_labels else
                   f"{tally['untrusted']} untrusted label(s) left out (--untrusted-labels "
                   "includes them)")


def default_policy(settings: Settings) -> tuple[str, str] | None:
    """The signature of the question the configured default policy answers, and its name
    (``policy.default``, else the one policy file); None when there is none to read."""
    from policies.file import PolicyFileError, load_policy

    files = settings.policy.files
    for path in files:
        try:
            policy = load_policy(path)
        except PolicyFileError:
            continue  # export reads the log; a missing or bad policy file only loses the default
        if policy.signature is not None and settings.policy.default in (policy.name, None) and (
                settings.policy.default is not None or len(files) == 1):
            return policy.signature, policy.name
    return None
