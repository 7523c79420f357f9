"""Settings refuse what they would ignore: an unknown key inside a section, from the YAML file or
a SLOTGATE_* variable, is refused naming the key, as one at the top level is; and `slotgate
serve` with no config at hand says that no slotgate.yaml was found."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from router.cli.app import app
from router.errors import ConfigError
from router.settings import load_settings


@pytest.mark.parametrize("section, key", [
    ("slow", "timout_s"), ("fast", "timeout"), ("policy", "unscope"), ("cache", "redis"),
    ("log", "path"), ("monitoring", "enable"),
])
def test_a_typo_inside_a_section_is_refused_naming_the_key(
    tmp_path: Path, section: str, key: str
) -> None:
    config = tmp_path / "slotgate.yaml"
    config.write_text(f"{section}:\n  {key}: 1\n")
    with pytest.raises(ConfigError) as refused:
        load_settings(config)
    assert f"--config {config}: {section}.{key}: Extra inputs are not permitted" in str(
        refused.value)


def test_a_typo_inside_a_section_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLOTGATE_SLOW__TIMOUT_S", "3")
    with pytest.raises(ConfigError) as refused:
        load_settings()
    assert "slow.timout_s" in str(refused.value)


def test_serve_outside_the_checkout_says_no_config_was_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["serve"])
    assert result.exit_code == 2, result.output
    assert f"no slotgate.yaml found in {tmp_path}" in result.stderr


def test_version() -> None:
    from importlib.metadata import version

    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout == f"slotgate {version('slotgate')}\n"


def test_help_at_80_columns_keeps_every_flag_name_whole() -> None:
    result = CliRunner().invoke(app, ["tune", "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0
    assert "--calibration-fraction" in result.stdout and "…" not in result.stdout
