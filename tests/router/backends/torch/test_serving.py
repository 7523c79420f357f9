"""What the torch backend serves with (``TorchBackend.serving``, shown on /readyz): its kernel
choice, its CUDA graphs and its fallbacks: a kernel family turned off by a failed check, or a
warm-up that fell back to the eager read, costs throughput that a log warning alone would hide."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from router.backends.torch.backend import TorchBackend
from router.backends.torch.model.choice import KernelChoice, default_choice
from router.backends.torch.options import TorchOptions
from router.backends.torch.serve import warm_up
from router.backends.torch.serve.build import make_reader
from router.backends.torch.serve.diffusion import DiffusionSlotReader
from router.backends.torch.serve.graphs import GraphShapes
from router.backends.torch.serve.warm_up import warm_up_fallbacks

EAGER_FALLBACK = "compiled read failed at warm-up: serving the eager read"


@pytest.fixture(scope="module")
def parts() -> tuple[Any, Any]:
    from tests.router.backends.torch.test_diffusion import tiny_model
    from tests.router.backends.torch_models import smollm2_tokenizer

    tokenizer = smollm2_tokenizer()
    return tiny_model(vocab=len(tokenizer), window=4096), tokenizer


def options(**extra: Any) -> TorchOptions:
    return TorchOptions(kind="diffusion", turn_close_id=2, **extra)


def failing_warm_up(parts: tuple[Any, Any]) -> tuple[TorchBackend, DiffusionSlotReader]:
    """A backend whose compiled reader fails its warm-up (graphs too small for the template's
    prefix), once it is done; and that reader."""
    model, tokenizer = parts
    compiled = replace(default_choice(model), compiled=True, compile_backend="aot_eager")
    shapes = GraphShapes(batches=(1,), widths=(64,), draws=(1,), prefix_tokens=8, capture=False)
    reader = DiffusionSlotReader(model, choice=compiled, graphs=shapes)
    backend = TorchBackend(reader, tokenizer, options(), model_id="tiny")
    assert backend._warm is not None
    backend._warm.result(timeout=120)
    return backend, reader


def test_a_cpu_backend_reports_its_choice_and_no_fallback(parts: tuple[Any, Any],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from router.backends.torch.kernels import row_ops
    from router.backends.torch.model import ops

    model, tokenizer = parts
    backend = TorchBackend(make_reader(options(), model, tokenizer), tokenizer, options(),
                           model_id="tiny")

    def never(*_: Any, **__: Any) -> str:
        raise AssertionError("the CUDA kernel checks are not asked on the CPU")

    monkeypatch.setattr(row_ops, "triton_problem", never)
    monkeypatch.setattr(ops, "fused_moe_problem", never)
    serving = backend.serving()
    assert isinstance(backend.reader, DiffusionSlotReader)
    assert serving == {"kind": "diffusion", "device": "cpu", "compiled": False, "ready": True,
                       "prefix_cache": {"entries": 0, "capacity": 8, "hits": 0, "misses": 0,
                                        "evictions": 0},
                       "kernels": backend.reader.choice.summary(), "cuda_graphs": 0,
                       "fallbacks": []}
    assert serving["kernels"]["triton"] is False  # the plain eager read: intended here
    assert "serving" not in backend.identity() and backend.fingerprint  # not the identity


def test_readyz_counts_the_graphs(parts: tuple[Any, Any]) -> None:
    model, tokenizer = parts
    shapes = GraphShapes(batches=(1, 2, 4), widths=(64,), draws=(1,), prefix_tokens=1024,
                         capture=False)
    bucketed = TorchBackend(DiffusionSlotReader(model, graphs=shapes), tokenizer, options(),
                            model_id="tiny")
    assert bucketed._warm is not None
    bucketed._warm.result(timeout=120)
    serving = bucketed.serving()
    assert serving["cuda_graphs"] == 3 and serving["fallbacks"] == []


def test_a_failed_warm_up_is_reported_with_its_failure(parts: tuple[Any, Any]) -> None:
    backend, reader = failing_warm_up(parts)
    serving = backend.serving()
    assert serving["ready"] is True and serving["compiled"] is False
    assert serving["kernels"] == reader.choice.eager().summary() and serving["cuda_graphs"] == 0
    [fallback] = serving["fallbacks"]
    [failure] = warm_up.failures(backend.reader)
    assert fallback == f"{EAGER_FALLBACK} ({failure})"
    assert failure.split(":")[0].isidentifier()  # "Type: message"
    assert warm_up.failures(reader) == ()  # the reader it started with is no twin
    # it still reads
    from tests.router.backends.torch.test_backend_batching import requests

    assert len(asyncio.run(backend.read(requests(2)))) == 2


def test_compiled_asked_but_not_served_is_reported(parts: tuple[Any, Any]) -> None:
    model, tokenizer = parts
    eager = TorchBackend(DiffusionSlotReader(model), tokenizer, options(compiled=True),
                         model_id="tiny")
    [fallback] = eager.serving()["fallbacks"]
    assert fallback.startswith("compiled read asked for, but the reader is not compiled")


class Stub:
    """A reader as warm_up_fallbacks sees one: a choice, compiled or not, graphs or none."""

    def __init__(self, choice: KernelChoice, graphs: object = None) -> None:
        self.choice, self.graphs, self.compiled = choice, graphs, choice.compiled


def test_warm_up_fallbacks_name_each_change_and_its_failure() -> None:
    cudnn = KernelChoice(attention=((256, "cudnn"), (512, "math")), compiled=True)
    efficient = replace(cudnn, attention=((256, "efficient"), (512, "math")))
    started = Stub(cudnn, graphs=object())
    retried = Stub(efficient, graphs=object())
    warm_up._FAILURES[retried] = ("RuntimeError: capture refused",)  # type: ignore[index]
    assert warm_up_fallbacks(started, retried) == (  # type: ignore[arg-type]
        ("capture failed with cuDNN attention: serving the memory-efficient kernel "
         "(RuntimeError: capture refused)"),)
    eager = Stub(cudnn.eager())
    warm_up._FAILURES[eager] = ("RuntimeError: capture refused",  # type: ignore[index]
                                "ValueError: still refused")
    assert warm_up_fallbacks(started, eager) == (  # type: ignore[arg-type]
        f"{EAGER_FALLBACK} (ValueError: still refused)",)
    # graphs dropped from an uncompiled choice: the eager read too; no failure kept: no cause
    plain = KernelChoice()
    assert warm_up_fallbacks(Stub(plain, graphs=object()), Stub(plain)) == (  # type: ignore[arg-type]
        EAGER_FALLBACK,)
    assert warm_up_fallbacks(started, started) == ()  # type: ignore[arg-type]


def test_failed_kernel_checks_on_cuda_are_listed(parts: tuple[Any, Any],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA the memoised checks are asked again (here stood in: no GPU in the tests)."""
    from router.backends.torch.kernels import row_ops
    from router.backends.torch.model import ops

    model, tokenizer = parts
    backend = TorchBackend(DiffusionSlotReader(model), tokenizer, options(),
                           model_id="tiny")
    asked: list[tuple[Any, ...]] = []

    def triton_problem(device: Any) -> str:
        asked.append(("triton", device.type))
        return "RuntimeError: merge disagrees"

    def fused_moe_problem(device: Any) -> str:
        asked.append(("moe", device.type))
        return "fused experts disagree"

    monkeypatch.setattr(row_ops, "triton_problem", triton_problem)
    monkeypatch.setattr(ops, "fused_moe_problem", fused_moe_problem)

    class OnCuda:
        device = torch.device("cuda")
        model = torch.nn.Linear(2, 2).to(torch.bfloat16)

    assert backend._device_fallbacks(OnCuda(), KernelChoice()) == [
        "Triton row kernels off, the torch row ops serve: RuntimeError: merge disagrees",
        "fused Triton MoE off, the row-copy experts serve: fused experts disagree"]
    assert asked == [("triton", "cuda"), ("moe", "cuda")]
    # float32: default_choice never asks the fused MoE's check
    OnCuda.model = torch.nn.Linear(2, 2)
    assert len(backend._device_fallbacks(OnCuda(), KernelChoice())) == 1
    assert len(asked) == 3


def test_a_failed_causal_check_on_cuda_is_listed(parts: tuple[Any, Any],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """``default_choice`` turns ``causal_own`` off when the causal forms fail their check, and
    /readyz lists it. Asked again (memoised) for the choice that serves; a choice with
    ``causal_own`` on never asks it."""
    from router.backends.torch.kernels import attention, row_ops, split_kv

    model, tokenizer = parts
    backend = TorchBackend(DiffusionSlotReader(model), tokenizer, options(), model_id="tiny")
    asked: list[tuple[Any, ...]] = []

    def causal_problem(names: Any, device: Any, dtype: Any) -> str:
        asked.append((names, device.type, dtype))
        return "cudnn at head dim 256: disagrees (rel err 0.5, lse err 0.1)"

    monkeypatch.setattr(row_ops, "triton_problem", lambda device: "")
    monkeypatch.setattr(attention, "causal_problem", causal_problem)
    monkeypatch.setattr(split_kv, "split_problem", lambda names, splits, device, dtype: "")

    class OnCuda:
        device = torch.device("cuda")
        model = torch.nn.Linear(2, 2)  # float32: the fused MoE's check is not asked

    names = ((256, "cudnn"), (512, "efficient"))
    off = KernelChoice(attention=names, causal_own=False)
    assert backend._device_fallbacks(OnCuda(), off) == [
        ("causal attention for the prompt rests' own keys off, their dense causal bias serves: "
         "cudnn at head dim 256: disagrees (rel err 0.5, lse err 0.1)")]
    assert asked == [(names, "cuda", torch.float32)]
    assert backend._device_fallbacks(OnCuda(), replace(off, causal_own=True)) == []
    assert len(asked) == 1


def test_a_failed_split_check_on_cuda_is_listed(parts: tuple[Any, Any],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """``default_choice`` reads the prefix whole when the kernels fail split_kv's check; the
    replica lists it. A choice that splits, or options that turned the split off
    (``split_kv_items: 0``), never ask it."""
    from router.backends.torch.kernels import row_ops, split_kv

    model, tokenizer = parts
    asked: list[tuple[Any, ...]] = []

    def split_problem(names: Any, splits: int, device: Any, dtype: Any) -> str:
        asked.append((names, splits, device.type))
        return "cudnn at head dim 256: unavailable (RuntimeError: strides)"

    monkeypatch.setattr(row_ops, "triton_problem", lambda device: "")
    monkeypatch.setattr(split_kv, "split_problem", split_problem)

    class OnCuda:
        device = torch.device("cuda")
        model = torch.nn.Linear(2, 2)

    names = ((256, "cudnn"), (512, "efficient"))
    whole = KernelChoice(attention=names)
    backend = TorchBackend(DiffusionSlotReader(model), tokenizer, options(), model_id="tiny")
    assert backend._device_fallbacks(OnCuda(), whole) == [
        ("the prefix read in key chunks off, it is read whole: cudnn at head dim 256: "
         "unavailable (RuntimeError: strides)")]
    assert asked == [(names, split_kv.SPLIT_KV_CHUNKS, "cuda")]
    assert backend._device_fallbacks(OnCuda(), replace(whole, prefix_splits=4)) == []
    off = TorchBackend(DiffusionSlotReader(model), tokenizer, options(split_kv_items=0), model_id="tiny")
    assert off._device_fallbacks(OnCuda(), whole) == []
    assert len(asked) == 1


def test_the_causal_check_is_memoised() -> None:
    """What lets ``serving`` ask it again without running kernels: the same answer, one check."""
    from router.backends.torch.kernels.attention import causal_problem

    causal_problem.cache_clear()
    names = ((16, "cudnn"),)
    first = causal_problem(names, torch.device("cpu"), torch.float32)
    assert first.startswith("cudnn at head dim 16: unavailable")
    assert causal_problem(names, torch.device("cpu"), torch.float32) == first
    assert causal_problem.cache_info().hits == 1 and causal_problem.cache_info().misses == 1


def test_the_prefix_cache_is_sized_by_its_option_and_shown(parts: tuple[Any, Any]) -> None:
    """Three questions in turn (each its own static prefix): a cache of 2 evicts and misses on
    every read, one of 3 misses only once a question; both show it in ``serving``."""
    from policies.types import DecisionRequest, Option

    model, tokenizer = parts
    questions = [DecisionRequest(f"q{k}", f"Which intent, form {k}?", (Option("yes"), Option("no")),
                                 "my card is lost") for k in range(3)]
    seen = {}
    for entries in (2, 3):
        opts = options(prefix_cache_entries=entries)
        backend = TorchBackend(make_reader(opts, model, tokenizer), tokenizer, opts, model_id="tiny")
        for _ in range(2):
            for request in questions:
                asyncio.run(backend.read([request]))
        seen[entries] = backend.serving()["prefix_cache"]
    assert seen[2] == {"entries": 2, "capacity": 2, "hits": 0, "misses": 6, "evictions": 4}
    assert seen[3] == {"entries": 3, "capacity": 3, "hits": 3, "misses": 3, "evictions": 0}


def test_an_untied_model_is_read_by_the_two_pass_reader_behind_the_same_port(
        parts: tuple[Any, Any]) -> None:
    """make_reader gives a model whose encoder and decoder weights are not tied transformers'
    two-pass read (two_pass.py), which the one-pass reader refuses; it reads what the one-pass
    read reads of the tied model, and /readyz says which read serves."""
    import copy

    from router.backends.torch.serve.two_pass import TwoPassSlotReader
    from tests.router.backends.torch.test_fused import ITEMS, assert_same_reads

    model, tokenizer = parts
    untied = copy.deepcopy(model)
    mlp = untied.model.decoder.layers[0].mlp
    mlp.gate_proj.weight = torch.nn.Parameter(mlp.gate_proj.weight.detach().clone())  # same values
    reader = make_reader(options(), untied, tokenizer)
    assert isinstance(reader, TwoPassSlotReader) and reader.warm_up(ITEMS[0]) is reader
    assert_same_reads([reader.read([it])[0] for it in ITEMS], DiffusionSlotReader(model).read(ITEMS))
    serving = TorchBackend(reader, tokenizer, options(), model_id="tiny").serving()
    assert serving["kernels"] == {"two_pass": True} and serving["fallbacks"] == []
