"""TorchBackend's batching on the tiny DiffusionGemma (coalescer.py's Coalescer under the real
backend): concurrent reads coalesce and equal reads alone, a batch is tokenized in one call and
holds one question, its size follows the reader's graph buckets, a message is tokenized once
across questions, one request's failure fails only its caller, and warm-up gates readiness."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def parts() -> tuple[Any, Any]:
    from tests.router.backends.torch.test_diffusion import tiny_model
    from tests.router.backends.torch_models import smollm2_tokenizer

    tokenizer = smollm2_tokenizer()
    return tiny_model(vocab=len(tokenizer), window=4096), tokenizer


def backend(parts: tuple[Any, Any], reader: Any = None, **options: Any) -> Any:
    from router.backends.torch.backend import TorchBackend
    from router.backends.torch.options import TorchOptions
    from router.backends.torch.serve.diffusion import DiffusionSlotReader

    model, tokenizer = parts
    typed = TorchOptions(kind="diffusion", turn_close_id=2, **options)
    return TorchBackend(reader if reader is not None else DiffusionSlotReader(model), tokenizer, typed,
                        model_id="tiny")


class Spy:
    """A SlotReader over a real one that records each batch, or refuses one (``refuse``)."""

    def __init__(self, inner: Any, refuse: Any = None) -> None:
        self.inner, self.refuse = inner, refuse
        self.seen: list[list[Any]] = []
        self.device, self.compiled, self.needs_warm_up = inner.device, False, False
        self.batch_sizes = inner.batch_sizes

    def read(self, items: Any) -> list[Any]:
        self.seen.append(list(items))
        if self.refuse is not None and self.refuse(items):
            raise ValueError("prompt too long for this reader")
        return self.inner.read(items)  # type: ignore[no-any-return]

    def warm_up(self, sample: Any) -> Any:
        return self


def requests(n: int) -> list[Any]:
    from policies.types import DecisionRequest, Option

    options = tuple(Option(f"intent_{k}") for k in range(4))
    texts = ["my card is lost", "refund please, now", "where is my money", "hi"]
    return [DecisionRequest("q", "Which intent?", options, texts[k % 4] + " !" * k, samples=1 + k % 3,
                            seed=k) for k in range(n)]


def test_backend_coalesces_concurrent_reads_and_matches_reads_alone(parts: tuple[Any, Any]) -> None:
    many = requests(8)
    alone = backend(parts, coalesce_window_ms=0)
    want = [asyncio.run(alone.read([r]))[0] for r in many]
    shared = backend(parts, coalesce_window_ms=50)

    async def concurrently() -> list[Any]:
        return await asyncio.gather(*(shared.read([r]) for r in many))

    got = [scores[0] for scores in asyncio.run(concurrently())]
    assert shared._coalescer.batches < len(many)
    for a, b in zip(got, want):
        assert a.options == b.options and a.raw["draws"] == b.raw["draws"]
        np.testing.assert_allclose(a.proba, b.proba, rtol=1e-4, atol=1e-6)


def test_backend_tokenizes_a_batch_in_one_call_with_the_same_items(parts: tuple[Any, Any]) -> None:
    from router.backends.torch.serve.diffusion import DiffusionSlotReader
    from router.backends.torch.serve.prompt import encode, encode_many

    spy = Spy(DiffusionSlotReader(parts[0]))
    shared = backend(parts, spy, coalesce_window_ms=50)
    many = requests(8)
    many.append(type(many[0])("q", "Which intent?", many[0].options, "", seed=99))  # empty state
    tokenizer = shared.tokenizer
    assert encode_many(tokenizer, [r.state for r in many]) == [encode(tokenizer, r.state) for r in many]
    reference = backend(parts)  # its own tokenized states: ``shared`` starts with none
    one_by_one = [reference.items([reference.pending(r)])[0] for r in many]
    assert backend(parts).items([reference.pending(r) for r in many]) == one_by_one
    assert one_by_one[0] == backend(parts).item(many[0])
    seen = spy.seen
    calls = 0
    real_call = type(tokenizer).__call__

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return real_call(self, *args, **kwargs)

    async def concurrently() -> list[Any]:
        return await asyncio.gather(*(shared.read([r]) for r in many))

    type(tokenizer).__call__ = counting
    try:
        asyncio.run(concurrently())
    finally:
        type(tokenizer).__call__ = real_call
    assert sorted((it for batch in seen for it in batch), key=lambda it: it.seed) == \
        sorted(one_by_one, key=lambda it: it.seed)
    assert calls == len(seen) < len(many)  # one batched tokenizer call per batch


def two_questions(samples: int | None = None) -> list[Any]:
    """3 requests of each of two questions (canvases of one width), interleaved as they arrive;
    ``samples``: each request's draws (default: 1 to 3)."""
    from dataclasses import replace

    from policies.types import DecisionRequest, Option

    other = [DecisionRequest("p", "Which queue?", (Option("billing"), Option("tech"), Option("sales")),
                             f"ticket {k}", seed=k) for k in range(3)]
    mixed = [r for pair in zip(requests(3), other, strict=True) for r in pair]
    return mixed if samples is None else [replace(r, samples=samples) for r in mixed]


def assert_answers_alone(parts: tuple[Any, Any], shared: Any, asked: list[Any]) -> None:
    """``shared`` (once ready) answers ``asked``, sent concurrently, as a backend that reads each
    request alone does."""
    alone = backend(parts, coalesce_window_ms=0)
    want = [asyncio.run(alone.read([r]))[0] for r in asked]

    async def concurrently() -> list[Any]:
        while not await shared.ready():
            await asyncio.sleep(0.01)
        return await asyncio.gather(*(shared.read([r]) for r in asked))

    got = [scores[0] for scores in asyncio.run(concurrently())]
    for a, b in zip(got, want, strict=True):
        assert a.options == b.options
        np.testing.assert_allclose(a.proba, b.proba, rtol=1e-4, atol=1e-6)


def test_backend_batches_one_question_at_a_time(parts: tuple[Any, Any]) -> None:
    """Requests of two questions at once: each batch reads one question (the reader reads a
    question's items apart from another's), with the same answers as reads alone."""
    from router.backends.torch.serve.diffusion import DiffusionSlotReader

    spy = Spy(DiffusionSlotReader(parts[0]))
    shared = backend(parts, spy, coalesce_window_ms=50)
    assert_answers_alone(parts, shared, two_questions())
    prefixes = [{item.prefix_ids for item in batch} for batch in spy.seen]
    assert [len(p) for p in prefixes] == [1, 1] and prefixes[0] != prefixes[1]
    assert [len(batch) for batch in spy.seen] == [3, 3]


def test_backend_sizes_batches_by_the_readers_graph_buckets(parts: tuple[Any, Any]) -> None:
    """10 waiting reads of one question and graph buckets of 8 and 16 items: 8 now and 2 next
    (10 in a bucket of 16 cost 4 + 16 items' worth; 8 cost 4 + 8); no buckets: all 10."""
    from router.backends.torch.serve.diffusion import DiffusionSlotReader
    from router.backends.torch.serve.graphs import GraphShapes

    shapes = GraphShapes(batches=(1, 2, 4, 8, 16), widths=(64,), prefix_tokens=1024, capture=False)
    for reader, want in ((DiffusionSlotReader(parts[0], graphs=shapes), [8, 2]),
                         (DiffusionSlotReader(parts[0]), [10])):
        assert reader.batch_sizes == ((1, 2, 4, 8, 16) if reader.graphs is not None else ())
        spy = Spy(reader)
        shared = backend(parts, spy, coalesce_window_ms=50)

        async def concurrently() -> list[Any]:
            return await asyncio.gather(*(shared.read([r]) for r in requests(10)))  # noqa: B023

        assert all(len(scores) == 1 for scores in asyncio.run(concurrently()))
        assert [len(batch) for batch in spy.seen] == want


def test_backend_tokenizes_a_state_once_across_questions_and_batches(parts: tuple[Any, Any]) -> None:
    """One message asked several questions (in one batch, or one after another) is tokenized once,
    with the ids a fresh tokenizing gives; the kept states are bounded (oldest out first)."""
    from policies.types import DecisionRequest, Option
    from router.backends.torch import backend as backend_module
    from router.backends.torch.serve.prompt import encode

    shared = backend(parts)
    texts: list[list[str]] = []
    real = backend_module.encode_many

    def counting(tokenizer: Any, batch: list[str]) -> Any:
        texts.append(list(batch))
        return real(tokenizer, batch)

    ticket = "my card was charged twice and the refund never came"
    questions = [DecisionRequest(q, f"Which {q}?", (Option("a"), Option("b"), Option("c")), ticket)
                 for q in ("intent", "queue", "priority")]
    backend_module.encode_many = counting  # type: ignore[assignment]
    try:
        items = shared.items([shared.pending(r) for r in questions])  # one batch, three questions
        again = shared.items([shared.pending(questions[0])])  # a later batch, the same message
        other = shared.items([shared.pending(requests(2)[1])])
    finally:
        backend_module.encode_many = real
    assert texts == [[ticket], [requests(2)[1].state]]
    want = encode(shared.tokenizer, ticket)
    assert all(item.suffix_ids[: len(want)] == want for item in items + again)
    assert other[0].suffix_ids[:3] == encode(shared.tokenizer, requests(2)[1].state)[:3]
    original = backend_module.STATE_IDS_KEPT
    backend_module.STATE_IDS_KEPT = 2
    try:
        shared.items([shared.pending(r) for r in requests(4)])
    finally:
        backend_module.STATE_IDS_KEPT = original
    assert list(shared._state_ids) == [r.state for r in requests(4)][-2:]


def test_backend_failure_of_one_request_fails_only_its_caller(parts: tuple[Any, Any]) -> None:
    from router.backends.torch.serve.diffusion import DiffusionSlotReader
    from router.errors import BackendMalformed

    # the reader cannot read one request's prompt
    spy = Spy(DiffusionSlotReader(parts[0]), refuse=lambda items: any(len(it.suffix_ids) > 40 for it in items))
    shared = backend(parts, spy, coalesce_window_ms=50)
    many = requests(4)
    many[2] = type(many[2])("q", "Which intent?", many[2].options, "word " * 60, seed=2)

    async def concurrently() -> list[Any]:
        return await asyncio.gather(*(shared.read([r]) for r in many), return_exceptions=True)

    results = asyncio.run(concurrently())
    assert isinstance(results[2], BackendMalformed) and "too long" in str(results[2])
    assert all(isinstance(r, list) and len(r) == 1 for i, r in enumerate(results) if i != 2)


def test_backend_warm_up_gates_readiness_and_falls_back_to_eager(parts: tuple[Any, Any],
                                                               caplog: Any) -> None:
    from dataclasses import replace

    from router.backends.torch.model.choice import default_choice
    from router.backends.torch.serve import warm_up
    from router.backends.torch.serve.diffusion import DiffusionSlotReader
    from router.backends.torch.serve.graphs import GraphShapes

    eager = backend(parts)
    assert asyncio.run(eager.ready()) and eager.compiled is False  # CPU: nothing to warm up
    want = asyncio.run(eager.read(requests(3)))
    gate = threading.Event()
    original = warm_up.warm_up

    def slow_warm_up(reader: Any, sample: Any) -> Any:
        gate.wait(5)
        return original(reader, sample)

    model = parts[0]
    compiled = replace(default_choice(model), compiled=True, compile_backend="aot_eager")
    shapes = GraphShapes(batches=(1, 4), widths=(64,), draws=(1, 3), prefix_tokens=1024, capture=False)
    warm_up.warm_up = slow_warm_up
    try:
        warming = backend(parts, DiffusionSlotReader(model, choice=compiled, graphs=shapes))
        assert asyncio.run(warming.ready()) is False
        gate.set()
        warming._warm.result(timeout=60)
        assert asyncio.run(warming.ready()) and warming.compiled is True
        assert warming.reader.graphs is not None
        got = asyncio.run(warming.read(requests(3)))
        # the read was replayed from the static buffers (its prefix is the one loaded there)
        assert warming.reader.graphs.loaded == warming.item(requests(1)[0]).prefix_ids
        for a, b in zip(got, want):
            np.testing.assert_allclose(a.proba, b.proba, rtol=1e-4, atol=1e-6)
    finally:
        warm_up.warm_up = original

    # a warm-up that fails (here: graphs too small for the template's prefix): logged, and an
    # eager twin of the reader serves; the reader itself is never changed
    with caplog.at_level("WARNING"):
        reader = DiffusionSlotReader(model, choice=compiled, graphs=replace(shapes, prefix_tokens=8))
        failing = backend(parts, reader)
        failing._warm.result(timeout=60)
    assert asyncio.run(failing.ready()) and failing.compiled is False
    assert failing.reader is not reader and failing.reader.choice == compiled.eager()
    assert reader.choice.compiled and reader.graphs is not None  # never changed
    assert failing.reader.graphs is None and "serving the eager read" in caplog.text
    got = asyncio.run(failing.read(requests(3)))
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.proba, b.proba, rtol=1e-4, atol=1e-6)


def test_speed_options_are_validated_settings() -> None:
    from pydantic import ValidationError

    from router.backends.torch.options import TorchOptions

    options = TorchOptions(kind="diffusion", coalesce_window_ms=1.5, max_batch=8, compiled=False,
                           graph_widths=[64, 128], graph_prefix_tokens=1024)
    assert options.model_dump(exclude_unset=True)["graph_widths"] == [64, 128]
    with pytest.raises(ValidationError, match="coalesce_window_ms"):
        TorchOptions(kind="diffusion", coalesce_window_ms=-1)
    with pytest.raises(ValidationError, match="fixed_cost_items"):
        TorchOptions(kind="diffusion", fixed_cost_items=-0.5)
    with pytest.raises(ValidationError, match="split_kv_chunks"):
        TorchOptions(kind="diffusion", split_kv_chunks=1)
    with pytest.raises(ValidationError, match="unknown_switch"):  # no option but the published
        TorchOptions(kind="diffusion", unknown_switch=True)  # type: ignore[call-arg]


def test_at_most_eight_speed_options_each_documented() -> None:
    from router.backends.torch.options import GRAPH_OPTIONS, SPEED_OPTIONS, TorchOptions

    fields = TorchOptions.model_fields
    assert len(SPEED_OPTIONS) <= 8 and set(SPEED_OPTIONS) | set(GRAPH_OPTIONS) <= set(fields)
    for name in SPEED_OPTIONS:
        assert fields[name].description, name
