"""split_kv: the shared prefix's attention in key chunks run as one call's batch, merged by
log-sum-exp. The chunked attention against the whole one (a chunk some queries do not see
included), the cases read whole, the start-up check, the Triton chunk merge under Triton's
interpreter, the choice's switches, and whole reads of the tiny DiffusionGemma with the prefix
split against transformers' two-pass read."""

from __future__ import annotations

from dataclasses import replace
from itertools import product
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from tests.router.backends.torch.interpreted import interpreted_imports

# triton_rows imported interpreted (interpreted.py); test_triton_moe's fixture (imported:
# autouse here too) keeps the interpreter set while the tests run.
with interpreted_imports():
    pytest.importorskip("triton")
    from router.backends.torch.kernels import attention, split_kv, triton_rows
    from router.backends.torch.kernels.attention import attend_math, to_bias
    from router.backends.torch.kernels.row_ops import TORCH_OPS, TRITON_OPS
    from router.backends.torch.kernels.split_kv import attend_split, merge_chunks, split_problem
    from router.backends.torch.model.choice import KernelChoice, build_layer_ops
    from router.backends.torch.serve.diffusion import DiffusionSlotReader
    from router.errors import ConfigError
    from tests.router.backends.torch.test_choice import BANDS, LONG, SHAPES, two_pass_reads
    from tests.router.backends.torch.test_diffusion import PREFIX, tiny_model
    from tests.router.backends.torch.test_fused import ITEMS, assert_same_reads
    from tests.router.backends.torch.test_triton_moe import _interpreter  # noqa: F401

CPU = torch.device("cpu")


def problem(n_keys: int, dim: int = 32, seed: int = 0) -> tuple[Any, Any, Any, Any]:
    """Folded queries (1, 2, 48, D) over a batch-of-one key set, under a bias that hides the
    first 16 keys from the first half of the queries (a whole chunk at 16 keys a chunk)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn((1, 2, 48, dim), generator=gen) / dim**0.5
    k, v = (torch.randn((1, 2, n_keys, dim), generator=gen) for _ in range(2))
    visible = torch.rand((1, 24, n_keys), generator=gen) > 0.3
    visible[:, :12, :16] = False
    return q, k, v, to_bias(visible, 2, torch.float32)


@pytest.mark.parametrize("splits", [2, 4, 8])
@pytest.mark.parametrize("masked", [True, False], ids=["bias", "no_mask"])
def test_the_chunked_read_equals_the_whole_read(splits: int, masked: bool) -> None:
    q, k, v, bias = problem(64)
    bias = bias if masked else None
    calls: list[tuple[int, ...]] = []

    def attend(q: Any, k: Any, v: Any, bias: Any) -> tuple[Any, Any]:
        calls.append(tuple(k.shape))
        return attend_math(q, k, v, bias)

    out, lse = attend_split(q, k, v, bias, attend=attend, splits=splits)
    want_out, want_lse = attend_math(q, k, v, bias)
    assert calls == [(splits, 2, 64 // splits, 32)]  # one call, the chunks its batch
    assert out.shape == want_out.shape and lse.shape == want_lse.shape
    torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, want_lse, rtol=1e-5, atol=1e-5)


def test_the_chunks_are_views_and_hold_their_positions() -> None:
    k = torch.arange(2 * 12 * 3, dtype=torch.float32).view(1, 2, 12, 3)
    chunks = split_kv.chunked(k, 4)
    assert chunks.shape == (4, 2, 3, 3) and chunks.data_ptr() == k.data_ptr()
    for s in range(4):
        assert torch.equal(chunks[s], k[0, :, 3 * s: 3 * s + 3])


def test_uneven_key_sets_cut_into_fewer_equal_chunks_and_prime_ones_batches_are_read_whole() -> None:
    """1,023 filled sliding slots (an eager read's) cut into 3 chunks of 341, the 1,024 of a
    graph bucket's buffer into 4; 60 keys asked for 8 chunks into 6 of 10."""
    assert [split_kv.chunk_count(n, 4) for n in (1024, 1023, 1021, 8, 7)] == [4, 3, 1, 4, 1]
    calls: list[Any] = []

    def attend(q: Any, k: Any, v: Any, bias: Any) -> tuple[Any, Any]:
        calls.append((q, k, bias))
        return attend_math(q, k, v, bias)

    q, k, v, bias = problem(60)
    out, lse = attend_split(q, k, v, bias, attend=attend, splits=8)
    assert [tuple(c[1].shape) for c in calls] == [(6, 2, 10, 32)]
    want_out, want_lse = attend_math(q, k, v, bias)
    torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, want_lse, rtol=1e-5, atol=1e-5)
    q, k, v, bias = problem(61)
    for splits, query in ((8, q), (1, q), (4, q.expand(2, -1, -1, -1))):  # prime; 1; a batch of 2
        calls.clear()
        attend_split(query, k, v, bias, attend=attend, splits=splits)
        assert len(calls) == 1 and calls[0][0] is query and calls[0][1] is k and calls[0][2] is bias


def test_split_attend_reads_in_chunks_at_every_head_dim() -> None:
    seen: list[tuple[int, ...]] = []

    def attend(q: Any, k: Any, v: Any, mask: Any) -> tuple[Any, Any]:
        seen.append(tuple(k.shape))
        return attend_math(q, k, v, mask)

    prefix_attend = split_kv.split_attend(attend, 4, merge_chunks)
    for dim in (16, 32):
        q, k, v, bias = problem(64, dim=dim)
        prefix_attend(q, k, v, bias)
    assert seen == [(4, 2, 16, 16), (4, 2, 16, 32)]


def test_the_start_up_check_passes_agreeing_kernels_and_names_the_failing_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """split_problem on the CPU: the reference kernel passes; a kernel that refuses the chunks'
    stride-0 query (as a fused kernel might) and one that reads a chunk's bias wrongly are named,
    with why. Memoised, so each case clears it."""
    names = ((32, "math"),)
    split_problem.cache_clear()
    assert split_problem(names, 4, CPU, torch.float32) == ""

    def refuses(q: Any, k: Any, v: Any, bias: Any) -> tuple[Any, Any]:
        if 0 in q.stride():
            raise RuntimeError("query strides not supported")
        return attend_math(q, k, v, bias)

    def drops_bias(q: Any, k: Any, v: Any, bias: Any) -> tuple[Any, Any]:
        return attend_math(q, k, v, None if q.shape[0] > 1 else bias)

    for kernel, why in ((refuses, "unavailable (RuntimeError: query strides"), (drops_bias, "disagrees")):
        monkeypatch.setitem(attention.KERNEL_BY_NAME, "cudnn", kernel)
        split_problem.cache_clear()
        got = split_problem(((32, "cudnn"),), 4, CPU, torch.float32)
        assert got.startswith("cudnn at head dim 32: ") and why in got
    split_problem.cache_clear()


@pytest.mark.parametrize("splits", [2, 4, 5])
def test_the_chunk_merge_kernel_equals_its_torch_reference(splits: int) -> None:
    """triton_rows.merge_chunks from strided chunks (S, Hk, M, D) and log-sum-exps, one chunk
    unseen by some queries (its log-sum-exp -1e30: weight 0), against split_kv.merge_chunks;
    and the Triton row ops' chunk merge is this kernel (the torch ops' the reference)."""
    gen = torch.Generator().manual_seed(splits)
    out = torch.randn((5, splits, 3, 64), generator=gen).permute(1, 2, 0, 3)  # (S, Hk, M, D)
    lse = torch.randn((5, splits, 3), generator=gen).permute(1, 2, 0) * 3
    lse[0, :, :2] = -1.0e30
    got_out, got_lse = triton_rows.merge_chunks(out, lse)
    want_out, want_lse = merge_chunks(out, lse)
    assert got_out.shape == (1, 3, 5, 64) and got_lse.shape == (1, 3, 5)
    torch.testing.assert_close(got_out, want_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_lse, want_lse, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(TRITON_OPS.merge_chunks(out, lse)[0], want_out, rtol=1e-5, atol=1e-5)
    assert TORCH_OPS.merge_chunks(out, lse)[0].equal(want_out)


def test_the_switches_are_checked_naming_them_and_limit_reads_by_item_count() -> None:
    for switches, field in (({"prefix_splits": 0}, "prefix_splits"),
                            ({"prefix_splits": True}, "prefix_splits"),
                            ({"split_kv_items": -1}, "split_kv_items"),
                            ({"split_kv_items": 1}, "split_kv_items")):  # limits a split that is off
        with pytest.raises(ConfigError, match=field) as info:
            KernelChoice(**switches)
        assert info.value.field == field
    choice = KernelChoice(prefix_splits=4, split_kv_items=2, joint_streams_items=4)
    assert [choice.for_read(n).prefix_splits for n in (1, 2, 3, 8)] == [4, 4, 1, 1]
    assert choice.for_read(1).split_kv_items == 0 and choice.read_thresholds() == (1, 3, 5)
    assert KernelChoice(prefix_splits=4).for_read(32).prefix_splits == 4  # no limit
    assert build_layer_ops(KernelChoice()).attend_prefix is None
    assert build_layer_ops(KernelChoice(prefix_splits=4)).attend_prefix is not None
    assert KernelChoice(prefix_splits=4, split_kv_items=1).summary()["prefix_splits"] == 4


@pytest.fixture(scope="module")
def model() -> Any:
    # A window of 9 under a 40-token prefix: 8 sliding key slots, which cut into 2 and 4 chunks
    # (as the full model's 1,024 do), and the global layer's prefix keys cut too.
    return tiny_model(window=9)


@pytest.fixture(scope="module")
def want(model: Any) -> list[Any]:
    return two_pass_reads(model)


@pytest.fixture
def splits_seen(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(head dim, chunks) of every prefix read that was cut into chunks."""
    seen: list[tuple[int, int]] = []
    whole = split_kv.attend_split

    def spy(q: Any, k: Any, v: Any, bias: Any, **kw: Any) -> tuple[Any, Any]:
        chunks = split_kv.chunk_count(k.shape[2], kw["splits"])
        if q.shape[0] == 1 and chunks > 1:
            seen.append((q.shape[-1], chunks))
        return whole(q, k, v, bias, **kw)

    monkeypatch.setattr(split_kv, "attend_split", spy)
    return seen


CASES = [KernelChoice(band=band, merge_op=merge, joint_streams=joint, prefix_splits=splits)
         for band, merge, joint, splits in product(BANDS, (False, True), (True, False), (2, 4))]


@pytest.mark.parametrize("choice", CASES, ids=lambda c: "-".join(
    [f"s{c.prefix_splits}", "+".join(sorted(k[:1] for k in c.band)) or "dense",
     "merge" if c.merge_op else "", "joint" if c.joint_streams else "apart"]))
def test_reads_with_the_prefix_in_chunks_read_what_the_two_pass_read_reads(
        model: Any, want: list[Any], splits_seen: list[tuple[int, int]], choice: KernelChoice) -> None:
    """Bucketed (padded buffers) and eager; the layers that read their prefix under a bias (not a
    band) read it in chunks: a read where none did would pass vacuously."""
    reader = DiffusionSlotReader(model, choice=choice, graphs=SHAPES)
    assert reader.graphs is not None
    reader.graphs.warm_up(PREFIX, ITEMS[0].canvas_ids, ITEMS[0].slot)
    splits_seen.clear()
    assert_same_reads(reader.read(ITEMS), want[: len(ITEMS)])
    assert_same_reads(reader.read([LONG]), want[len(ITEMS):])
    kinds = {"sliding_attention": 16, "full_attention": 32}
    dims = {kinds[k] for k in kinds if k not in choice.band}
    assert {dim for dim, _ in splits_seen} == dims
    assert all(1 < n <= choice.prefix_splits for _, n in splits_seen)


def test_single_reads_read_chunks_and_larger_ones_whole_and_every_eager_read_has_its_pass(
        model: Any, want: list[Any], splits_seen: list[tuple[int, int]]) -> None:
    """split_kv_items=1 beside joint_streams_items=2: a read of one item reads its prefix in
    chunks, a read of two whole and joint, of three whole and apart, each by its own OnePass
    (reads of two items had none before read_thresholds: a KeyError)."""
    choice = KernelChoice(prefix_splits=4, split_kv_items=1, joint_streams_items=2)
    reader = DiffusionSlotReader(model, choice=choice)
    assert len(reader.passes) == 3
    for n in (1, 2, 3):
        splits_seen.clear()
        assert_same_reads(reader.read(ITEMS[:n]), want[:n])
        assert bool(splits_seen) == (n == 1)
    assert replace(choice, split_kv_items=0).for_read(3).prefix_splits == 4
