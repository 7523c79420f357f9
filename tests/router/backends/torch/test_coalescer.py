"""Coalescing concurrent reads (coalescer.py, and through TorchBackend on the tiny DiffusionGemma):
concurrent callers share batches, each gets exactly its own answers, one caller's failure fails
only that caller, and batched answers equal one-at-a-time answers."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from router.backends.torch.coalescer import Coalescer


class Recorder:
    """A run_batch that doubles numbers, records each batch, and fails on negative numbers."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.batches: list[list[int]] = []
        self.delay_s = delay_s
        self.threads: set[str] = set()

    def __call__(self, items: list[int]) -> list[int]:
        self.batches.append(list(items))
        self.threads.add(threading.current_thread().name)
        if any(i < 0 for i in items):
            raise ValueError(f"cannot read {min(items)}")
        threading.Event().wait(self.delay_s)
        return [2 * i for i in items]


async def gather(coalescer: Coalescer[int, int], calls: list[list[int]]) -> list[Any]:
    return await asyncio.gather(*(coalescer.submit(c) for c in calls), return_exceptions=True)


def test_concurrent_callers_share_batches_and_get_their_own_answers() -> None:
    run = Recorder()
    calls = [[10 * k + j for j in range(k % 3 + 1)] for k in range(12)]
    with ThreadPoolExecutor(1) as pool:
        coalescer = Coalescer(run, executor=pool, window_s=0.05, max_batch=8)
        results = asyncio.run(gather(coalescer, calls))
    assert results == [[2 * i for i in c] for c in calls]
    assert sum(len(b) for b in run.batches) == sum(len(c) for c in calls)
    assert len(run.batches) < len(calls)  # shared
    assert all(len(b) <= 8 for b in run.batches)
    # a caller's items are never split between batches
    for c in calls:
        assert any(b[i : i + len(c)] == c for b in run.batches for i in range(len(b)))


def test_one_failing_request_fails_only_itself() -> None:
    run = Recorder()
    calls = [[1, 2], [3, -4], [5], [6, 7]]
    with ThreadPoolExecutor(1) as pool:
        coalescer = Coalescer(run, executor=pool, window_s=0.05, max_batch=16)
        results = asyncio.run(gather(coalescer, calls))
    assert results[0] == [2, 4] and results[2] == [10] and results[3] == [12, 14]
    assert isinstance(results[1], ValueError) and "-4" in str(results[1])
    assert run.batches[0] == [1, 2, 3, -4, 5, 6, 7]  # tried together first


def test_a_request_larger_than_max_batch_is_read_in_chunks_in_order() -> None:
    run = Recorder()
    with ThreadPoolExecutor(1) as pool:
        coalescer = Coalescer(run, executor=pool, window_s=0.0, max_batch=3)
        results = asyncio.run(gather(coalescer, [list(range(8))]))
    assert results == [[2 * i for i in range(8)]]
    assert [len(b) for b in run.batches] == [3, 3, 2]


def test_callers_arriving_during_a_batch_form_the_next_one() -> None:
    run = Recorder(delay_s=0.2)

    async def scenario(coalescer: Coalescer[int, int]) -> list[Any]:
        first = asyncio.ensure_future(coalescer.submit([1]))
        await asyncio.sleep(0.05)  # the first batch is running now
        later = [asyncio.ensure_future(coalescer.submit([k])) for k in range(2, 6)]
        return await asyncio.gather(first, *later)

    with ThreadPoolExecutor(1) as pool:
        results = asyncio.run(scenario(Coalescer(run, executor=pool, window_s=0.001, max_batch=8)))
    assert results == [[2], [4], [6], [8], [10]]
    assert run.batches == [[1], [2, 3, 4, 5]]


async def closed_loop(coalescer: Coalescer[int, int], callers: int, rounds: int) -> None:
    """``callers`` clients, each sending its next item once its last one is answered."""

    async def client(c: int) -> None:
        for r in range(rounds):
            assert await coalescer.submit([100 * c + r]) == [2 * (100 * c + r)]

    await asyncio.gather(*(client(c) for c in range(callers)))


def test_closed_loop_callers_are_not_kept_waiting_for_the_window() -> None:
    """8 clients under a max_batch of 64 and a 30 s window: after the first batch each batch
    waits for the 8 callers the last one answered, not for 64 items or the window (before: 30 s
    a batch, the old rule; bench/host_path.py measured the 2 ms default costing 2 ms a batch)."""
    run = Recorder(delay_s=0.01)

    async def scenario() -> None:
        coalescer = Coalescer(run, executor=pool, window_s=30.0, max_batch=64)
        await coalescer.submit([0])  # a lone caller's read starts at once
        await asyncio.wait_for(closed_loop(coalescer, callers=8, rounds=4), timeout=60)
        await coalescer.aclose()

    with ThreadPoolExecutor(1) as pool:
        asyncio.run(asyncio.wait_for(scenario(), timeout=90))
    # the first shared batch waited (8 items, unknown company: up to the window), the rest not
    assert [len(b) for b in run.batches] == [1, 8, 8, 8, 8]


def test_batches_grow_to_the_callers_there_are() -> None:
    """The expectation counts what waits as well as the last batch: 8 clients, then 8 more that
    arrive while the first batch reads, are read as batches of 16 from then on (a rule of "the
    last batch's size" alone would go on with alternating batches of 8)."""
    run = Recorder(delay_s=0.2)

    async def scenario() -> None:
        coalescer = Coalescer(run, executor=pool, window_s=0.05, max_batch=64)
        first = asyncio.ensure_future(closed_loop(coalescer, callers=8, rounds=4))
        await asyncio.sleep(0.1)  # the first batch (its window is 0.05 s) reads for 0.2 s now
        second = asyncio.ensure_future(closed_loop(coalescer, callers=8, rounds=4))
        await asyncio.wait_for(asyncio.gather(first, second), timeout=60)
        await coalescer.aclose()

    with ThreadPoolExecutor(1) as pool:
        asyncio.run(scenario())
    assert [len(b) for b in run.batches] == [8, 16, 16, 16, 8]


@pytest.mark.parametrize(("available", "want"), [
    (20, 16),  # 20 in a bucket of 32 cost 4 + 32 for 20 reads; 16 cost 4 + 16
    (31, 31),  # 31 in 32: better than 16 now and 15 later
    (32, 32), (16, 16), (1, 1),
    (10, 8),   # 10 pad to 16: 8 now, 2 wait
    (14, 14),  # 14 pad to 16: 14/20 beats 8/12
    (3, 3), (5, 4),
    (40, 40),  # past the largest bucket: unpadded, all of them
])
def test_bucket_take_reads_the_most_items_per_cost(available: int, want: int) -> None:
    from router.backends.torch.coalescer import bucket_take

    assert bucket_take(available, (1, 2, 4, 8, 16, 32), fixed_items=4.0) == want


def test_bucket_take_without_buckets_or_with_a_large_fixed_cost_takes_everything() -> None:
    from router.backends.torch.coalescer import bucket_take

    assert bucket_take(20, (), fixed_items=4.0) == 20  # reads not padded
    assert bucket_take(20, (1, 2, 4, 8, 16, 32), fixed_items=1000.0) == 20
    assert bucket_take(0, (1, 2), fixed_items=4.0) == 0


def by_tens(n: int) -> int:
    """The test's groups: 10-19 one question, 20-29 another, ..."""
    return n // 10


def test_a_batch_holds_one_group_the_oldest_requests_first() -> None:
    """Three questions' requests arrive together: each batch reads one question, in the order of
    their oldest requests, and a question's requests keep their order (before: one batch of all,
    which the reader reads as three reads back to back that every caller waits for)."""
    run = Recorder()
    calls = [[10], [20], [11], [30], [21], [12], [31, 32]]
    with ThreadPoolExecutor(1) as pool:
        coalescer = Coalescer(run, executor=pool, window_s=0.05, max_batch=8, group_of=by_tens)
        results = asyncio.run(gather(coalescer, calls))
    assert results == [[2 * i for i in c] for c in calls]
    assert run.batches == [[10, 11, 12], [20, 21], [30, 31, 32]]


def test_a_request_of_several_groups_is_a_group_of_its_own() -> None:
    run = Recorder()
    with ThreadPoolExecutor(1) as pool:
        coalescer = Coalescer(run, executor=pool, window_s=0.05, max_batch=8, group_of=by_tens)
        results = asyncio.run(gather(coalescer, [[10, 20], [11], [10, 21], [20, 10]]))
    assert results == [[20, 40], [22], [20, 42], [40, 20]]
    assert run.batches == [[10, 20, 10, 21], [11], [20, 10]]  # (1, 2) twice, then 1, then (2, 1)


def test_the_plan_leaves_the_newest_for_the_next_batch() -> None:
    """20 waiting items of one question under buckets of 16 and 32: 16 now (the oldest), 4 in the
    next batch, which nothing else delays."""
    run = Recorder()

    def plan(available: int) -> int:
        from router.backends.torch.coalescer import bucket_take

        return bucket_take(available, (1, 2, 4, 8, 16, 32), fixed_items=4.0)

    with ThreadPoolExecutor(1) as pool:
        coalescer = Coalescer(run, executor=pool, window_s=0.05, max_batch=32, group_of=by_tens,
                              plan=plan)
        results = asyncio.run(gather(coalescer, [[10 + k % 10] for k in range(20)]))
    assert results == [[2 * (10 + k % 10)] for k in range(20)]
    assert run.batches == [[10 + k % 10 for k in range(16)], [10 + k % 10 for k in range(16, 20)]]


def test_a_caller_that_leaves_while_its_question_waits_is_skipped() -> None:
    """A request waiting behind another question's batch whose caller goes away (a client that
    disconnects) is dropped when its turn comes; the others of its question are still read."""
    run = Recorder(delay_s=0.1)

    async def scenario() -> list[Any]:
        coalescer = Coalescer(run, executor=pool, window_s=0.01, max_batch=8, group_of=by_tens)
        first = asyncio.ensure_future(coalescer.submit([10]))
        await asyncio.sleep(0.05)  # question 1 reads now
        leaving = asyncio.ensure_future(coalescer.submit([20]))
        staying = asyncio.ensure_future(coalescer.submit([21]))
        await asyncio.sleep(0.01)
        leaving.cancel()
        results = await asyncio.gather(first, staying)
        await coalescer.aclose()
        return results

    with ThreadPoolExecutor(1) as pool:
        results = asyncio.run(asyncio.wait_for(scenario(), timeout=10))
    assert results == [[20], [42]] and run.batches == [[10], [21]]


def test_a_failing_plan_takes_everything_and_the_worker_goes_on(caplog: Any) -> None:
    run = Recorder()

    def broken(available: int) -> int:
        raise KeyError("plan bug")

    with ThreadPoolExecutor(1) as pool, caplog.at_level("ERROR"):
        coalescer = Coalescer(run, executor=pool, window_s=0.05, max_batch=8, group_of=by_tens,
                              plan=broken)
        results = asyncio.run(gather(coalescer, [[10], [11], [12]]))
    assert results == [[20], [22], [24]] and run.batches == [[10, 11, 12]]
    assert "the batch plan failed" in caplog.text


def test_bad_settings_are_refused() -> None:
    with ThreadPoolExecutor(1) as pool:
        with pytest.raises(ValueError, match="max_batch"):
            Coalescer(Recorder(), executor=pool, max_batch=0)
        with pytest.raises(ValueError, match="window_s"):
            Coalescer(Recorder(), executor=pool, window_s=-1)
        with pytest.raises(ValueError, match="plan needs group_of"):
            Coalescer(Recorder(), executor=pool, plan=lambda n: n)


# -- through TorchBackend ----------------------------------------------------------------------
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
    from router.backends.torch.diffusion import DiffusionSlotReader
    from router.backends.torch.options import TorchOptions

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
    from router.backends.torch.diffusion import DiffusionSlotReader
    from router.backends.torch.prompt import encode, encode_many

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


@pytest.mark.parametrize("by_question", [True, False])
def test_backend_batches_one_question_at_a_time(parts: tuple[Any, Any], by_question: bool) -> None:
    """Requests of two questions at once: by default each batch reads one question (the reader
    reads a question's items apart from another's), with the same answers as reads alone;
    ``coalesce_by_question: false`` keeps the old rule (one batch of both)."""
    from policies.types import DecisionRequest, Option
    from router.backends.torch.diffusion import DiffusionSlotReader

    other = [DecisionRequest("p", "Which queue?", (Option("billing"), Option("tech"), Option("sales")),
                             f"ticket {k}", seed=k) for k in range(3)]
    mixed = [r for pair in zip(requests(3), other) for r in pair]
    spy = Spy(DiffusionSlotReader(parts[0]))
    shared = backend(parts, spy, coalesce_window_ms=50, coalesce_by_question=by_question)
    alone = backend(parts, coalesce_window_ms=0)
    want = [asyncio.run(alone.read([r]))[0] for r in mixed]

    async def concurrently() -> list[Any]:
        return await asyncio.gather(*(shared.read([r]) for r in mixed))

    got = [scores[0] for scores in asyncio.run(concurrently())]
    for a, b in zip(got, want, strict=True):
        assert a.options == b.options
        np.testing.assert_allclose(a.proba, b.proba, rtol=1e-4, atol=1e-6)
    prefixes = [{item.prefix_ids for item in batch} for batch in spy.seen]
    if by_question:
        assert [len(p) for p in prefixes] == [1, 1] and prefixes[0] != prefixes[1]
        assert [len(batch) for batch in spy.seen] == [3, 3]
    else:
        assert [len(p) for p in prefixes] == [2] and len(spy.seen[0]) == 6


def test_backend_sizes_batches_by_the_readers_graph_buckets(parts: tuple[Any, Any]) -> None:
    """10 waiting reads of one question and graph buckets of 8 and 16 items: 8 now and 2 next
    (10 in a bucket of 16 cost 4 + 16 items' worth; 8 cost 4 + 8); no buckets: all 10."""
    from router.backends.torch.diffusion import DiffusionSlotReader
    from router.backends.torch.graphs import GraphShapes

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
    from router.backends.torch.prompt import encode

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
    from router.backends.torch.diffusion import DiffusionSlotReader
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

    from router.backends.torch import warm_up
    from router.backends.torch.choice import default_choice
    from router.backends.torch.diffusion import DiffusionSlotReader
    from router.backends.torch.graphs import GraphShapes

    eager = backend(parts)
    assert asyncio.run(eager.ready()) and eager.compiled is False  # CPU: nothing to warm up
    want = asyncio.run(eager.read(requests(3)))
    gate = threading.Event()
    original = warm_up.warm_up

    def slow_warm_up(reader: Any, sample: Any) -> Any:
        gate.wait(5)
        return original(reader, sample)

    model = parts[0]
    compiled = replace(default_choice(model), compiled=True, fuse_cats=True, compile_backend="aot_eager")
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
    with pytest.raises(ValidationError, match="coalesce_by_question"):
        TorchOptions(kind="diffusion", coalesce_by_question="sometimes")
