"""Attention in two parts merged by their log-sum-exp, so a batch attends to one shared prompt
prefix's keys/values once instead of copying them per row.

softmax over [prefix keys, row keys] = the two parts' softmax outputs weighted by exp(lse_part - lse):
    out = (e^{a} out_a + e^{b} out_b) / (e^{a} + e^{b}),  a, b = the parts' log-sum-exps.
Grouped-query attention is folded into the query axis: query heads h = j*G + g read key head j, so
q (B, H, M, D) viewed as (B, H_kv, G*M, D) reads keys (B, H_kv, N, D) with no repeated keys.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

# Masked scores get this bias rather than -inf: a fully masked part then has a finite, tiny
# log-sum-exp (its merge weight is 0) instead of NaN, on every kernel.
MASKED = -1.0e30
# Memory-efficient attention reads a bias whose last-axis stride is a multiple of 16 elements.
BIAS_ALIGN = 16

Attend = Callable[[Any, Any, Any, Any], tuple[Any, Any]]


def fold_groups(q: Any, n_kv_heads: int) -> Any:
    """(B, H, M, D) -> (B, H_kv, G*M, D), query head j*G+g reading key head j."""
    b, h, m, d = q.shape
    return q.reshape(b, n_kv_heads, (h // n_kv_heads) * m, d)


def unfold_groups(out: Any, n_heads: int) -> Any:
    """The inverse of ``fold_groups`` (also for a log-sum-exp of shape (B, H_kv, G*M))."""
    b, h_kv = out.shape[:2]
    rest = out.shape[3:]
    return out.reshape(b, n_heads, out.shape[2] * h_kv // n_heads, *rest)


def to_bias(visible: Any, groups: int, dtype: Any) -> Any:
    """An additive bias (B, 1, G*M, N) from a visibility mask (B, M, N), repeated over the G query
    groups of ``fold_groups``; stored with the last axis padded to BIAS_ALIGN."""
    import torch

    b, m, n = visible.shape
    storage = torch.zeros((b, 1, groups * m, -(-n // BIAS_ALIGN) * BIAS_ALIGN), dtype=dtype,
                          device=visible.device)
    bias = storage[..., :n]
    masked = max(MASKED, torch.finfo(dtype).min / 2)  # finite in every dtype
    bias.copy_(torch.where(visible, 0.0, masked).to(dtype)[:, None].expand(b, groups, m, n)
               .reshape(b, 1, groups * m, n))
    return bias


def attend_math(q: Any, k: Any, v: Any, bias: Any) -> tuple[Any, Any]:
    """Reference attention in float32 (scale 1, as DiffusionGemma's normed q/k use): returns
    (out (B, Hk, M, D) in q's dtype, lse (B, Hk, M) float32)."""
    import torch

    scores = torch.matmul(q.float(), k.float().transpose(-1, -2))
    if bias is not None:
        scores = scores + bias.float()
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.matmul(torch.exp(scores - lse[..., None]), v.float())
    return out.to(q.dtype), lse


def attend_efficient(q: Any, k: Any, v: Any, bias: Any) -> tuple[Any, Any]:
    """PyTorch's memory-efficient attention kernel (CUDA), which also returns the log-sum-exp.
    Why the private op: the public SDPA returns no log-sum-exp, and flash attention takes no bias
    and no head dim of 512 (DiffusionGemma's global layers)."""
    import torch

    if bias is not None:  # None: no mask (every query sees every key)
        bias = bias.expand(q.shape[0], q.shape[1], -1, -1)  # the kernel wants (B, H, M, N)
    out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, v, bias, True, 0.0, False, scale=1.0)[:2]
    return out, lse[..., : q.shape[2]].float()


def merge(out_a: Any, lse_a: Any, out_b: Any, lse_b: Any) -> Any:
    """Two parts' outputs of the same queries merged into attention over both parts' keys."""
    return _merged(((out_a, lse_a), (out_b, lse_b)))


def merge3(out_a: Any, lse_a: Any, out_b: Any, lse_b: Any, out_c: Any, lse_c: Any) -> Any:
    """``merge`` of three parts of the same queries."""
    return _merged(((out_a, lse_a), (out_b, lse_b), (out_c, lse_c)))


def _merged(parts: tuple[tuple[Any, Any], ...]) -> Any:
    """Parts (out, lse) of the same queries weighed by exp(lse - the largest lse), summed in
    float32 in part order and rounded once to the first part's dtype."""
    import torch

    top = functools.reduce(torch.maximum, [lse for _, lse in parts])
    weights = [torch.exp(lse - top)[..., None] for _, lse in parts]
    total = sum(out.float() * weight for (out, _), weight in zip(parts, weights, strict=True))
    return (total / sum(weights)).to(parts[0][0].dtype)


def merge_grouped3(out_a: Any, lse_a: Any, out_b: Any, lse_b: Any, out_c: Any, lse_c: Any) -> Any:
    """``merge_grouped`` of three parts (a canvas's prompt rest read in place, its own canvas and
    the prefix: ``OnePass.canvas_own``'s two parts unmerged), the same layouts in and out. Why:
    merging the two own-key parts first (``merge_parts``) writes a copy that the prefix merge
    reads again."""
    return _projection_layout(merge3(out_a, lse_a, out_b, lse_b, out_c, lse_c))


def merge_parts(out_a: Any, lse_a: Any, out_b: Any, lse_b: Any) -> tuple[Any, Any]:
    """Two parts' (out, lse) of the same queries, any layout, as one part over both parts' keys:
    ``merge``'s output and the log-sum-exp over all the keys (what a further merge needs)."""
    import torch

    return merge(out_a, lse_a, out_b, lse_b), torch.logaddexp(lse_a, lse_b)


def merge_grouped(out_a: Any, lse_a: Any, out_b: Any, lse_b: Any) -> Any:
    """``merge`` of grouped views (B, Hk, G, M, D) / (B, Hk, G, M) (``group_view``), laid out as the
    output projection reads it: (B, M, Hk*G*D), query head j*G+g. Why this layout: the attention
    kernels' outputs are read where they lie (no unfolding copies) and written once, in place for
    the projection (row_ops.merge_groups runs it as one Triton kernel on CUDA)."""
    return _projection_layout(merge(out_a, lse_a, out_b, lse_b))


def _projection_layout(merged: Any) -> Any:
    """A grouped (B, Hk, G, M, D) merge as the output projection reads it: (B, M, Hk*G*D)."""
    return merged.permute(0, 3, 1, 2, 4).reshape(merged.shape[0], merged.shape[3], -1)


def group_view(x: Any, groups: int, *, items: int = 0, rows: int = 0, offset: int = 0) -> Any:
    """A folded (B, Hk, G*R, ...) tensor (``fold_groups``' layout, an attention kernel's output or
    log-sum-exp) as a (B, Hk, G, R, ...) view, no copy. With ``items``: x is a batch of one whose R
    queries are ``items`` runs of ``rows`` laid end to end from ``offset`` (the prefix read's
    queries), viewed as (items, Hk, G, rows, ...)."""
    stride, per_group = x.stride(), x.shape[2] // groups
    rest, rest_stride = tuple(x.shape[3:]), tuple(stride[3:])
    if not items:
        size = (x.shape[0], x.shape[1], groups, per_group)
        steps = (stride[0], stride[1], per_group * stride[2], stride[2])
        return x.as_strided(size + rest, steps + rest_stride, x.storage_offset())
    size = (items, x.shape[1], groups, rows)
    steps = (rows * stride[2], stride[1], per_group * stride[2], stride[2])
    return x.as_strided(size + rest, steps + rest_stride, x.storage_offset() + offset * stride[2])


def attend_cudnn(q: Any, k: Any, v: Any, bias: Any) -> tuple[Any, Any]:
    """cuDNN's attention (CUDA; Hopper kernels for head dims up to 256), with the log-sum-exp.
    Why: PyTorch's memory-efficient kernel is an sm80 kernel that keeps its accumulator in global
    memory for head dims over 128; cuDNN's Hopper kernels run the same read several times faster
    (bench/attention_kernels.py)."""
    import torch

    if bias is not None:  # None: no mask (every query sees every key)
        bias = bias.expand(q.shape[0], q.shape[1], -1, -1)
    out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(
        q, k, v, bias, True, 0.0, False, False, scale=1.0)[:2]
    return out, lse.reshape(lse.shape[0], lse.shape[1], -1)[..., : q.shape[2]].float()


@dataclass
class Band:
    """Which of a batch-of-one key set (the shared prefix) each folded query sees: key n is visible
    to query i iff ``low[i] <= key_pos[n] < high`` (no lower bound when ``low`` is None). Why not a
    dense bias: for the prefix part the bias is (G*M, N), up to ~0.2 GB a layer at a batch of 32,
    read by every key head; a band is two small vectors the softmax reads instead."""

    key_pos: Any  # (N,) long: each key's token position (FAR for an empty slot)
    low: Any | None  # (G*M,) long: each folded query's lowest visible position
    high: Any  # 0-d long: the first position not visible (the prefix's length)


def band_softmax(scores: Any, key_pos: Any, low: Any | None, high: Any, dtype: Any) -> tuple[Any, Any]:
    """Softmax over the last axis of float32 ``scores`` (Hk, G*M, N) restricted to the band;
    returns (probabilities in ``dtype``, float32 log-sum-exp (Hk, G*M)). Masked scores get MASKED, as the
    dense bias gives them, so a query that sees nothing has weight 0 in the merge."""
    import torch

    visible = (key_pos < high)[None, None, :]
    if low is not None:
        visible = visible & (key_pos[None, None, :] >= low[None, :, None])
    scores = torch.where(visible, scores, MASKED)
    lse = torch.logsumexp(scores, dim=-1)
    return torch.exp(scores - lse[..., None]).to(dtype), lse


def scores_f32(q: Any, k: Any) -> Any:
    """q (Hk, M, D) @ k (Hk, N, D)^T in float32. On CUDA a bf16/fp16 GEMM writes float32 directly
    (``out_dtype``); elsewhere, or where that op is missing, the inputs are upcast first."""
    import torch

    if q.is_cuda and q.dtype != torch.float32:
        try:
            return torch.bmm(q, k.transpose(-1, -2), out_dtype=torch.float32)
        except (TypeError, RuntimeError, NotImplementedError):
            pass
    return torch.bmm(q.float(), k.float().transpose(-1, -2))


def attend_band(q: Any, k: Any, v: Any, band: Band, softmax: Any = band_softmax) -> tuple[Any, Any]:
    """Attention of folded queries q (1, Hk, G*M, D) to a batch of one's keys/values (1, Hk, N, D)
    under ``band``, as two batched GEMMs around ``softmax`` (compiled on CUDA into one kernel).
    Why GEMMs, not a fused attention kernel: at head dims 256 and 512 PyTorch's fused kernels run
    far below the chip's matrix rate; cuBLAS runs these two GEMMs near it, and the softmax costs
    one pass over the (Hk, G*M, N) scores. Returns (out (1, Hk, G*M, D) in q's dtype, lse float32)."""
    import torch

    proba, lse = softmax(scores_f32(q[0], k[0]), band.key_pos, band.low, band.high, v.dtype)
    out = torch.bmm(proba, v[0])
    return out.unsqueeze(0).to(q.dtype), lse.unsqueeze(0)


KERNELS: tuple[tuple[str, Attend], ...] = (("cudnn", attend_cudnn), ("efficient", attend_efficient))
# cuDNN's Hopper (wgmma) attention kernels stop at this head dim; above it cuDNN runs an sm80
# kernel that measured slower than PyTorch's memory-efficient one for the global layers' prefix
# read (bench/attention_kernels.py), so that one is tried first there.
CUDNN_HOPPER_MAX_DIM = 256


def kernel_order(dim: int, kernels: tuple[tuple[str, Attend], ...]) -> tuple[tuple[str, Attend], ...]:
    """``kernels`` in the order ``pick_attention`` tries them at head dim ``dim``: cuDNN last
    above its Hopper kernels' dims."""
    if dim <= CUDNN_HOPPER_MAX_DIM:
        return kernels
    return tuple(sorted(kernels, key=lambda named: named[0] == "cudnn"))


KERNEL_BY_NAME: dict[str, Attend] = {"math": attend_math, **dict(KERNELS)}


Causal = Callable[[Any, Any, Any], tuple[Any, Any]]


def attend_causal_math(q: Any, k: Any, v: Any) -> tuple[Any, Any]:
    """Causal attention (query i reads keys 0..i) of q (B, H, M, D) over k/v (B, H_kv, M, D),
    query head h reading key head h // G: ``attend_math`` under a causal bias, returned in
    ``fold_groups``' layout, (B, H_kv, G*M, D) and (B, H_kv, G*M). The reference of
    ``attend_causal_cudnn``."""
    import torch

    n_items, n_heads, m = q.shape[:3]
    steps = torch.arange(m, device=q.device)
    causal = (steps[:, None] >= steps[None, :])[None].expand(n_items, -1, -1)
    n_kv = k.shape[1]
    return attend_math(fold_groups(q, n_kv), k, v, to_bias(causal, n_heads // n_kv, q.dtype))


def attend_causal_cudnn(q: Any, k: Any, v: Any) -> tuple[Any, Any]:
    """``attend_causal_math`` by cuDNN's causal kernel with the key heads grouped natively: no
    bias at all. Why: it reads a batch of prompt rests in well under half the time of the dense
    causal bias (bench/results/attention_kernels.json, key kernels)."""
    import torch

    out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(
        q, k, v, None, True, 0.0, True, False, scale=1.0)[:2]
    n_items, n_kv, m = q.shape[0], k.shape[1], q.shape[2]
    # (B, H, M, D) with head h = j*G + g is (B, H_kv, G*M, D) in the folded order: a view
    lse = lse.reshape(n_items, q.shape[1], -1)[..., :m].reshape(n_items, n_kv, -1)
    return out.reshape(n_items, n_kv, -1, q.shape[-1]), lse.float()


# the kernels with a causal form (KernelChoice.causal_own); at other kernels' head dims the prompt
# rests keep their dense causal bias
CAUSAL_BY_NAME: dict[str, Causal] = {"math": attend_causal_math, "cudnn": attend_causal_cudnn}


def no_causal_dims(names: tuple[tuple[int, str], ...]) -> frozenset[int]:
    """The head dims whose kernel (``names``; "math", which has one, where unnamed) has no causal
    form: their prompt rests keep the dense causal bias."""
    return frozenset(dim for dim, name in names if name not in CAUSAL_BY_NAME)


def causal_by_dim(names: tuple[tuple[int, str], ...]) -> Causal:
    """One causal attention function dispatching per head dim as ``attend_by_dim`` does, over the
    kernels' causal forms ("math" where unnamed); a dim whose kernel has none is not dispatched
    here (``causal_dims``)."""
    table = {dim: CAUSAL_BY_NAME[name] for dim, name in names if name in CAUSAL_BY_NAME}

    def attend(q: Any, k: Any, v: Any) -> tuple[Any, Any]:
        return table.get(q.shape[-1], attend_causal_math)(q, k, v)

    return attend


@functools.cache
def causal_problem(names: tuple[tuple[int, str], ...], device: Any, dtype: Any) -> str:
    """Why the causal forms of the kernels ``names`` gives each head dim cannot serve on
    ``device`` ("" when they can): a form that fails or disagrees with ``attend_causal_math`` on
    random grouped-head inputs. A pure check, memoised per (names, device, dtype): asked again
    (``TorchBackend.serving`` lists a failure for ``/readyz``), it answers what
    ``default_choice`` was told without running kernels again."""
    import torch

    for dim, name in names:
        form = CAUSAL_BY_NAME.get(name)
        if form is None or form is attend_causal_math:
            continue
        try:
            gen = torch.Generator(device=device).manual_seed(0)
            q = torch.randn((2, 4, 40, dim), generator=gen, device=device, dtype=dtype) / dim**0.5
            k, v = (torch.randn((2, 2, 40, dim), generator=gen, device=device, dtype=dtype)
                    for _ in range(2))
            ref_out, ref_lse = attend_causal_math(q, k, v)
            out, lse = form(q, k, v)
            err = float((out.float() - ref_out.float()).norm() / ref_out.float().norm())
            lse_err = float((lse - ref_lse).abs().max())
        except (RuntimeError, TypeError, AttributeError, NotImplementedError, ValueError) as exc:
            return f"{name} at head dim {dim}: unavailable ({type(exc).__name__}: {str(exc)[:160]})"
        if not (err < 2e-2 and lse_err < 2e-2):
            return f"{name} at head dim {dim}: disagrees (rel err {err:.3g}, lse err {lse_err:.3g})"
    return ""


def pick_attention(device: Any, dtype: Any, head_dims: set[int],
                   kernels: tuple[tuple[str, Attend], ...] = KERNELS) -> tuple[tuple[int, str], ...]:
    """Per head dim, the name of the first CUDA kernel of ``kernels`` that agrees with
    ``attend_math`` on random inputs (checked once, logged); "math" on the CPU or when none agrees.
    ``kernels`` read a dense bias."""
    if device.type != "cuda":
        return tuple((dim, "math") for dim in sorted(head_dims))
    chosen: dict[int, str] = {}
    for dim in sorted(head_dims):
        chosen[dim] = "math"
        for name, kernel in kernel_order(dim, kernels):
            problem = _agreement(kernel, dim, device, dtype)
            if problem is None:
                chosen[dim] = name
                break
            log.warning("attention kernel %s at head dim %d: %s", name, dim, problem)
    log.info("attention kernels by head dim: %s", chosen)
    return tuple(sorted(chosen.items()))


def attend_by_dim(names: tuple[tuple[int, str], ...]) -> Attend:
    """One attention function calling, per query head dim, the kernel ``names`` gives it
    (``attend_math`` for a dim it does not name); the dispatch table is fixed here, once."""
    table = {dim: KERNEL_BY_NAME[name] for dim, name in names}
    if all(kernel is attend_math for kernel in table.values()):
        return attend_math

    def attend(q: Any, k: Any, v: Any, bias: Any) -> tuple[Any, Any]:
        return table.get(q.shape[-1], attend_math)(q, k, v, bias)

    return attend


def _agreement(kernel: Attend, dim: int, device: Any, dtype: Any) -> str | None:
    """None when ``kernel`` matches ``attend_math`` (output and log-sum-exp), else what differs."""
    import torch

    try:
        gen = torch.Generator(device=device).manual_seed(0)
        q, k, v = (torch.randn((2, 2, n, dim), generator=gen, device=device, dtype=dtype)
                   for n in (48, 80, 80))
        visible = torch.rand((2, 24, 80), generator=gen, device=device) > 0.3
        bias = to_bias(visible, 2, dtype)
        ref_out, ref_lse = attend_math(q / dim**0.5, k, v, bias)
        out, lse = kernel(q / dim**0.5, k, v, bias)
        err = float((out.float() - ref_out.float()).norm() / ref_out.float().norm())
        lse_err = float((lse - ref_lse).abs().max())
    except (RuntimeError, TypeError, AttributeError, NotImplementedError, ImportError, ValueError) as exc:
        return f"unavailable ({type(exc).__name__}: {str(exc)[:160]})"
    if not (err < 2e-2 and lse_err < 2e-2):
        return f"disagrees with the reference (rel err {err:.3g}, lse err {lse_err:.3g})"
    return None
