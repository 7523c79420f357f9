"""What the ``slotgate`` commands share: exiting on bad input (a flag's validation error named by
its flag), output checks, progress bars, tables, report plots and reading predictions files."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from pydantic import ValidationError

if TYPE_CHECKING:
    from policies.file import PolicyFile
    from policies.scope import Question
    from router.tuning.predictions import Predictions


def fail(message: str) -> NoReturn:
    """Print to stderr and exit 2 (bad input); plain echo so long paths are never re-wrapped."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)


def fail_flag(exc: ValidationError) -> NoReturn:
    """Exit 2 on the first problem of validated options, named by its flag: the field
    ``target_accuracy`` is ``--target-accuracy``, and the message is the field's own."""
    first = exc.errors()[0]
    field = str(first["loc"][0]) if first["loc"] else ""
    message = first["msg"].removeprefix("Value error, ")
    value = first.get("input")
    shown = "" if isinstance(value, dict) else f" (got {value!r})"
    fail(f"--{field.replace('_', '-')}: {message}{shown}")


def check_policy_fields(**values: Any) -> None:
    """Check flag values against the policy file's own fields (their types and ranges, declared
    once in ``PolicyFile``), before any work; a bad one exits 2 naming its flag."""
    from pydantic import TypeAdapter

    from policies.file import PolicyFile

    for name, value in values.items():
        field = PolicyFile.model_fields[name]
        kind: Any = (Annotated[field.annotation, *field.metadata] if field.metadata
                     else field.annotation)
        try:
            TypeAdapter(kind).validate_python(value)
        except ValidationError as exc:
            message = exc.errors()[0]["msg"].removeprefix("Value error, ")
            fail(f"--{name.replace('_', '-')}: {message} (got {value!r})")


def check_out(path: Path, what: str) -> None:
    if not path.parent.is_dir():
        fail(f"{what} {path}: folder {path.parent} does not exist")


def check_folder(path: Path, what: str) -> None:
    """A folder that exists or can be made: its nearest existing ancestor is a writable folder.
    Checked before any output is written, so a bad --report leaves no policy behind."""
    ancestor = path
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        fail(f"{what} {path}: {ancestor} is not a folder")
    if not os.access(ancestor, os.W_OK):
        fail(f"{what} {path}: folder {ancestor} is not writable")


@contextmanager
def progress() -> Iterator[Callable[[str, int, int], None]]:
    """A report of long work's progress, ``report(what, done, total)`` (router.tuning's
    ``Progress``): a bar on stderr when it is a terminal; else, where a bar would draw nothing
    (a redirect, a CI log), one line per report with the seconds since the start."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    started = time.monotonic()
    if not console.is_terminal:
        yield lambda what, done, total: typer.echo(
            f"{what}: {done}/{total} ({time.monotonic() - started:.1f} s)", err=True)
        return
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=console, transient=True)
    tasks: dict[str, Any] = {}

    def report(what: str, done: int, total: int) -> None:
        if what not in tasks:
            tasks[what] = bar.add_task(what, total=total)
        bar.update(tasks[what], completed=done)

    with bar:
        yield report


def single(values: list[str | None], what: str, path: Path) -> str | None:
    """The one value all rows share (None if no row has one); mixed values exit 2
    (``router.tuning.tune.one_value``)."""
    from router.tuning.tune import TuneError, one_value

    try:
        return one_value(values, what, path)
    except TuneError as exc:
        fail(str(exc))


def load_preds(path: Path, *, labelled: bool) -> Predictions:
    """Read a predictions file, exiting 2 on bad input or (``labelled``) with no labelled row."""
    from router.tuning.predictions import PredictionsError, read_predictions

    try:
        preds = read_predictions(path)
    except PredictionsError as exc:
        fail(str(exc))
    if labelled and not preds.labelled.any():
        fail(f"{path}: field 'label': no row is labelled; this command needs labels")
    return preds


def show_table(title: str, rows: list[tuple[str, str]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in rows:
        table.add_row(name, value)
    Console(width=120).print(table)


def write_report(folder: Path, proba_before: Any, proba_after: Any, y_true: Any, *,
                 threshold: float | None, target_accuracy: float, title: str) -> None:
    """The reliability diagram and the risk-coverage plot (threshold marked) as PNGs."""
    from calibration.plots import reliability_diagram, risk_coverage_plot
    from policies.fitting import answer_confidence

    folder.mkdir(parents=True, exist_ok=True)
    answers, confidence = answer_confidence(proba_before, proba_after)
    reliability_diagram(folder / "reliability.png", proba_before, proba_after, y_true,
                        title=f"Reliability: {title}")
    risk_coverage_plot(folder / "risk_coverage.png", confidence, answers == y_true,
                       threshold=threshold, target_accuracy=target_accuracy,
                       title=f"Risk-coverage: {title}")


def fmt(value: float | None, ci: list[float] | None = None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.4f}" + (f"  [{ci[0]:.4f}, {ci[1]:.4f}]" if ci else "")


# The question a model or policy is for (``policies.scope.Question``), named the same way by
# ``train``, ``predict`` and ``tune``.
QUESTION_HELP = ("The question's id: the OpenAI json_schema name (an enum schema) or property "
                 "name (an object schema; \"choice\" for vLLM choice lists), or the System One "
                 "question id.")
QuestionId = Annotated[str | None, typer.Option("--question", help=QUESTION_HELP)]
QuestionText = Annotated[str, typer.Option(
    "--instructions",
    help="The question's text: every name, title and description on the path to the answer "
         "that does not just spell the id (an object schema's name, the schema's and the "
         "property's titles and descriptions, outermost first), or the System One question's "
         "instructions; any whitespace between words (default: none, a question asked by its "
         "id alone, as a schema with no description is).")]
QuestionContext = Annotated[str, typer.Option(
    "--context",
    help="What precedes every question of a request: the chat request's system message(s) "
         "and turns before the last user message (as 'role: text' lines), or the System One "
         "body's top-level instructions; any whitespace between words (default: none).")]
QuestionKindFlag = Annotated[str, typer.Option(
    "--question-kind", help="choice (every OpenAI question) | noul | score (System One).")]


def question_of(question: str | None, *, instructions: str = "", context: str = "",
                kind: str = "choice") -> Question | None:
    """The question the flags name (None without ``--question``: then ``--instructions``,
    ``--context`` and a non-default ``--question-kind`` are bad input); exits 2 naming the
    flag."""
    from policies.scope import Question

    if question is None:
        given = [flag for flag, value in (("--instructions", instructions),
                                          ("--context", context)) if value]
        if kind != "choice":
            given.append("--question-kind")
        if given:
            fail(f"{given[0]}: describes a question; name it with --question")
        return None
    if kind not in ("choice", "noul", "score"):
        fail(f"--question-kind: must be choice, noul or score (got {kind!r})")
    try:
        return Question.asked(question, instructions=instructions, context=context,
                              kind=kind)  # type: ignore[arg-type]  # checked above
    except ValueError as exc:
        fail(f"--question: {exc}")


def question_mismatches(path: Path, data: Predictions, tuned: PolicyFile, *, policy: str,
                        options: bool) -> list[str]:
    """How predictions ``data`` read from ``path`` differ from what the policy was tuned on: the
    question (and, with ``options``, the option names)."""
    found = []
    tuned_for = None if tuned.question is None else tuned.question.question()
    if tuned_for is not None and data.question is not None and data.question != tuned_for:
        found.append(f"{path} answers question {data.question.describe()}, the policy "
                     f"{policy} was tuned for {tuned_for.describe()}")
    if options and tuned.options is not None and tuple(tuned.options) != data.options:
        found.append(f"{path} has options {options_preview(data.options)}, the policy {policy} was "
                     f"tuned on {options_preview(tuned.options)}")
    return found


def refuse_mismatches(mismatches: list[str], *, allow: bool) -> None:
    """Exit 2 on any mismatch, unless ``--allow-mismatch``: then each is a warning."""
    if mismatches and not allow:
        fail("; ".join(mismatches) + " (pass --allow-mismatch to evaluate anyway)")
    for line in mismatches:
        typer.echo(f"warning: {line}", err=True)


def options_preview(options: Any) -> str:
    names = list(options)
    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    return f"[{shown}] ({len(names)})"
