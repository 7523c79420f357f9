"""``slotgate compare``: two prediction files of the same rows, scored against their labels."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from router.cli.common import fail, load_preds, show_table


def compare(
    a: Annotated[Path, typer.Argument(metavar="A", help="Predictions JSONL of model A.")],
    b: Annotated[Path, typer.Argument(metavar="B", help="Predictions JSONL of model B.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Compare two prediction files row by row: discordant pairs, exact McNemar p."""
    from router.tuning.pairing import compare_predictions
    from router.tuning.predictions import PredictionsError

    first, second = load_preds(a, labelled=True), load_preds(b, labelled=True)
    try:
        summary = compare_predictions(first, second)
    except PredictionsError as exc:
        fail(str(exc))
    if as_json:
        typer.echo(json.dumps(summary))
        return
    show_table(f"{a.name} (A) vs {b.name} (B)", [
        ("paired rows", str(summary["n"])),
        ("accuracy A / B", f"{summary['accuracy_a']:.4f} / {summary['accuracy_b']:.4f}"),
        ("same answer", f"{summary['answers_agree']:.4f}"),
        ("both right or both wrong", f"{summary['agreement']:.4f}"),
        ("discordant: only A right / only B right", f"{summary['a_only']} / {summary['b_only']}"),
        ("exact McNemar p", f"{summary['p_value']:.4g}"),
        ("unpaired rows A / B", f"{summary['unpaired_a']} / {summary['unpaired_b']}"),
    ])
