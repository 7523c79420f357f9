"""Text models saved by earlier slotgate versions still load: joblib names our classes by module
path, so every path in ``PICKLED_CLASS_PATHS`` must stay importable, and a file whose pipeline
names the old ``router.backends.embedding.EmbeddingEncoder`` loads as today's encoder."""

from __future__ import annotations

import importlib
from pathlib import Path

import joblib
import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline

from router.backends.encoders import EmbeddingEncoder
from router.backends.sklearn import (
    MODEL_FORMAT,
    MODEL_VERSION,
    PICKLED_CLASS_PATHS,
    load_text_model,
)


@pytest.mark.parametrize("path", PICKLED_CLASS_PATHS)
def test_every_pickled_class_path_resolves_to_the_current_class(path: str) -> None:
    module, _, name = path.rpartition(".")
    assert getattr(importlib.import_module(module), name) is EmbeddingEncoder


def test_a_model_saved_under_the_old_module_path_loads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A fitted pipeline whose encoder step is stored under its old class path. The classifier is
    # fitted on vectors directly, so no encoder weights are needed to build the file.
    rng = np.random.default_rng(0)
    classifier = LogisticRegression().fit(rng.normal(size=(20, 4)), ["a", "b"] * 10)
    pipeline = Pipeline([("embed", EmbeddingEncoder("wordllama")), ("classifier", classifier)])
    payload = {"format": MODEL_FORMAT, "version": MODEL_VERSION, "kind": "wordllama",
               "labels": ["a", "b"], "pipeline": pipeline, "n_train": 20, "data_hash": "x",
               "created_at": "2026-01-01T00:00:00+00:00"}
    path = tmp_path / "old.joblib"
    with monkeypatch.context() as patch:  # pickle writes the class's module as it was then
        patch.setattr(EmbeddingEncoder, "__module__", "router.backends.embedding")
        joblib.dump(payload, path)
    saved = path.read_bytes()  # joblib: a pickle stream with numpy buffers inline
    assert b"router.backends.embedding" in saved and b"router.backends.encoders" not in saved

    model = load_text_model(path)
    step = model.pipeline.named_steps["embed"]
    assert type(step) is EmbeddingEncoder and step.kind == "wordllama"
    assert model.labels == ("a", "b") and model.kind == "wordllama"
