"""The sklearn backend's fingerprint is what the model computes: models fit alike (same data,
same seed) share it across processes whose pickles differ; another fit does not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from router.backends.model_digest import fitted_digest
from router.backends.sklearn import SklearnBackend, load_text_model, train_text_model
from router.errors import ConfigError
from tests.router.backends.test_sklearn import toy_data

TRAIN = """
import sys
from router.backends.sklearn import save_text_model, train_text_model
from tests.router.backends.test_sklearn import toy_data
texts, labels = toy_data()
save_text_model(__import__("pathlib").Path(sys.argv[1]), train_text_model(texts, labels,
                kind="tfidf", seed=0), kind="tfidf", n_train=len(texts), data_hash="0" * 64)
"""


def train_in_process(path: Path, hash_seed: str) -> None:
    """`slotgate train` in its own interpreter: set iteration order (the vectorizer's stop-word
    set) follows PYTHONHASHSEED, and the artifact records its creation time."""
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(root)}
    subprocess.run([sys.executable, "-c", TRAIN, str(path)], check=True, env=env, cwd=root)


def test_models_fit_alike_in_two_processes_share_the_fingerprint(tmp_path: Path) -> None:
    first, second = tmp_path / "a.joblib", tmp_path / "b.joblib"
    train_in_process(first, "1")
    train_in_process(second, "2")
    assert first.read_bytes() != second.read_bytes()  # the pickles differ...
    assert SklearnBackend(first).fingerprint == SklearnBackend(second).fingerprint  # ...not so


def test_the_digest_follows_parameters_and_fitted_weights() -> None:
    texts, labels = toy_data()
    model = train_text_model(texts, labels, kind="tfidf", seed=0)
    assert fitted_digest(model) == fitted_digest(train_text_model(texts, labels, kind="tfidf"))
    assert fitted_digest(model) != fitted_digest(
        train_text_model(texts[:-4], labels[:-4], kind="tfidf"))
    model.set_params(classifier__C=1.0)  # same weights, another parameter
    changed = fitted_digest(model)
    model.set_params(classifier__C=10.0)
    assert changed != fitted_digest(model)
    model.named_steps["classifier"].coef_[0, 0] += 1e-9  # one weight moved
    assert fitted_digest(model) != changed


def test_a_pipeline_holding_what_cannot_be_digested_is_refused(tmp_path: Path) -> None:
    import joblib

    texts, labels = toy_data()
    model = train_text_model(texts, labels, kind="tfidf")
    model.named_steps["classifier"].odd_ = object()
    path = tmp_path / "odd.joblib"
    joblib.dump({"format": "slotgate/text-model", "version": 1, "kind": "tfidf",
                 "labels": [str(c) for c in model.classes_], "pipeline": model}, path)
    with pytest.raises(ConfigError, match="field 'pipeline': cannot digest") as info:
        load_text_model(path)
    assert info.value.field == "pipeline"


def test_the_digest_of_each_kind_of_value_is_pinned() -> None:
    """A served policy names its model by this digest: the bytes fed for each kind of value
    (and which kind a value counts as: a numpy float is a float, a class is a type) must not
    move, or every tuned policy stops matching its model."""
    import numpy as np
    from scipy import sparse

    values = [None, True, 3, 2.5, "x", b"y", np.arange(3, dtype=np.int64), np.float64(1.5),
              sparse.csr_matrix(np.eye(2)), {"b": 1, "a": (1,)}, {2, 1}, int, len]
    assert fitted_digest(values) == (
        "9254d85a57987105ff57a17619d89bcf65f18fdf0abeba17a4ad3cac356dc716")
    assert fitted_digest([np.float64(1.5)]) != fitted_digest([1.5])  # by repr: kept apart
