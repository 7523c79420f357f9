"""Compiled pieces of the one-pass read (onepass.py, layer_ops.py): RMSNorm as one kernel, the q/k/v
half of attention (per stream, and over a merged q/k/v weight for ``joint_streams``), the
log-sum-exp merge, the band softmax of the prefix read and the feed-forward half of a layer. Each is a
torch.compile of the eager function it replaces, in a new ``LayerOps`` that one ``OnePass`` is built
with (transformers is not patched, no piece is swapped afterwards).

Why these: they hold no KV cache and take the layer as an argument, so one compiled graph
(dynamic shapes) serves every layer and every batch; compiling whole layers recompiles per layer.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any

from router.backends.torch.model.joint_streams import ffn_joint
from router.backends.torch.model.layer_ops import LayerOps, ffn_step

RECOMPILE_LIMIT = 64  # norms see 2-D to 4-D inputs with and without a scale: more than dynamo's 8


def rms(x: Any, weight: Any, eps: float) -> Any:
    """DiffusionGemmaRMSNorm's arithmetic (transformers runs it as nine kernels)."""
    import torch

    h = x.float()
    h = h * torch.pow(h.pow(2).mean(-1, keepdim=True) + eps, -0.5)
    if weight is not None:
        h = h * weight.float()
    return h.type_as(x)


def rms_eps(norm: Any) -> float:
    """A DiffusionGemmaRMSNorm's epsilon: ``eps`` up to transformers 5.24, ``variance_epsilon``
    from 5.25 (the pin is ``>=5.0``, and the device image has 5.17)."""
    return float(norm.variance_epsilon if hasattr(norm, "variance_epsilon") else norm.eps)


def compile_layer_ops(eager: LayerOps, *, backend: str = "inductor",
                      merge_op: bool = False) -> LayerOps:
    """``eager`` with its norm, q/k/v, merge, band softmax and feed-forward halves compiled, the
    feed-forward half with its streams' concatenation and scaling around it (``ffn_step``;
    ``ffn_joint`` for ``joint_streams``), so they fuse into its first and last kernels. Compiling
    happens at their first call (warm-up), where a failure surfaces. The rows' own keys/values
    (``rows_kv``) stay eager: inductor's copy for them was slower than the eager index_select and
    cat. ``merge_op``: the merge is an op (a kernel already; compiling its call gains nothing),
    kept as it is."""
    import torch

    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, RECOMPILE_LIMIT)
    fused_rms = torch.compile(rms, dynamic=True, backend=backend)

    def norm(module: Any, hidden: Any) -> Any:
        return fused_rms(hidden, module.weight if module.with_scale else None, rms_eps(module))

    def compiled(fn: Any) -> Any:
        return torch.compile(fn, dynamic=True, backend=backend)

    return replace(
        eager, norm=norm, qkv=compiled(eager.qkv), qkv_merged=compiled(eager.qkv_merged),
        ffn=compiled(eager.ffn),
        ffn_step=compiled(partial(ffn_step, eager.ffn)),
        ffn_joint=compiled(partial(ffn_joint, eager.ffn)),
        merge=eager.merge if merge_op else compiled(eager.merge),
        merge3=eager.merge3 if merge_op else compiled(eager.merge3),
        merge_parts=compiled(eager.merge_parts),
        band_softmax=compiled(eager.band_softmax))
