"""The experts of a DiffusionGemma layer with the token permutation done as two row copies.

transformers' ``grouped_mm`` experts sort the (token, expert) pairs by expert, gather the tokens'
rows into that order, run two grouped GEMMs, and bring the rows back with an inverse-permutation
gather, a float32 weighting and a sum over the top-k. Compiled, inductor turns the gather and the
weighted sum into two kernels that run far below the copy bandwidth the ~0.4 GB each touches
allows (bench.gpu_read's profile block lists them).

Here the two copies are ops of their own (row_ops.py: ``slotgate::moe_gather``,
``slotgate::moe_combine``, or their Triton twins, as the reader's choice says), opaque to the compiler: each row is one contiguous copy, and the
combine reads a token's top-k rows and sums them weighted in float32 in one pass (no float32
(S, hidden) intermediate); on CUDA they run as Triton kernels (triton_rows.py).
The arithmetic is transformers' (sum of float32 products over k in order, rounded once).
"""

from __future__ import annotations

from typing import Any

import torch

from router.backends.torch.kernels.row_ops import TORCH_OPS, RowOps


def grouped_mm(rows: Any, weight: Any, offsets: Any) -> Any:
    """rows (S, in) @ weight (E, out, in)^T per expert group (``offsets``: each group's end).
    torch's grouped GEMM takes bfloat16 only when compiled; other dtypes (the CPU tests' float32)
    multiply each row by its own expert's weight (slow, exact)."""
    if rows.dtype != torch.bfloat16:
        expert = torch.searchsorted(offsets, torch.arange(rows.shape[0], device=rows.device),
                                    right=True).clamp(max=weight.shape[0] - 1)
        return torch.bmm(weight.index_select(0, expert), rows[:, :, None])[:, :, 0]
    if hasattr(torch.nn.functional, "grouped_mm"):
        return torch.nn.functional.grouped_mm(rows, weight.transpose(-2, -1), offs=offsets)
    return torch._grouped_mm(rows, weight.transpose(-2, -1), offs=offsets)




def expert_counts(expert_ids: Any, n_experts: int) -> Any:
    """How many of ``expert_ids`` go to each of ``n_experts`` experts, without waiting for the
    device: histc, not bincount (bincount syncs with the host, so no CUDA graph could hold it);
    CPU histc wants floats."""
    ids = expert_ids.float() if expert_ids.device.type == "cpu" else expert_ids.int()
    return torch.histc(ids, bins=n_experts, min=0, max=n_experts - 1)


def experts_forward(experts: Any, hidden: Any, top_k_index: Any, top_k_weights: Any,
                    ops: RowOps = TORCH_OPS) -> Any:
    """What ``experts(hidden, top_k_index, top_k_weights)`` returns for transformers' gated
    ``grouped_mm`` experts (DiffusionGemma's: no biases, no expert parallelism); the row copies
    are ``ops``' gather and combine."""
    gate_up, down = experts.gate_up_proj, experts.down_proj
    n_tokens, top_k = top_k_index.shape
    expert_ids, order = torch.sort(top_k_index.reshape(-1))
    counts = expert_counts(expert_ids, experts.num_experts)
    offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
    sorted_rows = ops.gather(hidden, order, top_k)
    gate, up = grouped_mm(sorted_rows, gate_up, offsets).chunk(2, dim=-1)
    out_rows = grouped_mm(experts.act_fn(gate) * up, down, offsets)
    place = torch.empty_like(order)
    place[order] = torch.arange(order.shape[0], device=order.device)
    return ops.combine(out_rows, place.view(n_tokens, top_k), top_k_weights)

