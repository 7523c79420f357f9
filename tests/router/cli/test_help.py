"""What `--help` shows a person: every value named by a plain metavar (no Python types such as
`<list[Path]>` or `<int range>`), arguments named in the usage line, and flag texts that say
what the values look like today."""

from __future__ import annotations

import re

import pytest
import typer.main
from typer.testing import CliRunner

from policies.scope import SCOPE_PREFIX, UNRECORDED_PREFIX
from router.cli.app import app
from router.cli.help import plain_metavar


def commands() -> list[list[str]]:
    root = typer.main.get_command(app)
    found = []
    for name, command in root.commands.items():  # type: ignore[attr-defined]
        subcommands = getattr(command, "commands", None)
        found += [[name, sub] for sub in subcommands] if subcommands else [[name]]
    return found


def help_of(*command: str) -> str:
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    return result.stdout


def test_every_command_is_checked() -> None:
    assert {"train", "predict", "tune", "eval", "compare", "export-log", "monitor",
            "serve"} <= {c[0] for c in commands()}
    assert ["alarms", "list"] in commands() and ["alarms", "clear"] in commands()


@pytest.mark.parametrize("command", commands(), ids=" ".join)
def test_help_names_values_by_plain_metavars(command: list[str]) -> None:
    shown = help_of(*command)
    metavars = re.findall(r"^\s+--[\w-]+ (<[^>]*>)", shown, flags=re.MULTILINE)
    assert all(re.fullmatch(r"<[a-z=]+>", m) for m in metavars), metavars
    assert "list[" not in shown and " range>" not in shown and "{" not in shown


def test_plain_metavar() -> None:
    assert plain_metavar("<list[Path]>") == "<path>"
    assert plain_metavar("<list[str]>") == "<str>"
    assert plain_metavar("<int range>") == "<int>"
    assert plain_metavar("<float range>") == "<float>"
    assert plain_metavar("<path>") == "<path>"


def test_compare_names_its_two_files_in_the_usage_line() -> None:
    shown = help_of("compare")
    assert re.search(r"compare \[OPTIONS\] A B$", shown, flags=re.MULTILINE), shown
    assert re.search(r"^  A <path> +Predictions JSONL of model A", shown, flags=re.MULTILINE)


def test_export_log_says_what_a_signature_looks_like() -> None:
    shown = " ".join(help_of("export-log").split())
    assert f"({SCOPE_PREFIX} and 64 hex digits)" in shown
    assert UNRECORDED_PREFIX not in shown
