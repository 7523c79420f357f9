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


@pytest.mark.parametrize("variable, meant", [
    ("SLOTGATE_PROT", "SLOTGATE_PORT"), ("SLOTGATE_SLOWMODEL", "SLOTGATE_SLOW_MODEL"),
    ("SLOTGATE_POLICY_FILES", "SLOTGATE_POLICY__FILES"),
    ("slotgate_cahce__redis_url", "SLOTGATE_CACHE__REDIS_URL"),
])
def test_a_misspelt_top_level_variable_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, variable: str, meant: str
) -> None:
    monkeypatch.setenv(variable, "1")
    with pytest.raises(ConfigError) as refused:
        load_settings()
    assert f"environment variable {variable}: no setting is named so" in str(refused.value)
    assert f"did you mean {meant}?" in str(refused.value)


def test_variables_that_name_no_setting_on_purpose_are_let_through(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for variable in ("SLOTGATE_DATA_DIR", "SLOTGATE_TOKENIZER_DIR", "SLOTGATE_BENCH_RESULTS",
                     "SLOTGATE_TEST_CACHE"):
        monkeypatch.setenv(variable, str(tmp_path))
    monkeypatch.setenv("SLOTGATE_PORT", "9000")
    monkeypatch.setenv("SLOTGATE_SLOW_MODEL", "m")
    settings = load_settings()
    assert settings.port == 9000 and settings.slow.model == "m"


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
