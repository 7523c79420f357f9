"""A DiffusionGemma MoE router's tail as one Triton kernel (CUDA; on the CPU under Triton's
interpreter, for the tests): softmax, top-k, renormalisation and per-expert scale of the expert
scores, where transformers' router runs a softmax kernel, torch.topk's gather and sort kernels and
the renormalise/gather kernels (bench.gpu_read's profile block). ``route`` is the router module's forward with that tail, for layer_ops.ffn_half_fused.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

# Register budget of one program's (rows, experts) tile: at 128 experts, 16 token rows a program
# (17 programs at one read of 264 tokens, 528 at 32 reads).
TILE_ELEMENTS = 2048
SCALE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit  # type: ignore[untyped-decorator]  # (Triton ships no type hints)
def _route_kernel(  # type: ignore[no-untyped-def]  # (Triton reads the annotations: none)
        scores, per_expert_scale, weights, index, n_tokens, n_experts, s_t, s_e,
        top_k: tl.constexpr, k_p2: tl.constexpr, experts_p2: tl.constexpr, rows: tl.constexpr):
    tokens = tl.program_id(0) * rows + tl.arange(0, rows)
    experts = tl.arange(0, experts_p2)
    real_t, real_e = tokens < n_tokens, experts < n_experts
    at = scores + tokens[:, None].to(tl.int64) * s_t + experts[None, :] * s_e
    # rows past the last read zeros (finite: no inf - inf), columns past the last expert -inf
    x = tl.load(at, mask=real_t[:, None] & real_e[None, :], other=0.0).to(tl.float32)
    x = tl.where(real_e[None, :], x, -float("inf"))
    e = tl.exp(x - tl.max(x, axis=1)[:, None])
    proba = e / tl.sum(e, axis=1)[:, None]  # torch's float32 softmax
    # k passes: the largest probability left, then its column struck out (-1: below every
    # probability, so padding is never taken while a real expert is left, k <= E). Selecting on
    # the probabilities, as torch.topk does, ties where torch's do. Equal probabilities go to the
    # lower expert first (tie_break_left); they give equal weights and the same sum, so a tie
    # decides only which of the equal experts (and its per_expert_scale) is taken, as it is left
    # to torch.topk's own order in transformers.
    cols = tl.arange(0, k_p2)
    top_w = tl.zeros((rows, k_p2), dtype=tl.float32)
    top_i = tl.zeros((rows, k_p2), dtype=tl.int32)
    left = tl.where(real_e[None, :], proba, -1.0)
    for j in tl.static_range(top_k):
        best, at_best = tl.max(left, axis=1, return_indices=True, return_indices_tie_break_left=True)
        top_w = tl.where(cols[None, :] == j, best[:, None], top_w)
        top_i = tl.where(cols[None, :] == j, at_best[:, None], top_i)
        left = tl.where(experts[None, :] == at_best[:, None], -1.0, left)
    # columns past k hold 0: the sum is the k weights'; divided, as transformers' ``/=``
    top_w = top_w / tl.sum(top_w, axis=1)[:, None]
    keep = real_t[:, None] & (cols < top_k)[None, :]
    top_w *= tl.load(per_expert_scale + top_i, mask=keep, other=0.0).to(tl.float32)
    out_at = tokens[:, None].to(tl.int64) * top_k + cols[None, :]
    tl.store(weights + out_at, top_w, mask=keep)
    tl.store(index + out_at, top_i.to(tl.int64), mask=keep)


def _check(scores: torch.Tensor, per_expert_scale: torch.Tensor, top_k: int) -> None:
    if scores.ndim != 2 or not scores.dtype.is_floating_point:
        raise ValueError(f"scores is {scores.dtype} {tuple(scores.shape)}: need (T, E) floats")
    n_experts = scores.shape[1]
    if per_expert_scale.shape != (n_experts,) or per_expert_scale.dtype not in SCALE_DTYPES:
        raise ValueError(f"per_expert_scale is {per_expert_scale.dtype} "
                         f"{tuple(per_expert_scale.shape)}: need ({n_experts},) of {SCALE_DTYPES} "
                         "(float32 weights, as transformers' are for such a scale)")
    if not 1 <= top_k <= n_experts:
        raise ValueError(f"top_k is {top_k}: need 1 to {n_experts} (the experts)")


def route_top_k(scores: torch.Tensor, per_expert_scale: torch.Tensor,
                top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``route_top_k_torch`` in one kernel: (weights (T, k) float32, index (T, k) int64) of the
    expert ``scores`` (T, E) of any float dtype (read as float32), the k in descending order."""
    _check(scores, per_expert_scale, top_k)
    n_tokens, n_experts = scores.shape
    weights = scores.new_empty((n_tokens, top_k), dtype=torch.float32)
    index = scores.new_empty((n_tokens, top_k), dtype=torch.int64)
    if n_tokens == 0:
        return weights, index
    experts_p2 = triton.next_power_of_2(n_experts)
    rows = max(1, TILE_ELEMENTS // experts_p2)
    _route_kernel[(triton.cdiv(n_tokens, rows),)](
        scores, per_expert_scale.contiguous(), weights, index, n_tokens, n_experts, *scores.stride(),
        top_k=top_k, k_p2=triton.next_power_of_2(top_k), experts_p2=experts_p2, rows=rows)
    return weights, index


def route_top_k_torch(scores: torch.Tensor, per_expert_scale: torch.Tensor,
                      top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' DiffusionGemmaTextRouter after its projection, op for op: the reference."""
    proba = torch.nn.functional.softmax(scores, dim=-1, dtype=torch.float32)
    weights, index = torch.topk(proba, k=top_k, dim=-1)
    weights /= weights.sum(dim=-1, keepdim=True)
    return weights * per_expert_scale[index], index


@torch.library.custom_op("slotgate::route_top_k", mutates_args=())
def route_top_k_op(scores: torch.Tensor, per_expert_scale: torch.Tensor,
                   top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``route_top_k`` as an op the compiler leaves opaque."""
    return route_top_k(scores, per_expert_scale, top_k)


@route_top_k_op.register_fake
def _(scores: torch.Tensor, per_expert_scale: torch.Tensor,
      top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (scores.shape[0], top_k)
    return scores.new_empty(shape, dtype=torch.float32), scores.new_empty(shape, dtype=torch.int64)


def route(router: Any, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A DiffusionGemmaTextRouter's (top_k_weights, top_k_index) of the rows ``flat`` (T, H), its
    outputs 2 and 3: the norm, scale and projection as the module runs them (torch ops, which a
    compiled caller fuses), the tail as ``route_top_k_op``."""
    hidden = router.norm(flat) * router.scale * router.scalar_root_size
    weights, index = route_top_k_op(router.proj(hidden), router.per_expert_scale,
                                    router.config.top_k_experts)
    return weights, index


def router_disagreement(device: Any) -> str:
    """Why ``route_top_k_op`` cannot serve on ``device`` ("" when it can): on 300 rows of 128
    bf16 expert scores (the real shape, k = 8), other experts than ``route_top_k_torch`` picks, or
    weights more than 1e-5 apart (float32 rounding and the GPU's exp stay far below). Each row's
    scores are distinct (a shuffled bf16-exact grid, shifted): with ties the index would be left
    to each implementation's tie-break."""
    gen = torch.Generator(device=device).manual_seed(0)
    n_tokens, n_experts, top_k = 300, 128, 8
    grid = torch.arange(-n_experts // 2, n_experts // 2, device=device) / 16
    order = torch.rand((n_tokens, n_experts), generator=gen, device=device).argsort(dim=1)
    shift = torch.randint(-3, 4, (n_tokens, 1), generator=gen, device=device)
    scores = (grid[order] + shift).to(torch.bfloat16)
    scale = (torch.rand(n_experts, generator=gen, device=device) + 0.5).to(torch.bfloat16)
    weights, index = route_top_k_op(scores, scale, top_k)
    want_weights, want_index = route_top_k_torch(scores, scale, top_k)
    wrong_rows = int((index != want_index).any(dim=1).sum())
    if wrong_rows:
        return (f"router kernel (route_top_k) picks other experts than the torch router in "
                f"{wrong_rows} of {n_tokens} rows")
    error = float((weights - want_weights).abs().max())
    if not error <= 1e-5:
        return f"router kernel (route_top_k) weights differ from the torch router's by {error:.3g}"
    return ""
