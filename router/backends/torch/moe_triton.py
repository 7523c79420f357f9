"""Triton kernels for the MoE row copies of moe.py (CUDA only; importing needs Triton).

Hand-written because neither copy is one torch op that runs near the copy bandwidth: the gather is
an ``index_select`` (fine eagerly, but inductor fuses it into a slower pointwise kernel), and the
combine is a gather, a float32 product and a sum over k that torch runs as three passes over an
(S, hidden) float32 intermediate. One program copies (gather) or reduces (combine) one row in
BLOCK-wide contiguous slices.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

BLOCK = 1024


@triton.jit  # type: ignore[untyped-decorator]  # (Triton ships no type hints)
def _gather_kernel(  # type: ignore[no-untyped-def]  # (Triton reads the annotations: none)
        src, order, dst, n_cols, top_k: tl.constexpr, block: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    token = tl.load(order + row) // top_k
    for start in range(0, n_cols, block):
        cols = start + tl.arange(0, block)
        keep = cols < n_cols
        values = tl.load(src + token * n_cols + cols, mask=keep)
        tl.store(dst + row * n_cols + cols, values, mask=keep)


@triton.jit  # type: ignore[untyped-decorator]
def _combine_kernel(  # type: ignore[no-untyped-def]
        rows, place, weights, out, n_cols, top_k: tl.constexpr, block: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * block + tl.arange(0, block)
    keep = cols < n_cols
    acc = tl.zeros((block,), dtype=tl.float32)
    for k in tl.static_range(top_k):  # in k order, as transformers' sum over k
        at = tl.load(place + token * top_k + k).to(tl.int64)
        weight = tl.load(weights + token * top_k + k).to(tl.float32)
        acc += tl.load(rows + at * n_cols + cols, mask=keep).to(tl.float32) * weight
    tl.store(out + token * n_cols + cols, acc.to(out.dtype.element_ty), mask=keep)


def gather_rows(rows: Any, order: Any, top_k: int) -> Any:
    rows, order = rows.contiguous(), order.contiguous()
    out = rows.new_empty((order.shape[0], rows.shape[1]))
    if out.numel():
        _gather_kernel[(order.shape[0],)](rows, order, out, rows.shape[1], top_k, BLOCK, num_warps=4)
    return out


def combine_rows(rows: Any, place: Any, weights: Any) -> Any:
    rows, place, weights = rows.contiguous(), place.contiguous(), weights.contiguous()
    n_tokens, top_k = place.shape
    out = rows.new_empty((n_tokens, rows.shape[1]))
    if out.numel():
        grid = (n_tokens, triton.cdiv(rows.shape[1], BLOCK))
        _combine_kernel[grid](rows, place, weights, out, rows.shape[1], top_k, BLOCK, num_warps=4)
    return out

