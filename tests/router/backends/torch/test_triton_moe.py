"""triton_moe's fused experts on the CPU, under Triton's interpreter: the alignment's invariants
exactly, and the kernels against moe.experts_forward (the row-copy path) and transformers' own
experts forward, at sizes that make every block shape meet padding, partial tiles and K loops."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from tests.router.backends.torch.interpreted import interpreted_imports

# triton_moe (and the triton_rows it uses) imported interpreted (interpreted.py); the variable
# is set again while this module's tests run (``_interpreter``)
with interpreted_imports():
    triton = pytest.importorskip("triton")
    from router.backends.torch.kernels import triton_moe, triton_rows
    from router.backends.torch.kernels.moe import experts_forward
    from router.backends.torch.kernels.triton_moe import LARGE_M, SMALL_M, MoeConfig, Tile

if not all(type(k).__name__ == "InterpretedFunction"
           for k in (triton_moe._down_kernel, triton_rows._combine_kernel)):
    pytest.skip("Triton's kernels were imported compiled earlier in this process (CUDA): these "
                "tests run them interpreted on the CPU", allow_module_level=True)

HIDDEN, INTER, EXPERTS, TOP_K = 80, 48, 8, 2
# Tiles far below the sizes, row blocks grouped two by two: several row, column and reduction
# blocks, either all whole (80 = 5 * 16, 48 = 3 * 16: the kernels' unmasked loads) or the last ones
# partial (80 = 2.5 * 32, 48 = 1.5 * 32: masked reductions, wrapped columns). small_m and large_m
# have one partial reduction block each, or several (large_m's 80 = 1.25 * 64).
MANY_EVEN = MoeConfig(16, gate_up=Tile(16, 16, 2, 4, 2), down=Tile(16, 16, 2, 4, 2))
MANY_RAGGED = MoeConfig(16, gate_up=Tile(32, 32, 2, 4, 2), down=Tile(32, 32, 2, 4, 2))
CONFIGS = {"small_m": SMALL_M, "large_m": LARGE_M, "many_even": MANY_EVEN, "many_ragged": MANY_RAGGED}


@pytest.fixture(scope="module", autouse=True)
def _interpreter() -> Iterator[None]:
    """TRITON_INTERPRET stays set while the kernels run (Triton imports parts of itself lazily, at
    the first launch, and those check it). And two bfloat16 faults of Triton 3.9's interpreter are
    mended, so that it computes what the GPU does: it holds bfloat16 as bit patterns (uint16) and
    its ``tl.dot`` multiplies those patterns as integers (float8 operands it converts first,
    bfloat16 not): convert them to float32, which is exact, as the tensor cores multiply them; and
    its float32 -> bfloat16 cast truncates, where the GPU's ``.to`` rounds to nearest even: round
    through torch. The kernels themselves run unchanged. (Its float8e4nv loads and their widening
    ``.to`` bfloat16 or float32 need no mending: all 254 finite e4m3 codes convert exactly.)"""
    import numpy as np
    from triton.runtime import interpreter

    bf16, f32 = triton.language.bfloat16, triton.language.float32
    dot, cast = interpreter.InterpreterBuilder.create_dot, interpreter.InterpreterBuilder.cast_impl

    def as_float32(x: Any) -> Any:
        if x.dtype.scalar != bf16:
            return x
        data = interpreter._convert_float(x.data, bf16, f32, None).view(np.float32)
        return interpreter.TensorHandle(data, f32)

    def create_dot(self: Any, a: Any, b: Any, *rest: Any) -> Any:
        return dot(self, as_float32(a), as_float32(b), *rest)

    def cast_impl(self: Any, src: Any, dst_type: Any) -> Any:
        if src.dtype.scalar != f32 or dst_type.scalar != bf16:
            return cast(self, src, dst_type)
        rounded = torch.from_numpy(np.ascontiguousarray(src.data)).bfloat16().view(torch.int16)
        return interpreter.TensorHandle(rounded.numpy().view(np.uint16), bf16)

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITON_INTERPRET", "1")
        patch.setattr(interpreter.InterpreterBuilder, "create_dot", create_dot)
        patch.setattr(interpreter.InterpreterBuilder, "cast_impl", cast_impl)
        yield


def experts_module(seed: int = 0) -> Any:
    """transformers' DiffusionGemma experts at small sizes, random weights of a sane scale."""
    from transformers.models.diffusion_gemma.modeling_diffusion_gemma import (
        DiffusionGemmaTextExperts,
    )

    config = SimpleNamespace(num_experts=EXPERTS, hidden_size=HIDDEN, moe_intermediate_size=INTER,
                             hidden_activation="gelu_pytorch_tanh", _experts_implementation="eager")
    experts = DiffusionGemmaTextExperts(config)  # type: ignore[arg-type]  # (the fields it reads)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        experts.gate_up_proj.copy_(torch.randn(experts.gate_up_proj.shape, generator=gen) * HIDDEN**-0.5)
        experts.down_proj.copy_(torch.randn(experts.down_proj.shape, generator=gen) * INTER**-0.5)
    return experts


def routing(n_tokens: int, kind: str, seed: int = 1) -> tuple[Any, Any, Any]:
    """Hidden rows, top-k expert indices and weights: ``random`` (distinct experts per token),
    ``two_experts`` (every token on experts 3 and 5: the others get no pair) or ``one_expert``
    (every pair on expert 6, both of a token's slots)."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn((n_tokens, HIDDEN), generator=gen)
    if kind == "random":
        index = torch.stack([torch.randperm(EXPERTS, generator=gen)[:TOP_K] for _ in range(n_tokens)])
    elif kind == "two_experts":
        index = torch.tensor([[3, 5], [5, 3]]).repeat(n_tokens, 1)[:n_tokens]
    else:
        index = torch.full((n_tokens, TOP_K), 6)
    weights = torch.rand((n_tokens, TOP_K), generator=gen).softmax(-1)
    return hidden, index.reshape(n_tokens, TOP_K), weights


def run_fused(experts: Any, hidden: Any, index: Any, weights: Any, config: MoeConfig | None,
              dtype: Any = torch.float32) -> Any:
    return triton_moe.fused_experts(hidden.to(dtype), experts.gate_up_proj.to(dtype),
                                    experts.down_proj.to(dtype), index, weights, config=config)


# the Triton aligner with its programs as shipped, and with programs of 16 pairs (several
# programs' atomic increments on one expert's counter even at these sizes)
ALIGNERS = {"torch": triton_moe.align_pairs, "triton": triton_moe.align_pairs_triton,
            "triton_16": partial(triton_moe.align_pairs_triton, pairs_a_program=16)}


KINDS = ("random", "two_experts", "one_expert")
TOKENS = (1, 5, 37)
# Every value of each of (tokens, routing kind, aligner, block size) meets every value of each
# other in at least one case: the nine rows of an orthogonal array of four three-level factors,
# block size's third level folded onto its first. The full product adds no pair.
ORTHOGONAL_9 = ((0, 0, 0, 0), (0, 1, 1, 1), (0, 2, 2, 2), (1, 0, 1, 2), (1, 1, 2, 0), (1, 2, 0, 1),
                (2, 0, 2, 1), (2, 1, 0, 2), (2, 2, 1, 0))
ALIGNMENT_CASES = [(TOKENS[t], KINDS[k], list(ALIGNERS)[a], (4, 16, 4)[b])
                   for t, k, a, b in ORTHOGONAL_9]


@pytest.mark.parametrize(("n_tokens", "kind", "aligner", "block_m"), ALIGNMENT_CASES)
def test_alignment_holds_every_pair_once_in_single_expert_blocks(n_tokens: int, kind: str,
                                                                 aligner: str, block_m: int) -> None:
    """Every aligner (``align_pairs``, the torch reference; ``align_pairs_triton``, what the fused
    kernels use, in one program or three kernels): every pair once, blocks of one expert in
    expert order, padding only past each expert's pairs and after the last; the torch one keeps
    pair order within an expert (the Triton ones place pairs in the order of their atomic
    increments)."""
    _, index, _ = routing(n_tokens, kind)
    n_pairs = index.numel()
    sorted_pairs, block_expert = ALIGNERS[aligner](index, EXPERTS, block_m)
    n_blocks = -(-(n_pairs + EXPERTS * (block_m - 1)) // block_m)
    assert sorted_pairs.shape == (n_blocks * block_m,) and block_expert.shape == (n_blocks,)
    real = sorted_pairs != n_pairs  # the sentinel, and nothing else, marks padding
    assert bool(((sorted_pairs >= 0) & (sorted_pairs <= n_pairs)).all())
    assert torch.equal(sorted_pairs[real].sort().values, torch.arange(n_pairs))
    experts_of = index.reshape(-1)
    blocks = sorted_pairs.view(n_blocks, block_m)
    used = block_expert < EXPERTS  # the others: the skip mark, EXPERTS itself
    n_used = int(used.sum())
    assert bool(used[:n_used].all()) and bool((block_expert[n_used:] == EXPERTS).all())
    assert not bool((blocks[~used] != n_pairs).any())
    for b in range(n_used):
        pairs = blocks[b][blocks[b] != n_pairs]
        assert pairs.numel() > 0  # no block of padding alone before the tail
        assert bool((experts_of[pairs] == block_expert[b]).all())
        if aligner == "torch":
            assert bool((pairs[1:] > pairs[:-1]).all())  # each expert's pairs in pair order
    counts = torch.bincount(experts_of, minlength=EXPERTS)
    blocks_per_expert = torch.bincount(block_expert[used].long(), minlength=EXPERTS)
    assert torch.equal(blocks_per_expert, -(-counts // block_m))
    assert bool((block_expert[used][1:] >= block_expert[used][:-1]).all())  # by expert


@pytest.mark.parametrize("aligner", ["triton", "triton_16"])
@pytest.mark.parametrize("block_m", [32, 128])
def test_triton_alignment_equals_the_torch_one_at_the_real_sizes(block_m: int, aligner: str) -> None:
    """264 tokens (one read) on 8 of 128 experts: the same block labels, and each expert's blocks
    hold the same pairs (the fused kernels' rows do not depend on their order within an expert)."""
    gen = torch.Generator().manual_seed(7)
    index = torch.stack([torch.randperm(128, generator=gen)[:8] for _ in range(264)])
    want = triton_moe.align_pairs(index, 128, block_m)
    got = ALIGNERS[aligner](index, 128, block_m)
    assert torch.equal(got.block_expert, want.block_expert)
    assert got.sorted_pairs.shape == want.sorted_pairs.shape
    for expert in range(128):
        rows = (want.block_expert == expert).nonzero().flatten()
        of = [x.view(-1, block_m)[rows].flatten() for x in (got.sorted_pairs, want.sorted_pairs)]
        assert torch.equal(of[0].sort().values, of[1].sort().values)


# Every config with every routing kind; the token counts cycle so that each config and each kind
# also meets every token count.
FUSED_CASES = [(config, kind, TOKENS[(c + k) % len(TOKENS)])
               for c, config in enumerate(CONFIGS) for k, kind in enumerate(KINDS)]


@pytest.mark.parametrize(("config", "kind", "n_tokens"), FUSED_CASES)
def test_float32_fused_experts_equal_the_row_copy_experts(config: str, kind: str,
                                                          n_tokens: int) -> None:
    # Both multiply in float32 (the row-copy path through its bmm fallback, the kernels with
    # ieee dots) and sum over k in the same order: only the GEMMs' summation order differs.
    experts = experts_module()
    hidden, index, weights = routing(n_tokens, kind)
    with torch.inference_mode():
        want = experts_forward(experts, hidden, index, weights)
        got = run_fused(experts, hidden, index, weights, CONFIGS[config])
    assert got.dtype == torch.float32 and got.shape == (n_tokens, HIDDEN)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n_tokens", [5, 37])
def test_fused_experts_equal_transformers_experts(n_tokens: int) -> None:
    # transformers loops over experts and index_adds: another summation order over k, in float32
    experts = experts_module(seed=3)
    hidden, index, weights = routing(n_tokens, "random", seed=4)
    with torch.inference_mode():
        torch.testing.assert_close(run_fused(experts, hidden, index, weights, None),
                                   experts(hidden, index, weights), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("config", ["small_m", "many_ragged"])
@pytest.mark.parametrize("n_tokens", [5, 37])
def test_bfloat16_fused_experts_match_the_row_copy_experts(n_tokens: int, config: str) -> None:
    # Same bf16 inputs to both. The row-copy path rounds gate and up to bf16, then gelu, then their
    # product (three roundings of 2^-9 relative each); the kernel rounds gelu(gate) * up once. Both
    # round each expert's output row and the final sum: outputs (up to ~2.4 here, where a bf16
    # step is 2^-7 to 2^-6) may differ by a few steps, not more. The float32 product of the same
    # bf16 inputs is the fixed point: the kernel must be about as close to it as the row-copy path
    # (measured: 0.0086 against the path's 0.013 at 37 tokens, 0.0064 against 0.0063 at 5).
    experts = experts_module(seed=5)
    hidden, index, weights = routing(n_tokens, "random", seed=6)
    bf16 = torch.bfloat16
    with torch.inference_mode():
        got = run_fused(experts, hidden, index, weights, CONFIGS[config], dtype=bf16)
        peer_experts = SimpleNamespace(num_experts=EXPERTS, gate_up_proj=experts.gate_up_proj.to(bf16),
                                       down_proj=experts.down_proj.to(bf16), act_fn=experts.act_fn)
        peer = experts_forward(peer_experts, hidden.to(bf16), index, weights)
        exact_experts = SimpleNamespace(num_experts=EXPERTS, act_fn=experts.act_fn,
                                        gate_up_proj=peer_experts.gate_up_proj.float(),
                                        down_proj=peer_experts.down_proj.float())
        exact = experts_forward(exact_experts, hidden.to(bf16).float(), index, weights)
    assert got.dtype == bf16
    torch.testing.assert_close(got.float(), peer.float(), rtol=2e-2, atol=2e-2)
    got_error = (got.float() - exact).abs().max()
    assert got_error <= max(1.5 * float((peer.float() - exact).abs().max()), 4e-3)


def test_custom_op_is_fused_experts_and_its_fake_has_the_output_shape() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    experts = experts_module()
    hidden, index, weights = routing(5, "random")
    args = (hidden, experts.gate_up_proj.detach(), experts.down_proj.detach(), index, weights)
    with torch.inference_mode():
        assert torch.equal(torch.ops.slotgate.fused_moe(*args), triton_moe.fused_experts(*args))
    with FakeTensorMode() as mode:
        fake = torch.ops.slotgate.fused_moe(*(mode.from_tensor(a) for a in args))
    assert fake.shape == (5, HIDDEN) and fake.dtype == hidden.dtype


def test_no_tokens_give_an_empty_output_and_mixed_dtypes_are_refused() -> None:
    experts = experts_module()
    hidden, index, weights = routing(5, "random")
    empty = run_fused(experts, hidden[:0], index[:0], weights[:0], None)
    assert empty.shape == (0, HIDDEN)
    with pytest.raises(ValueError, match="bfloat16"):
        triton_moe.fused_experts(hidden, experts.gate_up_proj.bfloat16(), experts.down_proj, index,
                                 weights)


def test_pick_config_by_pairs_per_expert() -> None:
    assert triton_moe.pick_config(264 * 8, 128) == SMALL_M  # one read: ~16 pairs an expert
    assert triton_moe.pick_config(8448 * 8, 128) == LARGE_M  # 32 reads: ~528
    assert triton_moe.pick_config(64 * 128, 128) == triton_moe.MID_M
    for config in (SMALL_M, triton_moe.MID_M, LARGE_M):  # tl.dot tiles: powers of two, >= 16
        for size in (config.block_m, config.gate_up.block_n, config.gate_up.block_k,
                     config.down.block_n, config.down.block_k):
            assert size >= 16 and size & (size - 1) == 0


def test_the_start_up_check_of_the_row_kernels_passes_on_kernels_that_agree() -> None:
    """row_ops.triton_problem's own check (``_disagreement``) run here on the CPU, under the
    interpreter: it must find no problem with kernels that agree with their references. Why: it
    runs only on CUDA at start-up, and a fault in the check itself (a wrongly shaped input) would
    turn every Triton row kernel off with only a warning in the log."""
    from router.backends.torch.kernels.row_ops import _disagreement

    assert _disagreement(triton_rows, torch.device("cpu")) == ""


def test_the_three_part_merge_kernel_equals_its_torch_reference() -> None:
    """triton_rows.merge_groups with a third part (a canvas's prompt rest read in place, its
    own canvas, the prefix: OnePass.canvas_own) against attention.merge_grouped3, from
    strided grouped views as the read gives them, float32; and with two parts against
    merge_grouped (the kernel serves both)."""
    from router.backends.torch.kernels.attention import merge_grouped, merge_grouped3

    gen = torch.Generator().manual_seed(0)
    outs = [torch.randn((3, 5, 2, 4, 16), generator=gen).permute(0, 2, 3, 1, 4) for _ in range(3)]
    lses = [torch.randn((5, 3, 2, 4), generator=gen).permute(1, 2, 3, 0) * 3 for _ in range(3)]
    got = triton_rows.merge_groups(outs[0], lses[0], outs[1], lses[1], outs[2], lses[2])
    want = merge_grouped3(outs[0], lses[0], outs[1], lses[1], outs[2], lses[2])
    assert got.shape == want.shape == (3, 5, 2 * 4 * 16)  # (B, M, Hk*G*D)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    got = triton_rows.merge_groups(outs[0], lses[0], outs[1], lses[1])
    torch.testing.assert_close(got, merge_grouped(outs[0], lses[0], outs[1], lses[1]),
                               rtol=1e-5, atol=1e-5)
