"""The functions a one-pass read calls per layer (``LayerOps``), and their eager defaults: the
norms, the q/k/v half, the feed-forward half over both streams and the rows' own keys. choice.py
swaps in compiled and kernel versions that compute the same (compiled.py, row_ops.py, triton_moe.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from router.backends.torch.kernels.attention import (
    Attend,
    attend_math,
    band_softmax,
    merge_grouped,
    merge_grouped3,
    merge_parts,
)
from router.backends.torch.model.joint_streams import ffn_joint, qkv_merged

if TYPE_CHECKING:
    from router.backends.torch.kernels.row_ops import RowOps


def ffn_half(layer: Any, attn_out: Any, residual: Any) -> Any:
    """A DiffusionGemma layer after its attention, up to (not including) ``layer_scalar``."""
    return _ffn(layer, attn_out, residual, layer.experts)


def ffn_half_rows(layer: Any, attn_out: Any, residual: Any, ops: RowOps | None = None) -> Any:
    """``ffn_half`` with the experts' token permutation as two row-copy ops (moe.py), ``ops``'
    (default: the torch references)."""
    from router.backends.torch.kernels.moe import experts_forward
    from router.backends.torch.kernels.row_ops import TORCH_OPS

    row_ops = ops if ops is not None else TORCH_OPS

    def experts(hidden: Any, top_k_index: Any, top_k_weights: Any) -> Any:
        return experts_forward(layer.experts, hidden, top_k_index, top_k_weights, row_ops)

    return _ffn(layer, attn_out, residual, experts)


def ffn_half_fused(layer: Any, attn_out: Any, residual: Any) -> Any:
    """``ffn_half`` with the experts as one fused Triton MoE (triton_moe.py: gather, gate/up GEMM
    with the activation, down GEMM, weighted sum) and the router's softmax/top-k tail as one
    Triton kernel (triton_router.py)."""
    from router.backends.torch.kernels import triton_moe, triton_router

    def experts(hidden: Any, top_k_index: Any, top_k_weights: Any) -> Any:
        return triton_moe.fused_moe(hidden, layer.experts.gate_up_proj, layer.experts.down_proj,
                                    top_k_index, top_k_weights)

    return _ffn(layer, attn_out, residual, experts, route=triton_router.route)


def route_module(router: Any, flat: Any) -> tuple[Any, Any]:
    """transformers' router module itself: its (top_k_weights, top_k_index) of the rows ``flat``."""
    _, top_k_weights, top_k_index = router(flat)
    return top_k_weights, top_k_index


def _ffn(layer: Any, attn_out: Any, residual: Any, experts: Any,
         route: Callable[[Any, Any], tuple[Any, Any]] = route_module) -> Any:
    hidden = residual + layer.post_attention_layernorm(attn_out)
    residual = hidden
    dense = layer.post_feedforward_layernorm_1(layer.mlp(layer.pre_feedforward_layernorm(hidden)))
    flat = residual.reshape(-1, residual.shape[-1])
    top_k_weights, top_k_index = route(layer.router, flat)
    experts = experts(layer.pre_feedforward_layernorm_2(flat), top_k_index, top_k_weights)
    experts = layer.post_feedforward_layernorm_2(experts.reshape(residual.shape))
    return residual + layer.post_feedforward_layernorm(dense + experts)


def ffn_step(ffn: Any, layer: Any, attn: tuple[Any, Any], hidden: tuple[Any, Any],
             scalars: tuple[Any, Any]) -> tuple[Any, Any]:
    """One layer's feed-forward half over both streams: their attention outputs and residuals
    (encoder (B, S, E), decoder (R, C, E)) laid end to end as rows, ``ffn`` run once, and each
    stream's part scaled by its layer's ``layer_scalar``. Compiled whole (compiled.py), the two
    concatenations fuse into the first norm's kernel and the scalings into the last add."""
    import torch

    (enc_attn, dec_attn), (enc_h, dec_h) = attn, hidden
    n_enc, width = enc_h.shape[0] * enc_h.shape[1], enc_h.shape[-1]
    out = ffn(layer, torch.cat([enc_attn.reshape(n_enc, -1), dec_attn.reshape(-1, width)]),
              torch.cat([enc_h.reshape(n_enc, -1), dec_h.reshape(-1, width)]))
    return out[:n_enc].reshape(enc_h.shape) * scalars[0], out[n_enc:].reshape(dec_h.shape) * scalars[1]


def rows_kv(k_e: Any, v_e: Any, k_d: Any, v_d: Any, row_item: Any) -> tuple[Any, Any]:
    """Each canvas row's own keys/values: its item's prompt-rest keys then its canvas keys
    (R, H_kv, S + C, D). Eager, also in a compiled read (compiled.py says why)."""
    import torch

    return (torch.cat([k_e.index_select(0, row_item), k_d], dim=2),
            torch.cat([v_e.index_select(0, row_item), v_d], dim=2))


def qkv_half(attn: Any, hidden: Any, cos: Any, sin: Any) -> tuple[Any, Any, Any]:
    """An attention module's queries (B, H, M, D) and keys/values (B, H_kv, M, D), normed and
    rotated exactly as transformers' DiffusionGemma attention does before its cache update."""
    from transformers.models.diffusion_gemma.modeling_diffusion_gemma import apply_rotary_pos_emb

    shape = (*hidden.shape[:-1], -1, attn.head_dim)
    query = attn.q_norm(attn.q_proj(hidden).view(shape))
    query = apply_rotary_pos_emb(query, cos, sin, unsqueeze_dim=2).transpose(1, 2)
    key = attn.k_proj(hidden).view(shape)
    value = attn.v_proj(hidden).view(shape) if attn.v_proj is not None else key
    key = apply_rotary_pos_emb(attn.k_norm(key), cos, sin, unsqueeze_dim=2).transpose(1, 2)
    return query.contiguous(), key, attn.v_norm(value).transpose(1, 2)


def rms_norm(norm: Any, hidden: Any) -> Any:
    """A DiffusionGemmaRMSNorm module applied (the eager default of ``OnePass.norm``)."""
    return norm(hidden)


@dataclass(frozen=True, slots=True)
class LayerOps:
    """The functions one ``OnePass`` calls, fixed when it is built (choice.py ``build_layer_ops``):
    the eager defaults, or compiled / kernel versions that compute the same (compiled.py, row_ops.py)."""

    norm: Callable[[Any, Any], Any]  # (RMSNorm module, hidden) -> normed
    qkv: Callable[[Any, Any, Any, Any], tuple[Any, Any, Any]]  # (attention, hidden, cos, sin)
    ffn: Callable[..., Any]  # (layer, attention out, residual): ffn_half(_rows, _fused)
    # both streams' feed-forward half: apart (layer, attns, hiddens, scalars), ``ffn_step`` over
    # ``ffn``; joint (layer, attn rows, rows, scalars, n_enc), ``joint_streams.ffn_joint``
    ffn_step: Callable[..., tuple[Any, Any]]
    rows_kv: Callable[[Any, Any, Any, Any, Any], tuple[Any, Any]]
    merge: Callable[[Any, Any, Any, Any], Any]  # grouped views -> (B, M, H*D)
    attend: Attend
    band_softmax: Callable[[Any, Any, Any, Any, Any], tuple[Any, Any]]
    ffn_joint: Callable[..., Any]
    # (attention, merged weight, merged bias, hidden, cos, sin): joint_streams' q/k/v product
    qkv_merged: Callable[..., tuple[Any, Any, Any]] = qkv_merged
    # (queries (B, H, S, D), keys, values (B, H_kv, S, D)) -> folded (out, lse): the prompt rests'
    # own keys read causally with no bias (KernelChoice.causal_own; None: always the dense bias),
    # except at ``no_causal_dims`` (head dims whose kernel has no causal form)
    attend_causal: Callable[[Any, Any, Any], tuple[Any, Any]] | None = None
    no_causal_dims: frozenset[int] = frozenset()
    # two parts' folded (out, lse) -> one (OnePass.canvas_own: a canvas's own canvas and its
    # prompt rest read in place, merged so where no prefix follows)
    merge_parts: Callable[[Any, Any, Any, Any], tuple[Any, Any]] = merge_parts
    # three grouped parts -> (B, M, H*D): the canvases' two own-key parts and the prefix at once
    merge3: Callable[..., Any] = merge_grouped3
    # the shared prefix's attention under a bias (None: ``attend``): split_kv's chunked read
    # (KernelChoice.prefix_splits)
    attend_prefix: Attend | None = None


EAGER = LayerOps(norm=rms_norm, qkv=qkv_half, ffn=ffn_half, ffn_step=partial(ffn_step, ffn_half),
               rows_kv=rows_kv, merge=merge_grouped, attend=attend_math, band_softmax=band_softmax,
               ffn_joint=partial(ffn_joint, ffn_half))
"""The reference forms: what every op of ops.py replaces with its fast form when switched on."""
