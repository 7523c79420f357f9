"""bench.masked_slot: each option's new token starts at its name's wordpiece mean, and a tiny run
trains, saves a folder that TorchBackend loads, and reads decisions with the names in the slot."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from bench import masked_slot
from policies.types import DecisionRequest, Option
from router.backends.torch.backend import TorchBackend
from router.backends.torch.serve.build import load_model


def test_option_tokens_start_at_the_mean_of_their_names_wordpieces() -> None:
    model, tokenizer, _ = load_model("masked", masked_slot.base_folder())
    before = model.get_input_embeddings().weight.detach().clone()
    names = ["card_arrival", "Refund_not_showing_up"]
    ids = masked_slot.add_option_tokens(model, tokenizer, names)
    for name, token in zip(names, ids, strict=True):
        assert tokenizer.encode(f"  {name}\n", add_special_tokens=False) == [token]
        pieces = tokenizer.encode(name.replace("_", " "), add_special_tokens=False)
        assert len(pieces) > 1
        torch.testing.assert_close(model.get_input_embeddings().weight[token],
                                   before[pieces].mean(dim=0))
        torch.testing.assert_close(model.get_output_embeddings().weight[token],
                                   before[pieces].mean(dim=0))


def test_a_tiny_run_trains_saves_and_reads_a_decision_through_the_torch_backend(
        small_banking77: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from router.cli.app import app

    folder = tmp_path / "model"
    result = masked_slot.main(["--model-out", str(folder), "--data-dir", str(small_banking77),
                               "--rows", "16", "--epochs", "1", "--out", str(tmp_path / "r.json")])
    assert result["train_rows"] == 16 and math.isfinite(result["epoch_loss"][0])
    base, _, _ = load_model("masked", masked_slot.base_folder())
    trained, _, _ = load_model("masked", folder)
    assert not torch.equal(base.base_model.encoder.layer[0].output.dense.weight,
                           trained.base_model.encoder.layer[0].output.dense.weight)

    names = sorted(json.loads((small_banking77 / "categories.json").read_text()))
    backend = TorchBackend.from_folder("masked", folder)
    request = DecisionRequest(masked_slot.QUESTION, masked_slot.INSTRUCTIONS,
                              tuple(Option(name) for name in names), "My card has not arrived yet")
    try:
        assert backend.labels_for(request)[0] == tuple(names)  # the names are the slot's tokens
        [scores] = asyncio.run(backend.read([request]))
    finally:
        asyncio.run(backend.aclose())
    assert scores.options == tuple(names) and abs(sum(scores.proba) - 1) < 1e-9

    out = tmp_path / "test.jsonl"  # the documented read of a labelled file
    run = CliRunner().invoke(app, ["predict", "--torch-kind", "masked", "--model", str(folder),
                                   "--data", str(small_banking77 / "test.csv"),
                                   "--label-column", "category", "--out", str(out),
                                   "--limit", "4"])
    assert run.exit_code == 0, run.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 4 and all(row["options"] == names for row in rows)
