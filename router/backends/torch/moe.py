"""The experts of a DiffusionGemma layer with the token permutation done as two row copies.

transformers' ``grouped_mm`` experts sort the (token, expert) pairs by expert, gather the tokens'
rows into that order, run two grouped GEMMs, and bring the rows back with an inverse-permutation
gather, a float32 weighting and a sum over the top-k. Compiled, inductor turns the gather and the
weighted sum into two kernels that took ~0.7 ms each per layer at a batch of 8,448 tokens on an
H200 (41 ms of a 230 ms batch), where moving the ~0.4 GB each touches takes ~0.1 ms.

Here the two copies are ops of their own (``slotgate::moe_gather``, ``slotgate::moe_combine``),
opaque to the compiler: each row is one contiguous copy, and the combine reads a token's top-k rows
and sums them weighted in float32 in one pass (no float32 (S, hidden) intermediate). The torch
versions below are the reference and serve every device; on CUDA, ``use_triton_rows()`` swaps in
two small Triton kernels (moe_triton.py) where Triton is present. The arithmetic is the same as
transformers' (sum of float32 products over k in order, rounded once).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

log = logging.getLogger(__name__)

_TRITON: dict[str, Any] = {}  # "gather"/"combine" -> CUDA implementations, once installed


@torch.library.custom_op("slotgate::moe_gather", mutates_args=())
def moe_gather(rows: torch.Tensor, order: torch.Tensor, top_k: int) -> torch.Tensor:
    """(S, H): row i is ``rows[order[i] // top_k]`` (the token of sorted pair i)."""
    impl = _TRITON.get("gather") if rows.is_cuda else None
    if impl is not None:
        return impl(rows, order, top_k)  # type: ignore[no-any-return]
    return rows.index_select(0, order // top_k)


@moe_gather.register_fake
def _(rows: torch.Tensor, order: torch.Tensor, top_k: int) -> torch.Tensor:
    return rows.new_empty((order.shape[0], rows.shape[1]))


@torch.library.custom_op("slotgate::moe_combine", mutates_args=())
def moe_combine(out_rows: torch.Tensor, place: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """(T, H): token t's ``sum_k weights[t, k] * out_rows[place[t, k]]``, summed in float32 and
    rounded once to ``out_rows``' dtype (``place``: where pair (t, k) sits in sorted order)."""
    impl = _TRITON.get("combine") if out_rows.is_cuda else None
    if impl is not None:
        return impl(out_rows, place, weights)  # type: ignore[no-any-return]
    picked = out_rows.index_select(0, place.reshape(-1)).view(*place.shape, -1)
    return (picked.float() * weights.float()[..., None]).sum(dim=1).to(out_rows.dtype)


@moe_combine.register_fake
def _(out_rows: torch.Tensor, place: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    return out_rows.new_empty((place.shape[0], out_rows.shape[1]))


def use_triton_rows(device: Any) -> bool:
    """Install the Triton kernels for CUDA tensors once they agree with the torch versions on
    random rows of ``device``; False (logged) when Triton is missing or disagrees."""
    if _TRITON:
        return True
    try:
        from router.backends.torch.moe_triton import combine_rows, gather_rows
    except ImportError as exc:
        log.warning("torch read: Triton unavailable (%s), MoE rows copied by the compiler", exc)
        return False
    try:
        gen = torch.Generator(device=device).manual_seed(0)
        rows = torch.randn((40, 2100), generator=gen, device=device, dtype=torch.bfloat16)
        order = torch.randperm(80, generator=gen, device=device)
        weights = torch.rand((40, 2), generator=gen, device=device)
        same = (torch.equal(gather_rows(rows, order, 2), moe_gather(rows, order, 2))
                and torch.allclose(combine_rows(rows, order.view(40, 2) % 40, weights).float(),
                                   moe_combine(rows, order.view(40, 2) % 40, weights).float(),
                                   rtol=1e-2, atol=1e-2))
    except Exception as exc:  # noqa: BLE001 (a Triton build or launch failure: serve without it)
        log.warning("torch read: Triton MoE kernels failed (%s: %s)", type(exc).__name__, exc)
        return False
    if not same:
        log.warning("torch read: Triton MoE kernels disagree with torch; not used")
        return False
    _TRITON.update(gather=gather_rows, combine=combine_rows)
    log.info("torch read: MoE rows copied by Triton kernels")
    return True


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


def experts_forward(experts: Any, hidden: Any, top_k_index: Any, top_k_weights: Any) -> Any:
    """What ``experts(hidden, top_k_index, top_k_weights)`` returns for transformers' gated
    ``grouped_mm`` experts (DiffusionGemma's: no biases, no expert parallelism)."""
    n_tokens, top_k = top_k_index.shape
    expert_ids, order = torch.sort(top_k_index.reshape(-1))
    # histc, not bincount: bincount syncs with the host (no CUDA graph); CPU histc wants floats
    counts = torch.histc(expert_ids.float() if hidden.device.type == "cpu" else expert_ids.int(),
                         bins=experts.num_experts, min=0, max=experts.num_experts - 1)
    offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
    sorted_rows = moe_gather(hidden, order, top_k)
    gate, up = grouped_mm(sorted_rows, experts.gate_up_proj, offsets).chunk(2, dim=-1)
    out_rows = grouped_mm(experts.act_fn(gate) * up, experts.down_proj, offsets)
    place = torch.empty_like(order)
    place[order] = torch.arange(order.shape[0], device=order.device)
    return moe_combine(out_rows, place.view(n_tokens, top_k), top_k_weights)
