"""The one-pass read with shared-prefix attention (fused.py, prefix_attention.py), its bucketed
static-buffer runner (graphs.py, uncaptured on the CPU) and its compiled pieces (compiled.py):
each equals transformers' two-pass DynamicCache read of the same items, one at a time."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from router.backends.torch.diffusion import DiffusionSlotReader, SlotItem
from router.backends.torch.graphs import GraphSet
from router.backends.torch.prefix_attention import (
    attend_math,
    fold_groups,
    merge,
    to_bias,
    unfold_groups,
)
from tests.router.backends.torch.test_diffusion import CANVAS_IDS, PREFIX, item, tiny_model

ITEMS = [item((70, 71, 72), draws=3), item(tuple(range(80, 91)), seed=4, labels=(100, 101)),
         item((90,), seed=5)]


@pytest.fixture(scope="module", params=[64, 8], ids=["window>prompt", "window<prompt"])
def model(request: Any) -> Any:
    # A window of 8 under a 40-token prefix exercises the sliding layers' limits in both parts.
    return tiny_model(window=request.param)


def assert_same_reads(got: list[Any], want: list[Any]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.draws, b.draws, rtol=1e-4, atol=1e-6)
        assert a.entropy_nats == pytest.approx(b.entropy_nats, rel=1e-4)
        assert a.label_mass == pytest.approx(b.label_mass, rel=1e-4)


@pytest.mark.parametrize("cached", [True, False])
def test_one_pass_batch_equals_two_pass_reads_one_at_a_time(model: Any, cached: bool) -> None:
    one = DiffusionSlotReader(model, use_prefix_cache=cached)
    assert one.onepass is not None
    two = DiffusionSlotReader(model, use_prefix_cache=cached, fused_pass=False)
    # different prompt lengths: the batch is right-padded, the two-pass reads are not
    assert_same_reads(one.read(ITEMS), [two.read([it])[0] for it in ITEMS])


def test_merged_two_part_attention_equals_one_softmax_over_all_keys() -> None:
    gen = torch.Generator().manual_seed(0)
    batch, heads, kv_heads, m, n_a, n_b, dim = 3, 4, 2, 5, 7, 6, 8
    q = torch.randn((batch, heads, m, dim), generator=gen)
    keys = torch.randn((batch, kv_heads, n_a + n_b, dim), generator=gen)
    values = torch.randn((batch, kv_heads, n_a + n_b, dim), generator=gen)
    visible = torch.rand((batch, m, n_a + n_b), generator=gen) > 0.4
    visible[0, 0, :n_a] = False  # a query that sees nothing in part a
    visible[:, :, n_a] = True  # every query sees something
    groups = heads // kv_heads
    rep = keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1)
    want = torch.nn.functional.scaled_dot_product_attention(
        q, *rep, attn_mask=visible[:, None], scale=1.0)
    parts = []
    for sl in (slice(0, n_a), slice(n_a, None)):
        out, lse = attend_math(fold_groups(q, kv_heads), keys[:, :, sl], values[:, :, sl],
                               to_bias(visible[..., sl], groups, q.dtype))
        parts.append((unfold_groups(out, heads), unfold_groups(lse, heads)))
    got = merge(parts[0][0], parts[0][1], parts[1][0], parts[1][1])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def graph_set(reader: DiffusionSlotReader, **shapes: Any) -> GraphSet:
    kwargs: dict[str, Any] = {"batches": (1, 4), "draws": (1, 3), "widths": (4, 16),
                              "prefix_tokens": 64, "labels": 6, **shapes}
    graphs = GraphSet(reader, capture=False, **kwargs)
    graphs.warm_up(tuple(range(200, 212)), CANVAS_IDS, 5)
    return graphs


def test_bucket_padded_static_reads_equal_the_eager_read(model: Any) -> None:
    eager = DiffusionSlotReader(model)
    want = eager.read(ITEMS)
    bucketed = DiffusionSlotReader(model)
    bucketed.graphs = graph_set(bucketed)
    assert bucketed.graphs.bucket(ITEMS, 11) == (4, 12, 16)  # 5 rows: 4 items x 3 draws
    seen: list[Any] = []
    run = bucketed.graphs.run
    bucketed.graphs.run = lambda *a: seen.append(run(*a)) or seen[-1]  # type: ignore[method-assign]
    assert_same_reads(bucketed.read(ITEMS), want)
    # another prefix is loaded into the static buffer, then the first one again
    other = [SlotItem(tuple(range(300, 325)), it.suffix_ids, it.canvas_ids, it.slot, it.label_ids,
                      it.draws, it.seed) for it in ITEMS]
    assert_same_reads(bucketed.read(other), eager.read(other))
    assert_same_reads(bucketed.read(ITEMS[:1]), want[:1])
    assert len(seen) == 3 and all(out is not None for out in seen)


def test_reads_no_bucket_holds_run_eagerly(model: Any) -> None:
    reader = DiffusionSlotReader(model)
    reader.graphs = graph_set(reader, widths=(2,), prefix_tokens=16)
    long_prefix = ITEMS  # 40 prefix tokens > 16: does not fit the static buffer
    assert reader.graphs.run(long_prefix, PREFIX, reader.prefix_cache(PREFIX)) is None
    assert reader.graphs.bucket(ITEMS, 11) is None  # 11 tokens > the widest bucket
    assert_same_reads(reader.read(ITEMS), DiffusionSlotReader(model).read(ITEMS))


def test_compiled_pieces_equal_the_eager_pieces(model: Any) -> None:
    from router.backends.torch.compiled import compile_pieces, reset_pieces

    reader = DiffusionSlotReader(model)
    assert reader.onepass is not None
    want = reader.read(ITEMS)
    # aot_eager traces the same graphs inductor compiles, without a C++ build on the CPU
    compile_pieces(reader.onepass, backend="aot_eager")
    try:
        assert_same_reads(reader.read(ITEMS), want)
    finally:
        reset_pieces(reader.onepass)
