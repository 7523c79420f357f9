"""The experts of a DiffusionGemma layer with the token permutation done as two row copies.

transformers' ``grouped_mm`` experts sort the (token, expert) pairs by expert, gather the tokens'
rows into that order, run two grouped GEMMs, and bring the rows back with an inverse-permutation
gather, a float32 weighting and a sum over the top-k. Compiled, inductor turns the gather and the
weighted sum into two kernels that took ~0.7 ms each per layer at a batch of 8,448 tokens on an
H200 (41 ms of a 230 ms batch), where moving the ~0.4 GB each touches takes ~0.1 ms.

Here the two copies are ops of their own (ops.py: ``slotgate::moe_gather``,
``slotgate::moe_combine``, or their Triton twins, as the reader's choice says), opaque to the compiler: each row is one contiguous copy, and the
combine reads a token's top-k rows and sums them weighted in float32 in one pass (no float32
(S, hidden) intermediate); on CUDA they run as Triton kernels (0.16 and 0.10 ms a layer there).
The arithmetic is transformers' (sum of float32 products over k in order, rounded once).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import torch

from router.backends.torch.ops import TORCH_OPS, TRITON_OPS, RowOps, triton_problem

log = logging.getLogger(__name__)


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


GroupedMatmul = Callable[[Any, Any, Any], Any]  # (rows, weight, offsets): rows @ weight^T by group


def experts_forward(experts: Any, hidden: Any, top_k_index: Any, top_k_weights: Any,
                    ops: RowOps = TORCH_OPS, *, weights: tuple[Any, Any] | None = None,
                    matmul: GroupedMatmul = grouped_mm) -> Any:
    """What ``experts(hidden, top_k_index, top_k_weights)`` returns for transformers' gated
    ``grouped_mm`` experts (DiffusionGemma's: no biases, no expert parallelism); the row copies
    are ``ops``' gather and combine. ``weights`` (gate_up, down), default the module's, are what
    ``matmul`` multiplies by: another form of them (fp8.py's quantized copies) reuses the rest."""
    gate_up, down = weights if weights is not None else (experts.gate_up_proj, experts.down_proj)
    n_tokens, top_k = top_k_index.shape
    expert_ids, order = torch.sort(top_k_index.reshape(-1))
    # histc, not bincount: bincount syncs with the host (no CUDA graph); CPU histc wants floats
    counts = torch.histc(expert_ids.float() if hidden.device.type == "cpu" else expert_ids.int(),
                         bins=experts.num_experts, min=0, max=experts.num_experts - 1)
    offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
    sorted_rows = ops.gather(hidden, order, top_k)
    gate, up = matmul(sorted_rows, gate_up, offsets).chunk(2, dim=-1)
    out_rows = matmul(experts.act_fn(gate) * up, down, offsets)
    place = torch.empty_like(order)
    place[order] = torch.arange(order.shape[0], device=order.device)
    return ops.combine(out_rows, place.view(n_tokens, top_k), top_k_weights)


@functools.cache
def fused_moe_problem(device: torch.device, *, fp8: bool = False) -> str:
    """Why the fused Triton MoE (triton_moe.py) cannot serve on ``device`` ("" when it can): the
    Triton kernels' own problem, or the fused experts disagreeing with ``moe.experts_forward`` on
    random bf16 experts (uneven groups, one expert unused); with ``fp8``, its weight-only FP8 path
    against the same experts' dequantized copies. Checked once per device and mode, logged."""
    problem = triton_problem(device)
    if not problem:
        try:
            problem = _fused_moe_disagreement(device, fp8)
        except Exception as exc:  # noqa: BLE001 (a failed build or launch: the row-copy experts serve)
            problem = f"{type(exc).__name__}: {exc}"
    if problem:
        log.warning("torch read: fused MoE not used, the row-copy experts serve: %s", problem)
    return problem


def _fused_moe_disagreement(device: torch.device, fp8: bool) -> str:
    from types import SimpleNamespace

    from router.backends.torch.triton_moe import fused_experts

    gen = torch.Generator(device=device).manual_seed(0)
    n_experts, hidden_dim, inter_dim, tokens, top_k = 8, 256, 128, 40, 2

    def rand(*shape: int) -> torch.Tensor:
        values = torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16)
        return values.mul_(shape[-1] ** -0.5)

    experts = SimpleNamespace(num_experts=n_experts, gate_up_proj=rand(n_experts, 2 * inter_dim, hidden_dim),
                              down_proj=rand(n_experts, hidden_dim, inter_dim),
                              act_fn=lambda x: torch.nn.functional.gelu(x, approximate="tanh"))
    hidden = torch.randn((tokens, hidden_dim), generator=gen, device=device, dtype=torch.bfloat16)
    index = torch.randint(0, n_experts - 1, (tokens, top_k), generator=gen, device=device)  # one idle
    weights = torch.rand((tokens, top_k), generator=gen, device=device)
    if fp8:  # the FP8 copies against the experts they stand for: their dequantized values
        from router.backends.torch.fp8 import dequantize, quantize_rows

        gate_up, down = quantize_rows(experts.gate_up_proj), quantize_rows(experts.down_proj)
        experts.gate_up_proj = dequantize(gate_up).to(torch.bfloat16)
        experts.down_proj = dequantize(down).to(torch.bfloat16)
        got = fused_experts(hidden, gate_up.weight, down.weight, index, weights,
                            gate_up_scale=gate_up.scale, down_scale=down.scale).float()
    else:
        got = fused_experts(hidden, experts.gate_up_proj, experts.down_proj, index, weights).float()
    want = experts_forward(experts, hidden, index, weights, TRITON_OPS).float()
    error = float((got - want).norm() / want.norm())
    kind = "fused MoE (FP8 weights)" if fp8 else "fused MoE"
    return "" if error < 2e-2 else f"{kind} differs from the row-copy experts (relative error {error:.3g})"
