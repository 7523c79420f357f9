"""The ``sklearn`` fast backend: a scikit-learn text classifier (TF-IDF word + character n-grams
and logistic regression, or embeddings + logistic regression, see ``encoders.py``) trained on
labelled text and saved as a versioned joblib artifact.

Artifact: a joblib dict ``{"format": "slotgate/text-model", "version": 1, "kind", "labels",
"pipeline", "n_train", "data_hash", "created_at", "question"}``; ``question`` (``Question.as_dict``)
is the question it was trained for, which is the only one it reads: any other is BackendRejected,
whatever its options (a classifier of intents answers "is the customer angry?" with an intent's
probability). Artifacts written before questions were recorded have none and read any question.
joblib files are pickles: load only artifacts you made. The fingerprint is the model's kind plus
a digest of what it computes (``model_digest.py``): two models fit alike share it, whatever their
files' bytes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from calibration.artifacts import atomic_path
from policies.scope import Question
from policies.types import DecisionRequest, OptionScores
from router.backends.base import FastBackend
from router.backends.model_digest import fitted_digest
from router.errors import BackendMalformed, BackendRejected, BackendUnavailable, ConfigError

MODEL_FORMAT = "slotgate/text-model"
MODEL_VERSION = 1
MODEL_KINDS = ("tfidf", "wordllama", "minilm")
# Classes of ours that saved artifacts name by module path (joblib pickles the pipeline). Each
# path must stay importable: a class that moves leaves an alias at its old path (tested).
PICKLED_CLASS_PATHS = (
    "router.backends.embedding.EmbeddingEncoder",  # models saved before encoders.py existed
    "router.backends.encoders.EmbeddingEncoder",
)


def build_tfidf_pipeline(*, seed: int = 0) -> Any:
    """TF-IDF over word 1-2-grams and character 3-5-grams, then multinomial logistic regression.
    Sized so 10k short texts train in well under a minute on 2 cores (~0.91 on BANKING77)."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import FeatureUnion, Pipeline

    features = FeatureUnion([
        ("word", TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=2)),
        ("char", TfidfVectorizer(analyzer="char_wb", ngram_range=(3, 5), sublinear_tf=True,
                                 min_df=3, max_features=20_000)),
    ])
    classifier = LogisticRegression(C=10.0, max_iter=300, tol=1e-3, random_state=seed)
    return Pipeline([("features", features), ("classifier", classifier)])


def train_text_model(texts: Sequence[str], labels: Sequence[str], *, kind: str, seed: int = 0
                     ) -> Any:
    """A fitted pipeline of the given kind (``tfidf``, ``wordllama`` or ``minilm``)."""
    if kind == "tfidf":
        pipeline = build_tfidf_pipeline(seed=seed)
    elif kind in MODEL_KINDS:
        from router.backends.encoders import build_embedding_pipeline

        pipeline = build_embedding_pipeline(kind, seed=seed)
    else:
        raise ValueError(f"kind must be one of {MODEL_KINDS}, got {kind!r}")
    if len(set(labels)) < 2:
        raise ValueError("labels must hold at least 2 distinct classes")
    return pipeline.fit(list(texts), list(labels))


def save_text_model(path: Path, pipeline: Any, *, kind: str, n_train: int, data_hash: str,
                    question: Question | None = None,
                    extra: Mapping[str, Any] | None = None) -> None:
    """Write the versioned artifact atomically (a failed write leaves nothing behind), trained
    for ``question`` (None: it reads any question; ``slotgate train`` always names one);
    ``extra`` adds metadata (``train --cv`` records its out-of-fold rows under "oof")."""
    import joblib

    payload = {**(extra or {}),
        "question": None if question is None else question.as_dict(),
        "format": MODEL_FORMAT, "version": MODEL_VERSION, "kind": kind,
        "labels": [str(c) for c in pipeline.classes_], "pipeline": pipeline,
        "n_train": n_train, "data_hash": data_hash,
        "created_at": datetime.now(UTC).isoformat(),
    }
    with atomic_path(path) as tmp:
        joblib.dump(payload, tmp)


@dataclass(frozen=True)
class TextModel:
    """A loaded artifact: ``predict_proba(texts)`` has one column per label, in ``labels`` order."""

    path: Path
    kind: str
    labels: tuple[str, ...]
    pipeline: Any
    digest: str  # model_digest.fitted_digest of the pipeline
    meta: Mapping[str, Any]

    def predict_proba(self, texts: Sequence[str]) -> NDArray[np.float64]:
        return np.asarray(self.pipeline.predict_proba(list(texts)), dtype=np.float64)

    @property
    def question(self) -> Question | None:
        """The question it was trained for (None: an artifact that records none)."""
        recorded = self.meta.get("question")
        return None if recorded is None else Question.asked(
            recorded["id"], instructions=recorded.get("instructions", ""),
            context=recorded.get("context", ""), kind=recorded.get("kind", "choice"))


def load_text_model(path: Path) -> TextModel:
    """Load and check an artifact; anything wrong raises ConfigError naming the file and field."""
    import joblib

    try:
        payload = joblib.load(path)
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: model file not found", field="model") from exc
    except Exception as exc:  # unpickling can raise almost anything; all mean "not our artifact"
        raise ConfigError(f"{path}: not a slotgate model artifact: {exc}", field="model") from exc
    if not isinstance(payload, dict) or payload.get("format") != MODEL_FORMAT:
        raise ConfigError(f"{path}: field 'format' is not {MODEL_FORMAT!r}", field="format")
    if payload.get("version") != MODEL_VERSION:
        raise ConfigError(f"{path}: field 'version' is {payload.get('version')!r}, this slotgate "
                          f"reads version {MODEL_VERSION} (re-run `slotgate train`)", field="version")
    if payload.get("kind") not in MODEL_KINDS:
        raise ConfigError(f"{path}: field 'kind' is {payload.get('kind')!r}", field="kind")
    question = payload.get("question")
    if question is not None and not (isinstance(question, dict)
                                     and isinstance(question.get("id"), str)):
        raise ConfigError(f"{path}: field 'question' is {question!r}, not a question",
                          field="question")
    labels = tuple(payload["labels"])
    if labels != tuple(str(c) for c in payload["pipeline"].classes_):
        raise ConfigError(f"{path}: field 'labels' does not match the pipeline's classes",
                          field="labels")
    try:
        digest = fitted_digest(payload["pipeline"])
    except TypeError as exc:
        raise ConfigError(f"{path}: field 'pipeline': {exc}", field="pipeline") from exc
    meta = {k: v for k, v in payload.items() if k != "pipeline"}
    return TextModel(path=path, kind=payload["kind"], labels=labels, pipeline=payload["pipeline"],
                     digest=digest, meta=meta)


class SklearnBackend(FastBackend):
    """Scores ``DecisionRequest.state`` with a trained text model. Each read covers exactly the
    request's options: the model's probabilities restricted to them and renormalised (``raw``
    keeps the mass they had). A requested option the model never learned, or a question other
    than the one it was trained for, is BackendRejected."""

    name = "sklearn"

    def __init__(self, model_path: Path | None = None, *, model: TextModel | None = None) -> None:
        if model is None:
            if model_path is None:
                raise ConfigError("the sklearn backend needs a model_path", field="model_path")
            model = load_text_model(Path(model_path))
        self.model = model
        self._index = {label: j for j, label in enumerate(model.labels)}
        self._question = model.question

    def identity(self) -> Mapping[str, Any]:
        # "sklearn" for every kind, so the embedding subclass fingerprints the same file alike.
        return {"backend": "sklearn", "kind": self.model.kind, "model_digest": self.model.digest}

    def _columns(self, request: DecisionRequest) -> list[int]:
        if self._question is not None and Question.of(request) != self._question:
            raise BackendRejected(
                f"question {request.question_id!r}: model {self.model.path.name} was trained "
                f"for question {self._question.describe()} and reads no other",
                field="question")
        unknown = [name for name in request.option_names if name not in self._index]
        if unknown:
            raise BackendRejected(
                f"question {request.question_id!r}: option(s) {unknown[:5]} are not classes of "
                f"model {self.model.path.name} ({len(self._index)} classes)", field="options")
        return [self._index[name] for name in request.option_names]

    async def read(self, requests: Sequence[DecisionRequest]) -> list[OptionScores]:
        if not requests:
            return []
        columns = [self._columns(r) for r in requests]
        try:
            proba = await asyncio.to_thread(self.model.predict_proba, [r.state for r in requests])
        except (ImportError, OSError) as exc:
            raise BackendUnavailable(f"{self.model.kind} model cannot run: {exc}") from exc
        except (ValueError, TypeError, RuntimeError) as exc:
            raise BackendMalformed(f"{self.model.kind} model failed to read: {exc}") from exc
        out = []
        for request, cols, row in zip(requests, columns, proba, strict=True):
            sub = row[cols]
            mass = float(sub.sum())
            if not np.isfinite(mass) or mass <= 0.0:
                raise BackendMalformed(f"question {request.question_id!r}: the model gives its "
                                       "options no probability mass")
            out.append(OptionScores(request.option_names, tuple(float(p) for p in sub / mass),
                                    raw={"option_mass": mass}))
        return out
