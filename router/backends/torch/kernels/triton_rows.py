"""Triton kernels of row_ops.py's custom ops (CUDA only; importing needs Triton).

Hand-written because none is one torch op that runs near the copy bandwidth: the MoE gather is an
``index_select`` (fine eagerly, but inductor fuses it into a slower pointwise kernel), the MoE
combine a gather, a float32 product and a sum over k that torch runs as three passes over an
(S, hidden) float32 intermediate, and the attention merge reads its four inputs through strided
views (the attention kernels' own layouts) that inductor's pointwise kernel reads several times
below the copy bandwidth. One program copies, reduces or merges one row.
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



@triton.jit  # type: ignore[untyped-decorator]
def _merge_kernel(  # type: ignore[no-untyped-def]
        out_a, lse_a, out_b, lse_b, out_c, lse_c, dst, n_rows, groups, n_heads,
        a0, a1, a2, a3, la0, la1, la2, la3, b0, b1, b2, b3, lb0, lb1, lb2, lb3,
        c0, c1, c2, c3, lc0, lc1, lc2, lc3, dim: tl.constexpr, three: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # item * n_rows + query
    head = tl.program_id(1).to(tl.int64)  # key head * groups + group
    item, query = row // n_rows, row % n_rows
    kv, group = head // groups, head % groups
    w_a = tl.load(lse_a + item * la0 + kv * la1 + group * la2 + query * la3)
    w_b = tl.load(lse_b + item * lb0 + kv * lb1 + group * lb2 + query * lb3)
    cols = tl.arange(0, dim)
    x_a = tl.load(out_a + item * a0 + kv * a1 + group * a2 + query * a3 + cols).to(tl.float32)
    x_b = tl.load(out_b + item * b0 + kv * b1 + group * b2 + query * b3 + cols).to(tl.float32)
    if three:  # a third part (the canvases' prompt rest, own canvas and prefix at once)
        w_c = tl.load(lse_c + item * lc0 + kv * lc1 + group * lc2 + query * lc3)
        top = tl.maximum(tl.maximum(w_a, w_b), w_c)
        w_a, w_b, w_c = tl.exp(w_a - top), tl.exp(w_b - top), tl.exp(w_c - top)
        x_c = tl.load(out_c + item * c0 + kv * c1 + group * c2 + query * c3 + cols).to(tl.float32)
        merged = (x_a * w_a + x_b * w_b + x_c * w_c) / (w_a + w_b + w_c)
    else:
        top = tl.maximum(w_a, w_b)
        w_a, w_b = tl.exp(w_a - top), tl.exp(w_b - top)
        merged = (x_a * w_a + x_b * w_b) / (w_a + w_b)
    tl.store(dst + (row * n_heads + head) * dim + cols, merged.to(dst.dtype.element_ty))


def merge_groups(out_a: Any, lse_a: Any, out_b: Any, lse_b: Any, out_c: Any = None,
                 lse_c: Any = None) -> Any:
    """ops.merge_groups (with ``out_c``/``lse_c``: row_ops.merge_groups3) on CUDA: inputs
    (B, Hk, G, M, D) / (B, Hk, G, M) with unit last stride (D a power of two), output
    (B, M, Hk*G*D)."""
    items, kv, groups, rows, dim = out_a.shape
    out = out_a.new_empty((items, rows, kv * groups * dim))
    three = out_c is not None
    if not three:  # unused arguments of the two-part kernel: the second part's again
        out_c, lse_c = out_b, lse_b
    if out.numel():
        _merge_kernel[(items * rows, kv * groups)](
            out_a, lse_a, out_b, lse_b, out_c, lse_c, out, rows, groups, kv * groups,
            *out_a.stride()[:4], *lse_a.stride(), *out_b.stride()[:4], *lse_b.stride(),
            *out_c.stride()[:4], *lse_c.stride(), dim, three, num_warps=max(1, dim // 256))
    return out


@triton.jit  # type: ignore[untyped-decorator]
def _chunk_merge_kernel(  # type: ignore[no-untyped-def]
        out, lse, dst, dst_lse, n_rows, o0, o1, o2, l0, l1, l2,
        splits: tl.constexpr, dim: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # head * n_rows + query
    head, query = row // n_rows, row % n_rows
    cols = tl.arange(0, dim)
    top = tl.load(lse + head * l1 + query * l2)
    for s in tl.static_range(1, splits):
        top = tl.maximum(top, tl.load(lse + s * l0 + head * l1 + query * l2))
    total = tl.zeros((), dtype=tl.float32)
    acc = tl.zeros((dim,), dtype=tl.float32)
    for s in tl.static_range(splits):  # chunk order, as the torch reference sums
        weight = tl.exp(tl.load(lse + s * l0 + head * l1 + query * l2) - top)
        part = tl.load(out + s * o0 + head * o1 + query * o2 + cols).to(tl.float32)
        acc += part * weight
        total += weight
    tl.store(dst + row * dim + cols, (acc / total).to(dst.dtype.element_ty))
    tl.store(dst_lse + row, top + tl.log(total))


def merge_chunks(out: Any, lse: Any) -> tuple[Any, Any]:
    """split_kv.merge_chunks on CUDA: out (S, Hk, M, D) with unit last stride (D a power of two),
    lse (S, Hk, M) float32 -> (1, Hk, M, D), (1, Hk, M) float32, one program a query row."""
    splits, heads, rows, dim = out.shape
    dst = out.new_empty((1, heads, rows, dim))
    dst_lse = lse.new_empty((1, heads, rows))
    if dst.numel():
        _chunk_merge_kernel[(heads * rows,)](out, lse, dst, dst_lse, rows, *out.stride()[:3],
                                             *lse.stride(), splits, dim, num_warps=max(1, dim // 256))
    return dst, dst_lse
