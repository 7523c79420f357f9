"""Several questions in one pass (read_inputs.PrefixGroups, ``mixed_prefixes``): a batch whose
items follow different prefixes reads what each item reads alone, in one pass, each query reading
only its own prefix; and the opt-in's wiring through TorchOptions and TorchBackend."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

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
    prompt rests longer than a window of 8, one item with other labels, one question's canvas
    another template of the same width with its slot elsewhere."""
    from router.backends.torch.reader import SlotItem

    rests = [(70, 71, 72), tuple(range(80, 91)), (90,), (91, 92, 93, 94, 95), tuple(range(100, 110))]
    prefixes = [LONG, PREFIX, SHORT, LONG, PREFIX, SHORT, PREFIX]
    other_canvas = (8, 8, 9) + CANVAS_IDS[3:]  # (SHORT's question)
    return [SlotItem(prefix, rests[k % len(rests)], other_canvas if prefix == SHORT else CANVAS_IDS,
                     2 if prefix == SHORT else 5, (100, 101) if k == 3 else LABELS,
                     draws if k % 2 == 0 else 1, seed=k)
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


def mixed_bucketed(model: Any, groups: int = 3) -> DiffusionSlotReader:
    shapes = GraphShapes(batches=(1, 2, 4, 8, 16), draws=(1,), widths=(16,), prefix_tokens=64,
                         labels=8, capture=False, mixed_groups=groups)
    reader = DiffusionSlotReader(model, graphs=shapes, mixed_prefixes=True)
    assert reader.graphs is not None
    reader.graphs.warm_up(PREFIX, CANVAS_IDS, 5)
    return reader


class Loads:
    """The prefix copies a GraphSet makes into its static buffers: (prefix length, buffer)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from router.backends.torch.graphs import GraphSet

        self.copies: list[tuple[int, int]] = []
        real = GraphSet.load

        def load(graphs: GraphSet, prefix_ids: Any, cache: Any, buffer: int = 0) -> bool:
            if graphs.held[buffer] != prefix_ids:
                self.copies.append((len(prefix_ids), buffer))
            return real(graphs, prefix_ids, cache, buffer)

        monkeypatch.setattr(GraphSet, "load", load)


def test_a_mixed_bucket_reads_several_prefixes_from_its_static_buffers(
        model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three prefixes in a bucket of 3 groups of 4 (padded: fillers in every group): the same
    reads as reads alone, each prefix copied into a buffer once; the same questions again, in
    another order, copy nothing (a buffer that holds a prefix keeps serving it)."""
    reader = mixed_bucketed(model)
    assert reader.graphs is not None
    assert sorted(reader.graphs.mixed) == [(2, 1, 16), (2, 2, 16), (2, 4, 16), (2, 8, 16),
                                           (3, 1, 16), (3, 2, 16), (3, 4, 16)]
    items = mixed_items()
    want = DiffusionSlotReader(model).read(items)
    loads, passes = Loads(monkeypatch), CountingPass(monkeypatch)
    assert_same_reads(reader.read(items), want)
    assert passes.groups == [3]  # the bucket's read over its 3 static buffers
    assert sorted(loads.copies) == [(len(SHORT), 2), (len(LONG), 1)]  # PREFIX is held (warm-up)
    assert set(reader.graphs.held) == {PREFIX, SHORT, LONG}
    again = list(reversed(items))
    assert_same_reads(reader.read(again), list(reversed(want)))
    assert len(loads.copies) == 2 and passes.groups == [3, 3]


def test_two_questions_read_from_a_bucket_of_two_groups_leaving_the_first_buffer_alone(
        model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Four buffers: two questions are read by a bucket of 2 groups (not 4 with two of fillers),
    over the last two buffers, so the one-question buckets' buffer keeps its prefix; three
    questions then read by a bucket of 4 groups, the two held prefixes copied again nowhere."""
    reader = mixed_bucketed(model, groups=4)
    assert reader.graphs is not None
    assert reader.graphs.shapes.mixed_counts() == (2, 4)
    items = mixed_items()
    want = DiffusionSlotReader(model).read(items)
    two = [(it, w) for it, w in zip(items, want, strict=True) if it.prefix_ids != LONG]
    loads, passes = Loads(monkeypatch), CountingPass(monkeypatch)
    reader.graphs.held = [PREFIX, None, None, None]  # buffer 0 holds the warm-up's question
    assert_same_reads(reader.read([it for it, _ in two]), [w for _, w in two])
    assert passes.groups == [2]  # one pass of a bucket of 2 groups
    assert sorted(loads.copies) == [(len(SHORT), 3), (len(PREFIX), 2)]
    assert reader.graphs.held == [PREFIX, None, PREFIX, SHORT]
    assert_same_reads(reader.read(items[:6]), want[:6])  # 2 + 2 + 2 in 4 groups of 2 (12 for 18)
    assert passes.groups == [2, 4] and len(loads.copies) == 3  # LONG only, into buffer 1
    assert reader.graphs.held == [PREFIX, LONG, PREFIX, SHORT]


@pytest.mark.parametrize("case", ["more prefixes than buffers", "a group past the largest",
                                  "several draws", "padding that costs more than it saves"])
def test_a_mixed_read_no_bucket_holds_is_read_one_prefix_at_a_time(
        model: Any, case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where no mixed bucket holds a batch, or the one that does would read more padding than
    one bucket a question costs, each question is read as without the opt-in (a bucket's graph
    where one holds it: on a GPU an eager pass is slower than a replay)."""
    from router.backends.torch.graphs import GraphSet

    # 2 buffers: buckets of 2 groups of up to 8 items; 3: of 3 groups of up to 4 too
    reader = mixed_bucketed(model, groups=2 if case.startswith(("more", "a group")) else 3)
    items = mixed_items(draws=3 if case == "several draws" else 1)  # 3 runs, the longest 3
    if case == "a group past the largest":
        items = [replace(it, prefix_ids=PREFIX if k < 9 else SHORT, seed=k)
                 for k, it in enumerate(items + items[:3])]
    elif case.startswith("padding"):  # 2 groups of 8 (20 items' worth) for runs of 8 and 1 (12 + 5)
        items = [replace(it, prefix_ids=PREFIX if k < 8 else SHORT, seed=k)
                 for k, it in enumerate(items + items[:2])]
    runs = {it.prefix_ids: sum(i.prefix_ids == it.prefix_ids for i in items) for it in items}
    want = DiffusionSlotReader(model).read(items)
    replays: list[Any] = []
    real = GraphSet.run_mixed

    def run_mixed(graphs: GraphSet, asked: Any) -> Any:
        replays.append(out := real(graphs, asked))
        return out

    monkeypatch.setattr(GraphSet, "run_mixed", run_mixed)
    passes = CountingPass(monkeypatch)
    assert_same_reads(reader.read(items), want)
    assert replays == [None]  # asked, refused
    assert passes.groups == [1] * len(runs)  # then one read a question


def test_mixed_buckets_are_checked_and_counted_and_asked_for_by_the_opt_in() -> None:
    from router.backends.torch.build import MAX_LABELS
    from router.backends.torch.options import TorchOptions

    for bad in (1, -2):
        with pytest.raises(ConfigError, match="mixed_groups") as refused:
            GraphShapes(mixed_groups=bad)
        assert refused.value.field == "graph_mixed_groups"
    shapes = GraphShapes(batches=(1, 2, 4, 8, 16, 32), widths=(64, 128), mixed_groups=4)
    # buckets of 2 and of 4 groups, each group up to what fits in the largest batch
    assert shapes.mixed_counts() == (2, 4)
    assert shapes.mixed_buckets() == ((2, 1), (2, 2), (4, 1), (2, 4), (4, 2), (2, 8), (4, 4),
                                      (2, 16), (4, 8))  # by padded size, then fewer groups
    assert shapes.count() == (6 + 9) * 2
    assert GraphShapes().mixed_counts() == () == GraphShapes().mixed_buckets()
    assert [replace(shapes, mixed_groups=n).mixed_counts() for n in (2, 3, 5, 8)] == [
        (2,), (2, 3), (2, 4, 5), (2, 4, 8)]
    # a read of b items costs about 4 + b: 4 questions of 8 read as 36 in one bucket, 48 apart
    assert shapes.mixed_pays((4, 8), [8, 8, 8, 8]) and shapes.mixed_pays((4, 4), [3, 1, 4])
    assert not shapes.mixed_pays((4, 8), [8, 8])  # 36 against 24: apart
    assert shapes.mixed_pays((2, 8), [8, 8])  # 20 against 24: two groups
    assert not replace(shapes, fixed_cost_items=0).mixed_pays((4, 8), [8, 7, 8, 8])  # 32 against 32
    # the cheapest bucket that holds the runs, where it pays
    assert shapes.mixed_bucket([8, 8]) == (2, 8)
    assert shapes.mixed_bucket([16, 9]) == (2, 16)
    assert shapes.mixed_bucket([3, 1, 4]) == (4, 4)  # three questions: four groups
    assert shapes.mixed_bucket([1, 1]) == (2, 1)
    assert shapes.mixed_bucket([8]) is None  # one question: its own bucket
    assert shapes.mixed_bucket([1] * 5) is None  # more questions than buffers
    assert shapes.mixed_bucket([17, 1]) is None  # a group past 16
    assert shapes.mixed_bucket([16, 1]) is None  # 36 against 20 + 5: apart
    on = TorchOptions(kind="diffusion", mixed_question_reads=True, graph_mixed_groups=3)
    assert GraphShapes.from_options(on, capture=False, labels=MAX_LABELS).mixed_groups == 3
    off = GraphShapes.from_options(TorchOptions(kind="diffusion"), capture=False, labels=MAX_LABELS)
    assert off.mixed_groups == 0 and off.labels == MAX_LABELS


@pytest.mark.parametrize(("counts", "want"), [
    ([10, 7, 9, 6], [8, 7, 8, 6]),  # groups of 8: 29 items for 36 items' worth
    ([20], [16]),  # one question: its bucket_take
    ([16, 16], [16, 16]),  # two groups of 16: 32 for 36, against 16 for 20 alone
    ([14, 12], [8, 8]),  # two groups of 8: 16 for 20, against 26 for 36 in groups of 16
    ([16, 16, 16], [16, 16, 0]),  # two groups of 16 (32 for 36); four of 8: 24 for 36
    ([3, 1, 4], [2, 1, 2]),  # four groups of 2: 5 for 12, against 8 for 20 (4s) and 3 for 8 alone
    ([4, 4, 4], [4, 4, 0]),  # two groups of 4: 8 for 12, against 12 for 20 in four
    ([1, 1, 1, 1, 1], [1, 1, 1, 1, 0]),  # four groups at most
])
def test_a_batch_of_several_questions_takes_what_one_mixed_bucket_reads_best(
        counts: list[int], want: list[int]) -> None:
    shapes = GraphShapes(batches=(1, 2, 4, 8, 16, 32), mixed_groups=4, capture=False)
    assert shapes.mixed_take(counts) == want


def test_mixed_buckets_compile_nothing_the_one_question_buckets_did_not() -> None:
    """The compiled pieces (dynamic shapes) serve mixed buckets whose item counts no one-question
    bucket has (3 groups: 6 and 12 items) without compiling again: no compile stalls a read in
    serving, and no piece nears dynamo's recompile limit (past it a piece runs uncompiled)."""
    from torch._dynamo.utils import counters

    from router.backends.torch.choice import default_choice

    torch._dynamo.reset()  # no compiled entries of other tests (nor their recompile counts)
    model = tiny_model(window=8, layers=("sliding_attention", "full_attention", "sliding_attention"))
    choice = replace(default_choice(model), compiled=True, fuse_cats=True, compile_backend="aot_eager")
    shapes = GraphShapes(batches=(1, 2, 4, 8, 16), draws=(1,), widths=(16,), prefix_tokens=64,
                         labels=8, capture=False, mixed_groups=3)
    reader = DiffusionSlotReader(model, choice=choice, graphs=shapes, mixed_prefixes=True)
    assert reader.graphs is not None
    reader.graphs.warm_up(PREFIX, CANVAS_IDS, 5)
    items = mixed_items()
    want = DiffusionSlotReader(model).read(items)
    start = counters["stats"]["unique_graphs"]
    one = [k for k, item in enumerate(items) if item.prefix_ids == PREFIX]
    for n in (1, 2, 3):  # one-question buckets of 1, 2 and 4 items
        assert_same_reads(reader.read([items[k] for k in one[:n]]), [want[k] for k in one[:n]])
    compiled = counters["stats"]["unique_graphs"]
    assert compiled > start  # the pieces were compiled (not run eagerly past a limit)
    used = []
    real = reader.graphs.run_mixed

    def run_mixed(runs: Any) -> Any:
        used.append(reader.graphs.shapes.mixed_bucket([len(run) for _, run, _ in runs]))  # type: ignore[union-attr]
        return real(runs)

    reader.graphs.run_mixed = run_mixed  # type: ignore[method-assign]
    for k in (2, 6, 7):  # runs 1+1, 2+2+2 and 2+3+2
        assert_same_reads(reader.read(items[:k]), want[:k])
    assert used == [(2, 1), (3, 2), (3, 4)]  # 2, 6 and 12 items
    assert counters["stats"]["unique_graphs"] == compiled
