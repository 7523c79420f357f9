"""The shared prefix's attention with its keys cut into chunks that run as the batch of one
attention call (split-KV, as FlashAttention's decoding kernels split a long key set), merged by
their log-sum-exps.

Why: a single read's prefix read is one batch of folded queries (576 at head dim 256) over 1,024
sliding key slots: cuDNN runs it as fewer thread blocks than a Hopper GPU has SMs, each looping
over every slot. Cut into S chunks that are the call's batch, it is S times the blocks, each an S-th of the
loop; the chunks' (out, lse) then merge exactly as the attention parts do (attention.py).
Only small reads gain (a batch of 32 already fills the GPU many times over), so the choice
applies it to reads of at most ``KernelChoice.split_kv_items`` items (choice.py).

The chunks are views: the query expanded over the chunk axis (stride 0), the keys, values and
bias strided in place; nothing is copied.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from router.backends.torch.kernels.attention import (
    Attend,
    attend_by_dim,
    attend_math,
    to_bias,
)

# default_choice's on CUDA: the prefix read in this many key chunks for reads of at most this many
# items (measured by bench.attention_kernels --splits and bench.gpu_read --split-kv-items)
SPLIT_KV_CHUNKS = 4
SPLIT_KV_ITEMS = 1

# (chunks' out (S, Hk, M, D), lse (S, Hk, M) float32) -> (out (1, Hk, M, D), lse (1, Hk, M))
MergeChunks = Callable[[Any, Any], tuple[Any, Any]]


def merge_chunks(out: Any, lse: Any) -> tuple[Any, Any]:
    """Key chunks' outputs (S, Hk, M, D) and log-sum-exps (S, Hk, M) of the same queries as one
    part over all the keys: (1, Hk, M, D) in ``out``'s dtype and its float32 log-sum-exp
    (1, Hk, M). Float32 arithmetic, rounded once (attention.py's merge, over a chunk axis)."""
    import torch

    top = lse.amax(0, keepdim=True)
    weight = torch.exp(lse - top)
    total = weight.sum(0, keepdim=True)
    merged = (out.float() * weight[..., None]).sum(0, keepdim=True) / total[..., None]
    return merged.to(out.dtype), top + torch.log(total)


def chunked(x: Any, splits: int) -> Any:
    """(1, H, N, E) -> (S, H, N/S, E), a view: chunk s holds positions [s*N/S, (s+1)*N/S)."""
    return x[0].unflatten(1, (splits, x.shape[2] // splits)).transpose(0, 1)


def chunked_bias(bias: Any, splits: int) -> Any:
    """(1, 1, M, N) -> (S, 1, M, N/S), a view: chunk s's bias over keys [s*N/S, (s+1)*N/S)."""
    return bias[0].unflatten(-1, (splits, bias.shape[-1] // splits)).permute(2, 0, 1, 3)


def chunk_count(n_keys: int, splits: int) -> int:
    """The largest count of equal chunks, at most ``splits``, that ``n_keys`` keys cut into."""
    return next(count for count in range(max(splits, 1), 0, -1) if n_keys % count == 0)


def attend_split(q: Any, k: Any, v: Any, bias: Any, *, attend: Attend, splits: int,
                 merge: MergeChunks = merge_chunks) -> tuple[Any, Any]:
    """``attend`` over a batch-of-one key set (the shared prefix) in up to ``splits`` key chunks,
    merged: the same (out (1, Hk, M, D), lse (1, Hk, M)) as ``attend(q, k, v, bias)``. ``bias``
    (1, 1, M, N) or None (no mask). The chunks are equal: their count is the largest divisor of
    N up to ``splits`` (a graph bucket's 1,024 sliding slots: 4; an eager read's 1,023 filled
    ones: 3; a prime N: 1, read whole, as is a batch of more than one)."""
    n_keys = k.shape[2]
    splits = chunk_count(n_keys, splits) if q.shape[0] == 1 else 1
    if splits == 1:
        return attend(q, k, v, bias)
    part_bias = chunked_bias(bias, splits) if bias is not None else None
    out, lse = attend(q.expand(splits, -1, -1, -1), chunked(k, splits), chunked(v, splits), part_bias)
    return merge(out, lse)


def split_attend(attend: Attend, splits: int, merge: MergeChunks) -> Attend:
    """``attend`` as ``attend_split`` with ``splits`` chunks."""

    def prefix_attend(q: Any, k: Any, v: Any, mask: Any) -> tuple[Any, Any]:
        return attend_split(q, k, v, mask, attend=attend, splits=splits, merge=merge)

    return prefix_attend


@functools.cache
def split_problem(names: tuple[tuple[int, str], ...], splits: int, device: Any, dtype: Any) -> str:
    """Why the kernels ``names`` gives each head dim cannot read a prefix in ``splits`` chunks on
    ``device`` ("" when they can): a kernel refusing the chunks' strided views (the query's
    batch stride is 0) or the split read disagreeing with the whole one by ``attend_math``, on a
    bias that masks a whole chunk for some queries. A pure check, memoised (``TorchBackend``
    asks it again to list a failure for ``/readyz``)."""
    import torch

    attend = attend_by_dim(names)
    for dim, name in names:
        try:
            gen = torch.Generator(device=device).manual_seed(0)
            q = torch.randn((1, 2, 48, dim), generator=gen, device=device, dtype=dtype) / dim**0.5
            k, v = (torch.randn((1, 2, 16 * splits, dim), generator=gen, device=device, dtype=dtype)
                    for _ in range(2))
            visible = torch.rand((1, 24, 16 * splits), generator=gen, device=device) > 0.3
            visible[:, :12, :16] = False  # the first chunk unseen by half the queries
            bias = to_bias(visible, 2, dtype)
            ref_out, ref_lse = attend_math(q, k, v, bias)
            out, lse = attend_split(q, k, v, bias, attend=attend, splits=splits)
            err = float((out.float() - ref_out.float()).norm() / ref_out.float().norm())
            lse_err = float((lse.float() - ref_lse).abs().max())
        except (RuntimeError, TypeError, AttributeError, NotImplementedError, ValueError) as exc:
            return f"{name} at head dim {dim}: unavailable ({type(exc).__name__}: {str(exc)[:160]})"
        if not (err < 2e-2 and lse_err < 2e-2):
            return f"{name} at head dim {dim}: disagrees (rel err {err:.3g}, lse err {lse_err:.3g})"
    return ""
