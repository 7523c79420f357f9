"""The sklearn and embedding backends: reads over exactly the requested options, renormalised;
unknown options rejected by name; the fingerprint follows the artifact; bad artifacts refused."""

from __future__ import annotations

from pathlib import Path

import joblib
import numpy as np
import pytest

from policies.scope import Question
from policies.types import DecisionRequest, Option
from router.backends.embedding import EmbeddingBackend
from router.backends.sklearn import (
    SklearnBackend,
    load_text_model,
    save_text_model,
    train_text_model,
)
from router.errors import BackendRejected, ConfigError

PHRASES = {
    "card_arrival": ["where is my new card", "my card has not arrived yet",
                     "when will the card be delivered", "card still not here"],
    "card_lost": ["i lost my card", "my card was stolen", "block my lost card",
                  "someone took my card"],
    "exchange_rate": ["what is the exchange rate", "rate for euros to dollars",
                      "how much is the currency conversion", "exchange rate today"],
}


def toy_data() -> tuple[list[str], list[str]]:
    texts, labels = [], []
    for label, phrases in PHRASES.items():
        for i in range(5):
            for phrase in phrases:
                texts.append(f"{phrase} {'please' * (i % 2)}".strip())
                labels.append(label)
    return texts, labels


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    texts, labels = toy_data()
    path = tmp_path_factory.mktemp("model") / "toy.joblib"
    save_text_model(path, train_text_model(texts, labels, kind="tfidf"), kind="tfidf",
                    n_train=len(texts), data_hash="0" * 64)
    return path


def request(options: tuple[str, ...], state: str) -> DecisionRequest:
    return DecisionRequest("q", "intent?", tuple(Option(o) for o in options), state)


async def test_reads_cover_exactly_the_requested_options(model_path: Path) -> None:
    backend = SklearnBackend(model_path)
    full = ("exchange_rate", "card_lost", "card_arrival")  # not the model's order
    two = ("card_lost", "exchange_rate")
    scores = await backend.read([request(full, "i lost my card"), request(two, "i lost my card")])
    assert scores[0].options == full and scores[1].options == two
    for s in scores:
        assert sum(s.proba) == pytest.approx(1.0) and s.top[0] == "card_lost"
    # Restricting renormalises the same numbers: the ratio of two options is kept.
    p_full, p_two = scores[0].as_dict(), scores[1].as_dict()
    assert p_full["card_lost"] / p_full["exchange_rate"] == pytest.approx(
        p_two["card_lost"] / p_two["exchange_rate"])
    assert scores[1].raw["option_mass"] == pytest.approx(
        p_full["card_lost"] + p_full["exchange_rate"])
    assert await backend.read([]) == []


async def test_unknown_option_is_rejected_by_name(model_path: Path) -> None:
    backend = SklearnBackend(model_path)
    with pytest.raises(BackendRejected, match="top_up"):
        await backend.read([request(("card_lost", "top_up"), "hello")])


async def test_a_model_trained_for_one_question_reads_no_other(tmp_path: Path) -> None:
    """An intent classifier asked "is the customer angry?" (yes/no) or a yes/no question
    named like another would answer with intent probabilities: it refuses, naming the field."""
    texts, labels = toy_data()
    path = tmp_path / "intent.joblib"
    intent = Question.asked("intent")
    save_text_model(path, train_text_model(texts, labels, kind="tfidf"), kind="tfidf",
                    n_train=len(texts), data_hash="0" * 64, question=intent)
    backend = SklearnBackend(path)
    assert backend.model.question == intent
    options = tuple(Option(o) for o in PHRASES)
    asked = DecisionRequest("intent", "intent", options, "i lost my card")  # OpenAI, no text
    system_one = DecisionRequest("intent", "", options, "i lost my card")  # the same question
    [one, two] = await backend.read([asked, system_one])
    assert one.top[0] == two.top[0] == "card_lost"
    for other in (DecisionRequest("not_intent", "not_intent", options, "i lost my card"),
                  DecisionRequest("intent", "Which intent does it NOT express?", options, "x"),
                  DecisionRequest("intent", "intent", options, "x", kind="score"),
                  DecisionRequest("intent", "intent", options, "x", context="Be brief.")):
        with pytest.raises(BackendRejected, match="trained for question 'intent'") as info:
            await backend.read([other])
        assert info.value.field == "question"


def test_fingerprint_follows_the_artifact(model_path: Path, tmp_path: Path) -> None:
    backend = SklearnBackend(model_path)
    assert backend.fingerprint == SklearnBackend(model_path).fingerprint
    assert backend.identity()["kind"] == "tfidf"
    texts, labels = toy_data()
    other = tmp_path / "other.joblib"
    save_text_model(other, train_text_model(texts[:-4], labels[:-4], kind="tfidf"),
                    kind="tfidf", n_train=len(texts) - 4, data_hash="1" * 64)
    assert SklearnBackend(other).fingerprint != backend.fingerprint


@pytest.mark.parametrize(("payload", "field"), [
    ({"format": "something-else"}, "format"),
    ("just a string", "format"),
])
def test_foreign_artifacts_are_refused(tmp_path: Path, payload: object, field: str) -> None:
    path = tmp_path / "bad.joblib"
    joblib.dump(payload, path)
    with pytest.raises(ConfigError) as info:
        load_text_model(path)
    assert info.value.field == field and str(path) in str(info.value)


def test_version_mismatch_is_refused(model_path: Path, tmp_path: Path) -> None:
    payload = joblib.load(model_path)
    payload["version"] = 99
    path = tmp_path / "v99.joblib"
    joblib.dump(payload, path)
    with pytest.raises(ConfigError, match="'version' is 99"):
        load_text_model(path)


def test_missing_and_garbage_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        SklearnBackend(tmp_path / "nope.joblib")
    garbage = tmp_path / "garbage.joblib"
    garbage.write_bytes(b"not a pickle")
    with pytest.raises(ConfigError, match="not a slotgate model artifact"):
        SklearnBackend(garbage)


def test_embedding_backend_refuses_tfidf(model_path: Path) -> None:
    with pytest.raises(ConfigError, match="not an embedding model"):
        EmbeddingBackend(model_path)


async def test_wordllama_model_trains_offline_and_reads(tmp_path: Path) -> None:
    texts, labels = toy_data()
    path = tmp_path / "wl.joblib"
    pipeline = train_text_model(texts, labels, kind="wordllama")
    save_text_model(path, pipeline, kind="wordllama", n_train=len(texts), data_hash="0" * 64)
    backend = EmbeddingBackend(path)  # a fresh load: the encoder reloads from the wheel
    assert backend.fingerprint == SklearnBackend(path).fingerprint
    scores = await backend.read([request(("card_lost", "exchange_rate"), "my card was stolen")])
    assert scores[0].top[0] == "card_lost"
    assert np.isclose(sum(scores[0].proba), 1.0)
