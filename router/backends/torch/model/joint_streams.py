"""Both streams of a one-pass read as one (onepass.py, ``OnePass.joint_streams``): each layer's
hidden state is the encoder's rows (prompt rests) and the decoder's (canvases) end to end, (T, E)
encoder first. Each layer norms it once, projects it to q/k/v by one product over a merged copy of
the tied q/k/v weights, splits the result into each stream's attention shapes as views, projects
both streams' attention outputs by one o_proj call and runs its feed-forward half over the rows
in place. Why: the encoder's and the decoder's layer weights are tied, so each weight is then
read once a layer instead of once a stream. The same result as the streams apart (tested).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

ATTENTION_WEIGHTS = ("self_attn.", "input_layernorm")  # a layer's attention half: per stream


def weights_shared(model: Any, *, attention: bool) -> bool:
    """True when every encoder layer's weights of one half are its decoder twin's (tied, as
    transformers ties them): with ``attention``, its attention weights and input norm (what
    ``joint_streams`` needs); without, all the others, its feed-forward half (what the one pass
    needs)."""
    encoder = model.model.encoder.language_model.layers
    decoder = model.model.decoder.layers
    for enc, dec in zip(encoder, decoder, strict=True):
        twin = dict(dec.named_parameters())
        for name, param in enc.named_parameters():
            if name.startswith(ATTENTION_WEIGHTS) != attention:
                continue
            if param.data_ptr() != twin[name].data_ptr():
                return False
    return True


def joined(hidden: tuple[Any, Any], enc_pe: dict[str, Any],
           dec_pe: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Both streams' hidden states (B, S, E) and (R, C, E) as T rows end to end (T, E),
    encoder first, and per layer kind their rotary cos/sin the same way, as (T, 1, D): once
    per read."""
    import torch

    rows = torch.cat([h.flatten(0, 1) for h in hidden])
    pe = {kind: tuple(torch.cat([e.flatten(0, 1), d.flatten(0, 1)]).unsqueeze(1)
                      for e, d in zip(enc_pe[kind], dec_pe[kind], strict=True))
          for kind in enc_pe}
    return rows, pe


def merged_qkv_weights(attn: Any) -> tuple[Any, Any]:
    """An attention module's q/k/v projections as one (weight, bias) (bias None when it has none):
    ``cat([q, k, v])`` by output rows, or ``cat([q, k])`` where ``v_proj`` is None (the keys serve
    as values). A copy beside the module's parameters, which stay as they are; why: one product a
    layer reads the hidden rows once instead of three times (``qkv_merged``)."""
    import torch

    projections = [p for p in (attn.q_proj, attn.k_proj, attn.v_proj) if p is not None]
    biases = [p.bias for p in projections]
    if any(b is None for b in biases) and any(b is not None for b in biases):  # one config flag
        raise ValueError("q/k/v projections with and without a bias: not merged")
    with torch.no_grad():
        weight = torch.cat([p.weight.detach() for p in projections])
        bias = torch.cat([b.detach() for b in biases]) if biases[0] is not None else None
    return weight, bias


def qkv_merged(attn: Any, weight: Any, bias: Any, hidden: Any, cos: Any,
               sin: Any) -> tuple[Any, Any, Any]:
    """``layer_ops.qkv_half`` with q, k (and v) as ONE product over ``merged_qkv_weights``'
    ``weight`` and ``bias``, split by output columns, then normed and rotated exactly as ``qkv_half`` does."""
    from torch.nn.functional import linear
    from transformers.models.diffusion_gemma.modeling_diffusion_gemma import apply_rotary_pos_emb

    shape = (*hidden.shape[:-1], -1, attn.head_dim)
    n_q, n_k = attn.q_proj.weight.shape[0], attn.k_proj.weight.shape[0]
    mixed = linear(hidden, weight, bias)  # (..., n_q + n_k [+ n_v]): views of it split it
    query = attn.q_norm(mixed[..., :n_q].view(shape))
    query = apply_rotary_pos_emb(query, cos, sin, unsqueeze_dim=2).transpose(1, 2)
    key = mixed[..., n_q:n_q + n_k].view(shape)
    value = mixed[..., n_q + n_k:].view(shape) if attn.v_proj is not None else key
    key = apply_rotary_pos_emb(attn.k_norm(key), cos, sin, unsqueeze_dim=2).transpose(1, 2)
    return query.contiguous(), key, attn.v_norm(value).transpose(1, 2)


def split_streams(x: Any, enc_rows: tuple[int, int], dec_rows: tuple[int, int]) -> tuple[Any, Any]:
    """``qkv_half``'s output over both streams' T rows as one-token sequences (T, H, 1, D) as the
    encoder's (B, H, S, D) and the decoder's (R, H, C, D) views (``enc_rows`` (B, S), ``dec_rows``
    (R, C)), no copy."""
    rows = x.squeeze(2)
    n_enc = enc_rows[0] * enc_rows[1]
    return (rows[:n_enc].unflatten(0, enc_rows).transpose(1, 2),
            rows[n_enc:].unflatten(0, dec_rows).transpose(1, 2))


QkvStreams = tuple[tuple[Any, Any, Any], tuple[Any, Any, Any]]


def qkv_joint(layer: Any, qkv_weights: tuple[Any, Any], rows: Any, rotary: tuple[Any, Any],
              enc_rows: tuple[int, int], dec_rows: tuple[int, int], *,
              norm: Callable[[Any, Any], Any], qkv: Callable[..., tuple[Any, Any, Any]]) -> QkvStreams:
    """Each stream's (queries, keys, values) of ``layer`` as ``qkv_half`` gives them, from ONE
    ``norm`` and ONE q/k/v product (``qkv``, ``qkv_merged`` or its compiled form, over the layer's
    ``qkv_weights``) over both streams' ``rows`` (T, E) as T one-token sequences (the weights are
    tied: each is read once); queries are views (``contiguous`` where needed)."""
    normed = norm(layer.input_layernorm, rows).unsqueeze(1)  # (T, 1, E)
    q, k, v = qkv(layer.self_attn, *qkv_weights, normed, *rotary)  # (T, H, 1, D)
    (q_e, q_d), (k_e, k_d), (v_e, v_d) = (split_streams(x, enc_rows, dec_rows) for x in (q, k, v))
    return (q_e, k_e, v_e), (q_d, k_d, v_d)


def o_proj_joint(attn: Any, out_e: Any, out_d: Any) -> Any:
    """Both streams' attention outputs (B, S, H*D) and (R, C, H*D) projected by ONE o_proj
    call over their rows end to end, (T, E) encoder first (tied weights, read once). The
    concatenation is the copy ``ffn_joint`` otherwise makes after o_proj."""
    import torch

    return attn.o_proj(torch.cat([out_e.flatten(0, 1), out_d.flatten(0, 1)]))


def ffn_joint(ffn: Any, layer: Any, attn: Any, hidden: Any, scalars: tuple[Any, Any],
              n_enc: int) -> Any:
    """``layer_ops.ffn_step`` over a hidden state kept as both streams' rows end to end, (T, E) with
    the encoder's ``n_enc`` first (``joined``); ``attn``: both streams' attention outputs the
    same way (T, E), from one o_proj call (``o_proj_joint``). Returns the next hidden state, each
    stream's rows scaled by its layer's ``layer_scalar``. Why: the next layer's norm and q/k/v
    read it whole, uncopied."""
    import torch

    out = ffn(layer, attn, hidden)
    return torch.cat([out[:n_enc] * scalars[0], out[n_enc:] * scalars[1]])
