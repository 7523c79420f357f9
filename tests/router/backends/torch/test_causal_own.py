"""Read-level and layer-level choices of the one-pass read (choice.py, onepass.py):

- ``causal_own``: the prompt rests read their own keys by a causal kernel with no bias where
  that is exact (the window does not bind within a prompt rest; the kernel has a causal form);
- in batches of one canvas row an item, each row reads its prompt rest's keys where they lie and
  its own canvas unmasked, no per-row copy (more rows than items: per-row copies);
- ``joint_streams_items``: graph buckets of more than that many items project the two streams
  apart, the smaller ones together.

Each reads what transformers' two-pass read reads (the tiny DiffusionGemma on the CPU)."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from itertools import product
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from router.backends.torch.kernels.attention import (
    attend_causal_cudnn,
    attend_causal_math,
    causal_problem,
    fold_groups,
    no_causal_dims,
)
from router.backends.torch.model.choice import KernelChoice, build_layer_ops
from router.backends.torch.model.inputs import PrefixKV
from router.backends.torch.model.onepass import OnePass
from router.backends.torch.serve.diffusion import DiffusionSlotReader
from router.backends.torch.serve.graphs import GraphShapes
from router.backends.torch.serve.two_pass import TwoPassSlotReader
from router.errors import ConfigError
from tests.router.backends.torch.test_diffusion import PREFIX, tiny_model
from tests.router.backends.torch.test_fused import ITEMS, assert_same_reads

WIDTH = max(len(it.suffix_ids) for it in ITEMS)  # the eager batch's prompt-rest width


def grouped_causal(q: Any, k: Any, v: Any) -> tuple[Any, Any]:
    """torch's own SDPA, causal with grouped key heads, in fold_groups' layout: an independent
    reference for the layout ``attend_causal_*`` return."""
    n_kv = k.shape[1]
    out = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                           is_causal=True, enable_gqa=True, scale=1.0)
    scores = q.float() @ k.float().repeat_interleave(q.shape[1] // n_kv, 1).transpose(-1, -2)
    m = q.shape[2]
    scores = scores.masked_fill(torch.ones(m, m, dtype=torch.bool).triu(1), float("-inf"))
    return fold_groups(out, n_kv), fold_groups(torch.logsumexp(scores, -1)[..., None], n_kv)[..., 0]


def test_the_causal_reference_equals_torch_sdpa_with_grouped_heads() -> None:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn((3, 8, 12, 16), generator=gen) / 4
    k, v = (torch.randn((3, 2, 12, 16), generator=gen) for _ in range(2))
    out, lse = attend_causal_math(q, k, v)
    want_out, want_lse = grouped_causal(q, k, v)
    assert out.shape == (3, 2, 4 * 12, 16) and lse.shape == (3, 2, 4 * 12)
    torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, want_lse, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="cuDNN attention needs CUDA")
def test_cudnn_causal_equals_the_reference_on_cuda() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = (torch.randn((4, 16, 224, 256), generator=gen, device="cuda") / 16).bfloat16()
    k, v = (torch.randn((4, 8, 224, 256), generator=gen, device="cuda").bfloat16() for _ in range(2))
    out, lse = attend_causal_cudnn(q, k, v)
    want_out, want_lse = attend_causal_math(q, k, v)
    assert float((out.float() - want_out.float()).norm() / want_out.float().norm()) < 1e-2
    torch.testing.assert_close(lse, want_lse, rtol=1e-2, atol=1e-2)
    assert causal_problem(((256, "cudnn"),), torch.device("cuda"), torch.bfloat16) == ""


def test_causal_forms_are_checked_and_named() -> None:
    assert causal_problem(((16, "math"), (32, "math")), torch.device("cpu"), torch.float32) == ""
    problem = causal_problem(((16, "cudnn"),), torch.device("cpu"), torch.float32)
    assert problem.startswith("cudnn at head dim 16")
    # a kernel with no causal form keeps its prompt rests' dense bias
    assert no_causal_dims(((16, "efficient"), (32, "math"), (64, "efficient"))) == {16, 64}


@pytest.mark.parametrize("window", [64, 8], ids=["window>prompt", "window<prompt"])
def test_causal_own_reads_what_the_two_pass_read_reads(window: int) -> None:
    model = tiny_model(window=window)
    want = [TwoPassSlotReader(model).read([it])[0] for it in ITEMS]
    for cached in (True, False):
        for causal in (True, False):
            for joint in (True, False):
                choice = KernelChoice(causal_own=causal, joint_streams=joint)
                reader = DiffusionSlotReader(model, choice=choice, use_prefix_cache=cached)
                assert_same_reads(reader.read(ITEMS), want)
    onepass = DiffusionSlotReader(model).onepass
    assert onepass is not None
    # the sliding layers read causally only where the window holds a whole prompt rest
    assert onepass.causal_own("sliding_attention", WIDTH) is (WIDTH <= window)
    assert onepass.causal_own("full_attention", WIDTH)
    off = OnePass(model, build_layer_ops(KernelChoice(causal_own=False)))
    assert not off.causal_own("full_attention", WIDTH)


def test_the_causal_path_is_the_one_read() -> None:
    """Mutation check: a causal form that lets every query see every key of its prompt rest
    changes the read, so the equality above tests the causal path and not the bias."""
    model = tiny_model(window=64)
    want = [TwoPassSlotReader(model).read([it])[0] for it in ITEMS]

    def everything(q: Any, k: Any, v: Any) -> tuple[Any, Any]:
        from router.backends.torch.kernels.attention import attend_math

        return attend_math(fold_groups(q, k.shape[1]), k, v, None)

    ops = replace(build_layer_ops(KernelChoice()), attend_causal=everything)
    onepass = OnePass(model, ops)
    reader = DiffusionSlotReader(model, choice=KernelChoice())
    batch = reader.prepare_onepass(ITEMS, prefix_len=len(PREFIX), device=torch.device("cpu"))
    prefix = onepass.prefix_kv(reader.prefix_cache(PREFIX), len(PREFIX))
    masks = read_masks(onepass, prefix, batch)
    assert ("enc", "sliding_attention") not in masks and ("enc", "full_attention") not in masks
    with torch.inference_mode():
        got, _, _ = onepass(prefix, batch)
        right, _, _ = reader.onepass(prefix, batch)  # type: ignore[misc]
    with pytest.raises(AssertionError):  # outside the tolerance every equality here uses
        torch.testing.assert_close(got, right, rtol=1e-4, atol=1e-6)
    assert_same_reads(reader.read(ITEMS), want)


def read_masks(onepass: OnePass, prefix: PrefixKV, batch: Any) -> dict[tuple[str, str], Any]:
    """The masks ``onepass`` builds for a read of ``batch`` after ``prefix``."""
    return onepass.masks(prefix, batch, *onepass.positions(prefix, batch), torch.float32)


def test_joint_streams_items_joins_only_the_small_buckets() -> None:
    model = tiny_model(window=8)
    want = [TwoPassSlotReader(model).read([it])[0] for it in ITEMS]
    shapes = GraphShapes(batches=(1, 4), draws=(3,), widths=(16,), prefix_tokens=64, labels=6,
                         capture=False)
    reader = DiffusionSlotReader(model, choice=KernelChoice(joint_streams_items=1), graphs=shapes)
    assert reader.graphs is not None and reader.onepass is not None
    small, large = reader.graphs.onepass_for(1), reader.graphs.onepass_for(4)
    assert small is reader.onepass and small.joint_streams  # the eager read's: joint
    assert large is not small and not large.joint_streams and large.qkv_weights == ()
    assert large.model is small.model  # one model: only the layout of the rows differs
    reader.graphs.warm_up(PREFIX, ITEMS[0].canvas_ids, ITEMS[0].slot)
    assert_same_reads([reader.read([it])[0] for it in ITEMS], want)  # the 1-item bucket: joint
    assert_same_reads(reader.read(ITEMS), want)  # the 4-item bucket: apart
    # an eager read (no bucket holds it) of more items reads apart too
    assert reader.onepass_for(4) is large and reader.onepass_for(1) is small
    assert len({id(p) for p in reader.passes.values()}) == 2
    # the choices of the reads: equal where they read alike, so they share a OnePass
    choice = KernelChoice(joint_streams_items=4)
    plain = replace(choice, joint_streams_items=0)
    assert choice.for_read(1) == choice.for_read(2) == choice.for_read(4) == plain
    assert not choice.for_read(8).joint_streams


@pytest.mark.parametrize(("switches", "field"), [
    ({"joint_streams_items": -1}, "joint_streams_items"),
    ({"joint_streams_items": True}, "joint_streams_items"),
    ({"joint_streams_items": 2, "joint_streams": False}, "joint_streams_items"),
])
def test_bad_bucket_and_causal_switches_are_refused_naming_them(switches: dict[str, Any],
                                                                field: str) -> None:
    with pytest.raises(ConfigError, match=field) as info:
        KernelChoice(**switches)
    assert info.value.field == field


def test_the_default_choice_joins_small_buckets_and_reads_causally_where_it_can() -> None:
    from router.backends.torch.model.choice import JOINT_STREAMS_ITEMS, default_choice

    model = tiny_model(window=8)
    cpu = default_choice(model)
    assert cpu.causal_own and cpu.joint_streams and cpu.joint_streams_items == 0  # CPU: joint
    fast = partial(default_choice, model, fast_kernels=True)
    if torch.cuda.is_available():
        assert fast().joint_streams_items == JOINT_STREAMS_ITEMS


ONE_DRAW = [replace(it, draws=1) for it in ITEMS]  # one canvas row an item: rows read in place


@pytest.mark.parametrize("window", [64, 8], ids=["window>prompt", "window<prompt"])
def test_rows_in_place_and_copied_read_what_the_two_pass_read_reads(window: int) -> None:
    model = tiny_model(window=window)
    want = [TwoPassSlotReader(model).read([it])[0] for it in ONE_DRAW]
    want_mixed = [TwoPassSlotReader(model).read([it])[0] for it in ITEMS]
    for cached in (True, False):
        for causal, joint in product((True, False), repeat=2):
            choice = KernelChoice(causal_own=causal, joint_streams=joint)
            reader = DiffusionSlotReader(model, choice=choice, use_prefix_cache=cached)
            assert_same_reads(reader.read(ONE_DRAW), want)  # one row an item: in place
            assert_same_reads(reader.read(ITEMS), want_mixed)  # 5 rows, 3 items: the row copies


def test_the_in_place_path_is_the_one_read() -> None:
    """The one-draw batch takes the in-place path (its masks are the prompt rests' alone), a
    batch with more rows than items the copies; and a three-part merge that drops the prompt-rest
    part changes the read (mutation check)."""
    model = tiny_model(window=64)
    reader = DiffusionSlotReader(model, choice=KernelChoice())
    onepass = reader.onepass
    assert onepass is not None
    prefix = onepass.prefix_kv(reader.prefix_cache(PREFIX), len(PREFIX))
    for items, in_place in ((ONE_DRAW, True), (ITEMS, False)):
        batch = reader.prepare_onepass(items, prefix_len=len(PREFIX), device=torch.device("cpu"))
        assert onepass.in_place(batch) is in_place
        masks = read_masks(onepass, prefix, batch)
        assert (("dec_rest", "sliding_attention") in masks) is in_place
        assert (("dec", "sliding_attention") in masks) is not in_place
    batch = reader.prepare_onepass(ONE_DRAW, prefix_len=len(PREFIX), device=torch.device("cpu"))

    def canvas_only(out_r: Any, lse_r: Any, *canvas_and_prefix: Any) -> Any:
        from router.backends.torch.kernels.attention import merge_grouped

        return merge_grouped(*canvas_and_prefix)

    broken = OnePass(model, replace(build_layer_ops(KernelChoice()), merge3=canvas_only))
    with torch.inference_mode():
        got, _, _ = broken(prefix, batch)
        right, _, _ = onepass(prefix, batch)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(got, right, rtol=1e-4, atol=1e-6)


def test_buckets_of_one_row_an_item_take_only_one_draw_batches() -> None:
    model = tiny_model(window=8)
    want = [TwoPassSlotReader(model).read([it])[0] for it in ONE_DRAW]
    two_draws = [replace(ONE_DRAW[0], draws=2), ONE_DRAW[1]]  # 3 rows: fits 4 rows, not in place
    for draws, want_key in (((1,), None), ((1, 4), (4, 16, 16))):
        shapes = GraphShapes(batches=(4,), draws=draws, widths=(16,), prefix_tokens=64, labels=6,
                             capture=False)
        reader = DiffusionSlotReader(model, choice=KernelChoice(), graphs=shapes)
        assert reader.graphs is not None
        assert reader.graphs.bucket(ONE_DRAW, 11) == (4, 4, 16)
        assert reader.graphs.bucket(two_draws, 11) == want_key
    reader.graphs.warm_up(PREFIX, ITEMS[0].canvas_ids, ITEMS[0].slot)
    assert_same_reads(reader.read(ONE_DRAW), want)  # 3 items in the 4-item bucket: padded, in place

