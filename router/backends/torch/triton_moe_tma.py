"""triton_moe's two expert kernels in a Hopper form: the weights (and the down GEMM's rows) loaded
through tensor descriptors (TMA on sm90 and later), and persistent programs, one a multiprocessor,
each walking tiles. CUDA; on the CPU under Triton's interpreter, for the tests.

A CANDIDATE, NOT used by the read: bench.moe_kernels times it (rows "triton_fused_tma") against
triton_moe's kernels, and it goes into the read only if it pays there (issue 21: each change
measured on and off). Why it is a candidate: at 32 reads the pointer-load kernels run at 48% of
the H200's bf16 peak, and no tile of the seventh session's sweep (82 configurations) did better
than the pick by more than the chip's drift, so the limit is the loads (every weight element's
address computed and loaded by the warps), not the tiles. With a descriptor the copy engine
moves a whole tile into shared memory, and Triton pipelines descriptor loads across the
reduction loop; persistent programs leave no tail wave of blocks.

What stays as in triton_moe: the alignment (``align_pairs_triton``), the gate/up kernel's rows
gathered by pointer from ``hidden`` through the sorted pairs (a TMA gather is Blackwell's), the
tanh-form gelu and the product stored once, the down kernel's rows stored at their pairs' places,
the float32 combine over k (``combine_rows``). Weights of the activations' dtype only (no FP8).
Tiles come from ``triton_moe.pick_config``, as the shipped kernels'.
"""

from __future__ import annotations

from dataclasses import asdict

import torch
import triton
import triton.language as tl

from router.backends.torch.triton_moe import (
    MoeConfig,
    _tile,
    align_pairs_triton,
    moe_sizes,
    pick_config,
)

# Programs when not on CUDA (the interpreter): a few, so the tests walk several tiles a program
INTERPRETED_PROGRAMS = 3


@triton.jit  # type: ignore[untyped-decorator]  # (Triton ships no type hints)
def _gate_up_tma_kernel(  # type: ignore[no-untyped-def]  # (Triton reads the annotations: none)
        hidden, w_desc, sorted_pairs, block_expert, inter, n_pairs, n_blocks_m, n_experts,
        hidden_dim, inter_dim, n_programs, top_k: tl.constexpr, precision: tl.constexpr,
        even_k: tl.constexpr, block_m: tl.constexpr, block_n: tl.constexpr,
        block_k: tl.constexpr, group_m: tl.constexpr):
    n_blocks_n = tl.cdiv(inter_dim, block_n)
    for tile in range(tl.program_id(0), n_blocks_m * n_blocks_n, n_programs):
        pid_m, pid_n = _tile(tile, n_blocks_m, n_blocks_n, group_m)
        expert = tl.load(block_expert + pid_m)
        if expert < n_experts:  # else a block past the real ones
            rows = pid_m * block_m + tl.arange(0, block_m)
            pairs = tl.load(sorted_pairs + rows)
            real = pairs < n_pairs
            ks = tl.arange(0, block_k)
            a_at = hidden + (pairs // top_k)[:, None].to(tl.int64) * hidden_dim + ks[None, :]
            # the expert's gate rows, then its up rows (chunk(2) of one GEMM): columns past the
            # gate's last read the up rows' first (never stored); past the weights, zeros
            gate_row = expert * 2 * inter_dim + pid_n * block_n
            gate = tl.zeros((block_m, block_n), dtype=tl.float32)
            up = tl.zeros((block_m, block_n), dtype=tl.float32)
            for start in range(0, hidden_dim, block_k):
                if even_k:  # no reduction mask: full-width vector loads
                    a = tl.load(a_at, mask=real[:, None], other=0.0)
                else:
                    a = tl.load(a_at, mask=real[:, None] & (ks < hidden_dim - start)[None, :],
                                other=0.0)
                w_gate = w_desc.load([gate_row, start])  # (block_n, block_k); zeros past H
                w_up = w_desc.load([gate_row + inter_dim, start])
                gate = tl.dot(a, w_gate.T, gate, input_precision=precision)
                up = tl.dot(a, w_up.T, up, input_precision=precision)
                a_at += block_k
            # gelu's tanh form, as triton_moe's kernel computes it
            act = gate * tl.sigmoid(1.5957691216057308 * (gate + 0.044715 * gate * gate * gate))
            cols = pid_n * block_n + tl.arange(0, block_n)
            out_at = inter + rows[:, None].to(tl.int64) * inter_dim + cols[None, :]
            tl.store(out_at, (act * up).to(inter.dtype.element_ty), mask=(cols < inter_dim)[None, :])


@triton.jit  # type: ignore[untyped-decorator]
def _down_tma_kernel(  # type: ignore[no-untyped-def]
        a_desc, w_desc, sorted_pairs, block_expert, out, n_pairs, n_blocks_m, n_experts,
        hidden_dim, inter_dim, n_programs, precision: tl.constexpr, block_m: tl.constexpr,
        block_n: tl.constexpr, block_k: tl.constexpr, group_m: tl.constexpr):
    n_blocks_n = tl.cdiv(hidden_dim, block_n)
    for tile in range(tl.program_id(0), n_blocks_m * n_blocks_n, n_programs):
        pid_m, pid_n = _tile(tile, n_blocks_m, n_blocks_n, group_m)
        expert = tl.load(block_expert + pid_m)
        if expert < n_experts:
            acc = tl.zeros((block_m, block_n), dtype=tl.float32)
            w_row = expert * hidden_dim + pid_n * block_n
            for start in range(0, inter_dim, block_k):  # both loads zero past I
                a = a_desc.load([pid_m * block_m, start])  # the sorted rows: whole tiles
                b = w_desc.load([w_row, start])
                acc = tl.dot(a, b.T, acc, input_precision=precision)
            rows = pid_m * block_m + tl.arange(0, block_m)
            pairs = tl.load(sorted_pairs + rows)
            cols = pid_n * block_n + tl.arange(0, block_n)
            # each row goes to its pair's own place (token * top_k + j); padding rows nowhere
            out_at = out + pairs[:, None].to(tl.int64) * hidden_dim + cols[None, :]
            keep = (pairs < n_pairs)[:, None] & (cols < hidden_dim)[None, :]
            tl.store(out_at, acc.to(out.dtype.element_ty), mask=keep)


def programs_for(device: torch.device) -> int:
    """Persistent programs: one a multiprocessor on CUDA."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    return INTERPRETED_PROGRAMS


def fused_experts_tma(hidden: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                      top_k_index: torch.Tensor, top_k_weights: torch.Tensor, *,
                      config: MoeConfig | None = None, programs: int = 0) -> torch.Tensor:
    """What triton_moe.fused_experts returns for weights of ``hidden``'s dtype: (T, H), each
    token's ``sum_j weights[j] * down[e_j] @ (gelu(gate_j) * up_j)``. ``programs``: persistent
    programs (0: ``programs_for`` the device)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from router.backends.torch.triton_kernels import combine_rows

    if gate_up.dtype != hidden.dtype or down.dtype != hidden.dtype:
        raise ValueError(f"experts' weights are {gate_up.dtype}/{down.dtype}, hidden {hidden.dtype}: "
                         "the TMA kernels take weights of the activations' dtype (no FP8)")
    n_tokens, top_k, n_experts, hidden_dim, inter_dim, n_pairs = moe_sizes(down, top_k_index)
    if n_pairs == 0:
        return hidden.new_zeros((n_tokens, hidden_dim))
    config = config or pick_config(n_pairs, n_experts)
    programs = programs or programs_for(hidden.device)
    hidden = hidden.contiguous()
    sorted_pairs, block_expert = align_pairs_triton(top_k_index, n_experts, config.block_m)
    n_blocks_m = block_expert.shape[0]
    precision = "ieee" if hidden.dtype == torch.float32 else "tf32"
    gu, dn = config.gate_up, config.down
    # (E*2I, H) and (E*H, I): an expert's weight rows are a run of the descriptor's rows
    gate_up_rows = TensorDescriptor.from_tensor(gate_up.contiguous().view(-1, hidden_dim),
                                                [gu.block_n, gu.block_k])
    down_rows = TensorDescriptor.from_tensor(down.contiguous().view(-1, inter_dim),
                                             [dn.block_n, dn.block_k])
    inter = hidden.new_empty((sorted_pairs.shape[0], inter_dim))
    tiles = n_blocks_m * triton.cdiv(inter_dim, gu.block_n)
    _gate_up_tma_kernel[(min(tiles, programs),)](
        hidden, gate_up_rows, sorted_pairs, block_expert, inter, n_pairs, n_blocks_m, n_experts,
        hidden_dim, inter_dim, min(tiles, programs), top_k, precision,
        hidden_dim % gu.block_k == 0, block_m=config.block_m, **asdict(gu))
    inter_rows = TensorDescriptor.from_tensor(inter, [config.block_m, dn.block_k])
    out_rows = hidden.new_empty((n_pairs, hidden_dim))
    tiles = n_blocks_m * triton.cdiv(hidden_dim, dn.block_n)
    _down_tma_kernel[(min(tiles, programs),)](
        inter_rows, down_rows, sorted_pairs, block_expert, out_rows, n_pairs, n_blocks_m,
        n_experts, hidden_dim, inter_dim, min(tiles, programs), precision,
        block_m=config.block_m, **asdict(dn))
    place = torch.arange(n_pairs, device=hidden.device).view(n_tokens, top_k)
    return combine_rows(out_rows, place, top_k_weights)  # type: ignore[no-any-return]
