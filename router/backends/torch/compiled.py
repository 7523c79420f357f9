"""Compiled pieces of the one-pass read (fused.py): RMSNorm as one kernel, the q/k/v half of
attention, the log-sum-exp merge, the band softmax of the prefix read and the feed-forward half of
a layer. Each is a torch.compile
of the eager function it replaces, set on one ``OnePass`` instance (transformers is not patched).

Why these: they hold no KV cache and take the layer as an argument, so one compiled graph
(dynamic shapes) serves every layer and every batch; compiling whole layers recompiles per layer.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from router.backends.torch.fused import OnePass, ffn_step, qkv_half, rms_norm, rows_kv
from router.backends.torch.prefix_attention import band_softmax

RECOMPILE_LIMIT = 64  # norms see 2-D to 4-D inputs with and without a scale: more than dynamo's 8


def rms(x: Any, weight: Any, eps: float) -> Any:
    """DiffusionGemmaRMSNorm's arithmetic (transformers runs it as nine kernels)."""
    import torch

    h = x.float()
    h = h * torch.pow(h.pow(2).mean(-1, keepdim=True) + eps, -0.5)
    if weight is not None:
        h = h * weight.float()
    return h.type_as(x)


def compile_pieces(onepass: OnePass, *, backend: str = "inductor", fuse_cats: bool = True,
                   compile_rows_kv: bool = False) -> None:
    """Replace ``onepass``'s norm, q/k/v and feed-forward halves by compiled versions. Compiling
    happens at their first call (warm-up), where a failure surfaces. ``fuse_cats``: the
    feed-forward half is compiled with its streams' concatenation and scaling around it
    (``ffn_step``); without it they run eagerly (the 174.5 reads/s H200 run's read).
    ``compile_rows_kv``: the rows' own keys/values gathered by one compiled copy (``rows_kv``);
    off by default: inductor's kernel for it took 15.5 ms a batch of 32 on an H200 (60 calls),
    where the eager index_select and cat took 4.8 ms."""
    import torch

    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, RECOMPILE_LIMIT)
    fused_rms = torch.compile(rms, dynamic=True, backend=backend)

    def norm(module: Any, hidden: Any) -> Any:
        return fused_rms(hidden, module.weight if module.with_scale else None, module.eps)

    onepass.norm = norm
    onepass.qkv = torch.compile(qkv_half, dynamic=True, backend=backend)
    onepass.ffn = torch.compile(onepass.eager_ffn(), dynamic=True, backend=backend)
    if fuse_cats:
        step = partial(ffn_step, onepass.eager_ffn())
        onepass.ffn_step = torch.compile(step, dynamic=True, backend=backend)
    if compile_rows_kv:
        onepass.rows_kv = torch.compile(rows_kv, dynamic=True, backend=backend)
    if not onepass.merge_op:  # (the op is a kernel already; compiling its call gains nothing)
        onepass.merge = torch.compile(onepass.eager_merge(), dynamic=True, backend=backend)
    onepass.band_softmax = torch.compile(band_softmax, dynamic=True, backend=backend)


def reset_pieces(onepass: OnePass) -> None:
    """Back to the eager functions (the fall-back when compiling fails)."""
    onepass.norm, onepass.qkv, onepass.ffn, onepass.merge = rms_norm, qkv_half, onepass.eager_ffn(), onepass.eager_merge()
    onepass.band_softmax = band_softmax
    onepass.ffn_step, onepass.rows_kv = None, rows_kv
