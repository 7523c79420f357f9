"""The torch backend from configuration and from ``slotgate predict --torch-kind`` (tiny BERT)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from typer.testing import CliRunner

from router.backends.factory import build_backend
from router.cli.app import app
from router.errors import ConfigError
from router.settings import FastBackendSettings
from tests.router.backends.torch_models import tiny_bert_folder


def test_factory_builds_the_torch_backend_from_settings() -> None:
    settings = FastBackendSettings(kind="torch", model_path=tiny_bert_folder(),
                                   options={"kind": "masked", "label_mode": "alphabet"})
    backend = build_backend(settings)
    assert backend.name == "torch" and backend.identity()["kind"] == "masked"
    with pytest.raises(ValueError, match="torch backend: kind: Field required"):
        FastBackendSettings(kind="torch", model_path=tiny_bert_folder())  # found at load
    with pytest.raises(ConfigError, match="does not exist"):
        build_backend(FastBackendSettings(kind="torch", model_path=Path("/nonexistent/model"),
                                          options={"kind": "causal"}))


def test_predict_with_torch_kind_reads_the_datas_labels(tmp_path: Path) -> None:
    data = tmp_path / "rows.csv"
    rows = [("my card has not arrived", "card_arrival"), ("I want a refund", "refund"),
            ("what is the exchange rate", "exchange_rate"), ("card still not here", "card_arrival")]
    with data.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "category"])
        writer.writerows(rows)
    out = tmp_path / "preds.jsonl"
    result = CliRunner().invoke(app, [
        "predict", "--model", str(tiny_bert_folder()), "--torch-kind", "masked",
        "--data", str(data), "--label-column", "category", "--out", str(out), "--limit", "3",
    ])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 3
    for line in lines:
        assert line["options"] == ["card_arrival", "exchange_rate", "refund"]
        assert abs(sum(line["proba"]) - 1) < 1e-6 and line["label"] in line["options"]
    assert "wrote 3 predictions over 3 options" in result.output
