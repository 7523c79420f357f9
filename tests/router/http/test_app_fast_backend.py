"""/readyz shows what the fast backend serves with (``FastBackend.serving``): the torch
backend's kernels and its fallbacks, counted on ``slotgate_fast_backend_fallbacks``. A fallback
is reported, never a readiness condition; a backend with nothing to say (the mock) leaves the
body as it was."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.backends.base import FastBackend
from router.backends.mock import MockBackend
from router.http.app import create_app
from router.settings import Settings
from tests.reliability.conftest import metric_value


async def ops_of(backend: FastBackend, tmp_path: Path) -> tuple[dict[str, Any], str, int]:
    """(/readyz body, /metrics text, /readyz status) of an app over ``backend``."""
    app = create_app(Settings(log={"decision_log_path": tmp_path / "log.jsonl"}), backend=backend)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            ready = await client.get("/readyz")
            metrics = (await client.get("/metrics")).text
    return ready.json(), metrics, ready.status_code


async def test_a_backend_with_nothing_to_say_leaves_readyz_as_it_was(tmp_path: Path) -> None:
    body, metrics, status = await ops_of(MockBackend(lambda r: [0.5, 0.5]), tmp_path)
    assert status == 200 and body["status"] == "ready"
    assert "fast_backend" not in body and body["checks"]["fast_backend"] is True
    assert metric_value(metrics, "slotgate_fast_backend_fallbacks") == 0


def torch_backend(*, failing_warm_up: bool) -> Any:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from router.backends.torch.backend import TorchBackend
    from router.backends.torch.model.choice import default_choice
    from router.backends.torch.options import TorchOptions
    from router.backends.torch.serve.diffusion import DiffusionSlotReader
    from router.backends.torch.serve.graphs import GraphShapes
    from tests.router.backends.torch.test_diffusion import tiny_model
    from tests.router.backends.torch_models import smollm2_tokenizer

    tokenizer = smollm2_tokenizer()
    model = tiny_model(vocab=len(tokenizer), window=4096)
    reader = DiffusionSlotReader(model)
    if failing_warm_up:  # graphs too small for the template's prefix: the eager read serves
        compiled = replace(default_choice(model), compiled=True, compile_backend="aot_eager")
        shapes = GraphShapes(batches=(1,), widths=(64,), draws=(1,), prefix_tokens=8,
                             capture=False)
        reader = DiffusionSlotReader(model, choice=compiled, graphs=shapes)
    backend = TorchBackend(reader, tokenizer, TorchOptions(kind="diffusion", turn_close_id=2),
                           model_id="tiny")
    if backend._warm is not None:
        backend._warm.result(timeout=120)
    return backend


async def test_readyz_shows_the_torch_backends_kernels(tmp_path: Path) -> None:
    backend = torch_backend(failing_warm_up=False)
    body, metrics, status = await ops_of(backend, tmp_path)
    assert status == 200 and body["status"] == "ready"
    served = body["fast_backend"]
    assert served["kind"] == "diffusion" and served["device"] == "cpu"
    assert served["compiled"] is False and served["ready"] is True
    kernels = json.loads(json.dumps(backend.reader.choice.summary()))  # head dims: str keys
    assert served["kernels"] == kernels and served["fallbacks"] == []
    assert metric_value(metrics, "slotgate_fast_backend_fallbacks") == 0


async def test_the_prefix_cache_is_shown_and_counted(tmp_path: Path) -> None:
    """Reads of two questions: /readyz shows the cache, /metrics counts its lookups (brought up
    to date at each read of /readyz or /metrics, never counted twice)."""
    from policies.types import DecisionRequest, Option

    backend = torch_backend(failing_warm_up=False)
    for k in (0, 1, 0):
        await backend.read([DecisionRequest(f"q{k}", f"Which one, form {k}?",
                                            (Option("yes"), Option("no")), "hello")])
    app = create_app(Settings(log={"decision_log_path": tmp_path / "log.jsonl"}), backend=backend)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            body = (await client.get("/readyz")).json()
            metrics = (await client.get("/metrics")).text
    assert body["fast_backend"]["prefix_cache"] == {"entries": 2, "capacity": 8, "hits": 1,
                                                    "misses": 2, "evictions": 0}
    assert metric_value(metrics, "slotgate_fast_backend_prefix_cache_total", result="miss") == 2
    assert metric_value(metrics, "slotgate_fast_backend_prefix_cache_total", result="hit") == 1


async def test_a_warm_up_fallback_is_reported_and_the_replica_stays_ready(tmp_path: Path) -> None:
    backend = torch_backend(failing_warm_up=True)
    body, metrics, status = await ops_of(backend, tmp_path)
    assert status == 200 and body["status"] == "ready"  # it serves, slower: reported only
    [fallback] = body["fast_backend"]["fallbacks"]
    assert fallback.startswith("compiled read failed at warm-up: serving the eager read (")
    assert body["fast_backend"]["kernels"]["compiled"] is False
    assert metric_value(metrics, "slotgate_fast_backend_fallbacks") == 1
