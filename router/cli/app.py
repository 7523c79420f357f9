"""The ``slotgate`` command line, assembled: one module per command group in ``router/cli/``
(models: train, predict; compare; policy: tune, eval; logs: export-log; monitor; migrate; serve;
alarms: list, clear; cache: purge), each
importing its heavy dependencies inside the command so that ``slotgate --help`` starts fast.

Bad input exits with code 2 and a message naming the file, row and field, having written nothing:
every input is read and checked before the first output is written. The cross-fitted run (every
labelled row both trains and tunes)::

    slotgate train --data train.csv --label-column category --out m.joblib \\
        --cv 5 --oof-out oof.jsonl
    slotgate tune --preds oof.jsonl --model m.joblib --target-accuracy 0.95 --out policy.json
    slotgate predict --model m.joblib --data test.csv --label-column category --out test.jsonl
    slotgate eval --preds test.jsonl --policy policy.json --json

or the split one: ``train --holdout 0.3 --holdout-out tune.csv``, ``predict`` on tune.csv, and
``tune --preds tune.jsonl`` (half the held-out rows calibrate, half choose the threshold).
"""

from __future__ import annotations

from typing import Annotated

import typer

from router.cli.alarms import app as alarms_app
from router.cli.cache import app as cache_app
from router.cli.compare import compare
from router.cli.help import PlainHelp
from router.cli.logs import export_log
from router.cli.migrate import migrate
from router.cli.models import predict, train
from router.cli.monitor import monitor
from router.cli.policy import evaluate, tune
from router.cli.serve import serve

# Plain click help (rich_markup_mode=None): rich's panels cut long flag names at 80 columns
# ("--allow-novel-l…"); click wraps the descriptions and keeps every name whole.
app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None,
                  help="slotgate: confidence routing for LLM decision calls.")


def _version(shown: bool) -> None:
    if shown:
        from importlib.metadata import version

        typer.echo(f"slotgate {version('slotgate')}")
        raise typer.Exit


@app.callback()
def _main(
    version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="Print the version and exit.")] = False,
) -> None:
    """slotgate: confidence routing for LLM decision calls."""
app.command(cls=PlainHelp)(train)
app.command(cls=PlainHelp)(predict)
app.command(cls=PlainHelp)(tune)
app.command(name="eval", cls=PlainHelp)(evaluate)
app.command(cls=PlainHelp)(compare)
app.command(name="export-log", cls=PlainHelp)(export_log)
app.command(cls=PlainHelp)(serve)
app.command(cls=PlainHelp)(monitor)
app.command(cls=PlainHelp)(migrate)
app.add_typer(alarms_app, name="alarms")  # a command group of its own: list, clear
app.add_typer(cache_app, name="cache")  # purge
