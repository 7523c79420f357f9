"""Several questions in one pass (read_inputs.PrefixGroups, ``mixed_prefixes``): a batch whose
items follow different prefixes reads what each item reads alone, in one pass, each query reading
only its own prefix; and the opt-in's wiring through TorchOptions and TorchBackend."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from router.backends.torch.choice import TWO_PASS, KernelChoice
from router.backends.torch.diffusion import DiffusionSlotReader
from router.backends.torch.fused import OnePass
from router.backends.torch.graphs import GraphShapes
from router.backends.torch.read_inputs import PrefixGroups, PrefixKV
from router.errors import ConfigError
from tests.router.backends.torch.test_diffusion import CANVAS_IDS, LABELS, PREFIX, tiny_model
from tests.router.backends.torch.test_fused import assert_same_reads

SHORT = tuple(range(200, 212))  # 12 tokens: within every window the tests use
LONG = tuple(range(300, 361))  # 61 tokens: past a window of 8 and near one of 64


def mixed_items(draws: int = 1) -> list[Any]:
    """Items of three prefixes of different lengths, interleaved as requests arrive; some
    prompt rests longer than a window of 8, one item with other labels."""
    from router.backends.torch.reader import SlotItem

    rests = [(70, 71, 72), tuple(range(80, 91)), (90,), (91, 92, 93, 94, 95), tuple(range(100, 110))]
    prefixes = [LONG, PREFIX, SHORT, LONG, PREFIX, SHORT, PREFIX]
    return [SlotItem(prefix, rests[k % len(rests)], CANVAS_IDS, 5,
                     (100, 101) if k == 3 else LABELS, draws if k % 2 == 0 else 1, seed=k)
            for k, prefix in enumerate(prefixes)]


@pytest.fixture(scope="module", params=[64, 8], ids=["window>prompt", "window<prompt"])
def model(request: Any) -> Any:
    return tiny_model(window=request.param, layers=("sliding_attention", "full_attention",
                                                    "sliding_attention"))


class CountingPass:
    """Counts the one-pass reads a reader runs, and the prefix groups each one read."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.groups: list[int] = []
        real = OnePass.__call__

        def counting(onepass: OnePass, prefix: Any, batch: Any) -> Any:
            self.groups.append(len(prefix.prefixes) if isinstance(prefix, PrefixGroups) else 1)
            return real(onepass, prefix, batch)

        monkeypatch.setattr(OnePass, "__call__", counting)


CHOICES = [KernelChoice(), KernelChoice(trim_last=False), KernelChoice(band=frozenset({"full_attention"})),
           KernelChoice(band=frozenset({"sliding_attention", "full_attention"}), joint_streams=False),
           KernelChoice(rows_in_place=False, causal_own=False), KernelChoice(prefix_splits=4)]


@pytest.mark.parametrize("choice", CHOICES, ids=lambda c: "-".join(
    f"{k}={v}" for k, v in c.summary().items() if v != KernelChoice().summary()[k]) or "default")
@pytest.mark.parametrize("draws", [1, 3])
def test_a_batch_of_several_prefixes_reads_what_each_item_reads_alone_in_one_pass(
        model: Any, choice: KernelChoice, draws: int, monkeypatch: pytest.MonkeyPatch) -> None:
    items = mixed_items(draws)
    want = [DiffusionSlotReader(model, choice=TWO_PASS).read([it])[0] for it in items]
    reader = DiffusionSlotReader(model, choice=choice, mixed_prefixes=True)
    passes = CountingPass(monkeypatch)
    assert_same_reads(reader.read(items), want)  # in the order asked, not the order read
    assert passes.groups == [3]  # one pass over the three prefixes


def test_without_the_opt_in_each_prefix_is_a_read_of_its_own(model: Any,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    items = mixed_items()
    passes = CountingPass(monkeypatch)
    alone = DiffusionSlotReader(model).read(items)
    assert passes.groups == [1, 1, 1]
    assert_same_reads(DiffusionSlotReader(model, mixed_prefixes=True).read(items), alone)


def test_each_item_reads_after_its_own_prefix(model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutation checks: items placed after the first group's prefix, or groups reading each
    other's prefixes, change the read (so the equality above tests both)."""
    items = mixed_items()
    want = DiffusionSlotReader(model).read(items)
    reader = DiffusionSlotReader(model, mixed_prefixes=True)
    real_starts = PrefixGroups.starts

    def first_prefix_only(groups: PrefixGroups) -> Any:
        return groups.prefixes[0].length.reshape(1).expand(groups.items[-1])

    monkeypatch.setattr(PrefixGroups, "starts", first_prefix_only)
    with pytest.raises(AssertionError):
        assert_same_reads(reader.read(items), want)
    monkeypatch.setattr(PrefixGroups, "starts", real_starts)

    real_post_init = PrefixGroups.__post_init__

    def first_read_by_all(groups: PrefixGroups) -> None:  # every group reads the first prefix
        real_post_init(groups)
        object.__setattr__(groups, "true_prefixes", groups.prefixes)
        object.__setattr__(groups, "prefixes", (groups.prefixes[0],) * len(groups.prefixes))

    def true_starts(groups: PrefixGroups) -> Any:  # positions still after each item's prefix
        prefixes = groups.true_prefixes  # type: ignore[attr-defined]
        return torch.cat([prefix.length.reshape(1).expand(b - a) for prefix, a, b in zip(
            prefixes, groups.items, groups.items[1:], strict=False)])

    monkeypatch.setattr(PrefixGroups, "__post_init__", first_read_by_all)
    monkeypatch.setattr(PrefixGroups, "starts", true_starts)
    with pytest.raises(AssertionError):
        assert_same_reads(reader.read(items), want)


def test_bucketed_readers_read_one_prefix_from_their_buckets_and_several_eagerly(model: Any) -> None:
    shapes = GraphShapes(batches=(1, 2, 4, 8), draws=(1,), widths=(16,), prefix_tokens=64,
                         labels=8, capture=False)
    reader = DiffusionSlotReader(model, graphs=shapes, mixed_prefixes=True)
    assert reader.graphs is not None
    reader.graphs.warm_up(PREFIX, CANVAS_IDS, 5)
    items = mixed_items()
    want = DiffusionSlotReader(model).read(items)
    assert_same_reads(reader.read(items), want)
    one = [it for it in items if it.prefix_ids == PREFIX]
    assert_same_reads(reader.read(one), [w for w, it in zip(want, items, strict=True)
                                         if it.prefix_ids == PREFIX])
    assert reader.graphs.loaded == PREFIX  # the one-prefix read went through a bucket


def test_prefix_groups_refuse_bounds_that_do_not_cover_each_group() -> None:
    kv = PrefixKV([], [], {}, torch.tensor(3))
    for items, rows in (((0, 2), (0, 2, 3)), ((0, 2, 2), (0, 1, 2)), ((1, 2, 3), (0, 1, 2)),
                        ((0, 3, 2), (0, 1, 2))):
        with pytest.raises(ValueError, match="rising bounds"):
            PrefixGroups((kv, kv), items, rows)
    with pytest.raises(ValueError, match="rising bounds"):
        PrefixGroups((), (0,), (0,))
    groups = PrefixGroups((kv, replace(kv, length=torch.tensor(5))), (0, 2, 3), (0, 4, 5))
    assert groups.starts().tolist() == [3, 3, 5]
    assert [(s.start, s.stop, r.start, r.stop) for _, s, r in groups.spans()] == [(0, 2, 0, 4),
                                                                                 (2, 3, 4, 5)]


def test_the_opt_in_needs_the_one_pass_read_and_a_diffusion_reader() -> None:
    from pydantic import ValidationError

    from router.backends.torch.options import TorchOptions

    with pytest.raises(ConfigError, match="mixed_question_reads") as refused:
        DiffusionSlotReader(tiny_model(), choice=TWO_PASS, mixed_prefixes=True)
    assert refused.value.field == "mixed_question_reads"
    for kind in ("causal", "masked"):
        with pytest.raises(ValidationError, match="mixed_question_reads"):
            TorchOptions(kind=kind, mixed_question_reads=True)
    assert TorchOptions(kind="diffusion").mixed_question_reads is False
    assert TorchOptions(kind="diffusion", mixed_question_reads=True).mixed_question_reads is True


def test_a_rebuilt_twin_keeps_reading_several_prefixes_in_one_pass() -> None:
    model = tiny_model(window=8)
    reader = DiffusionSlotReader(model, mixed_prefixes=True)
    assert reader.rebuilt(KernelChoice(trim_last=False)).mixed_prefixes is True
    assert DiffusionSlotReader(model).rebuilt(KernelChoice()).mixed_prefixes is False


def test_the_backend_reads_two_questions_in_one_batch_with_the_answers_of_reads_alone() -> None:
    """Through TorchBackend: with ``mixed_question_reads`` the coalescer takes both questions
    into one batch (one canvas width) and the reader reads it in one pass; the answers equal
    reads alone. make_reader hands the option to the reader."""
    from policies.types import DecisionRequest, Option
    from router.backends.torch.backend import make_reader
    from router.backends.torch.options import TorchOptions
    from tests.router.backends.torch.test_backend_batching import Spy, backend, requests
    from tests.router.backends.torch.test_diffusion import tiny_model as make_model
    from tests.router.backends.torch_models import smollm2_tokenizer

    tokenizer = smollm2_tokenizer()
    parts = (make_model(vocab=len(tokenizer), window=4096), tokenizer)
    other = [DecisionRequest("p", "Which queue?", (Option("billing"), Option("tech"), Option("sales")),
                             f"ticket {k}", seed=k) for k in range(3)]
    mixed = [r for pair in zip(requests(3), other, strict=True) for r in pair]
    reader = make_reader(TorchOptions(kind="diffusion", mixed_question_reads=True), parts[0], tokenizer)
    assert isinstance(reader, DiffusionSlotReader) and reader.mixed_prefixes
    spy = Spy(reader)
    shared = backend(parts, spy, coalesce_window_ms=50, mixed_question_reads=True)
    alone = backend(parts, coalesce_window_ms=0)
    want = [asyncio.run(alone.read([r]))[0] for r in mixed]

    async def concurrently() -> list[Any]:
        return await asyncio.gather(*(shared.read([r]) for r in mixed))

    got = [scores[0] for scores in asyncio.run(concurrently())]
    for a, b in zip(got, want, strict=True):
        assert a.options == b.options
        np.testing.assert_allclose(a.proba, b.proba, rtol=1e-4, atol=1e-6)
    assert [len({item.prefix_ids for item in batch}) for batch in spy.seen] == [2]
