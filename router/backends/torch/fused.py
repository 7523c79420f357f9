"""One pass over the weights for a DiffusionGemma read: the encoder (rest of the prompt) and the
decoder (canvas) run layer by layer together, and each layer's feed-forward half (dense MLP,
router, experts) runs once over both streams' tokens.

Why: the encoder and decoder share their layer weights, and a read is bound by reading the
~45 GB of expert weights; the two-pass read reads them twice. Within a layer the decoder only
needs the encoder's keys and values of that same layer, so the streams can advance in lockstep.
The feed-forward half is per token, so concatenating the streams changes nothing but the cost.
"""

from __future__ import annotations

from typing import Any

from router.backends.torch.kv_cache import cache_kwarg, select_cache_rows


def ffn_half(layer: Any, attn_out: Any, residual: Any) -> Any:
    """A DiffusionGemma layer after its attention, up to (not including) ``layer_scalar``."""
    hidden = residual + layer.post_attention_layernorm(attn_out)
    residual = hidden
    dense = layer.post_feedforward_layernorm_1(layer.mlp(layer.pre_feedforward_layernorm(hidden)))
    flat = residual.reshape(-1, residual.shape[-1])
    _, top_k_weights, top_k_index = layer.router(flat)
    experts = layer.experts(layer.pre_feedforward_layernorm_2(flat), top_k_index, top_k_weights)
    experts = layer.post_feedforward_layernorm_2(experts.reshape(residual.shape))
    return residual + layer.post_feedforward_layernorm(dense + experts)


def ffn_weights_shared(model: Any) -> bool:
    """True when every encoder layer's feed-forward weights are its decoder twin's (tied)."""
    encoder = model.model.encoder.language_model.layers
    decoder = model.model.decoder.layers
    for enc, dec in zip(encoder, decoder, strict=True):
        for name, param in enc.named_parameters():
            if name.startswith(("self_attn.", "input_layernorm")):  # attention: per stream
                continue
            if param.data_ptr() != dict(dec.named_parameters())[name].data_ptr():
                return False
    return True


class FusedPass:
    """Runs the fused read for a reader; ``ffn`` may be replaced (e.g. by a compiled version)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.encoder = model.model.encoder.language_model
        self.decoder = model.model.decoder
        self.config = self.encoder.config
        self.ffn = ffn_half
        self._cache_kw = cache_kwarg(self.encoder.layers[0].self_attn.forward)

    def __call__(self, batch: Any, cache: Any, rows_identity: bool) -> Any:
        """The decoder's last hidden states (R, C, H); ``cache`` gets the encoder's keys and values
        appended, as the two-pass read does. Unpadded batches only (masks are None or causal)."""
        import torch
        from transformers import masking_utils

        enc_h = self.encoder.embed_tokens(batch.input_ids)
        dec_h = self.decoder.embed_tokens(batch.canvas)
        dec_h = self.decoder.self_conditioning(dec_h, torch.zeros_like(dec_h))
        mask_kw = {"config": self.config, "inputs_embeds": enc_h, "attention_mask": None,
                   "position_ids": batch.position_ids,
                   cache_kwarg(masking_utils.create_causal_mask): cache}
        enc_masks = {"full_attention": masking_utils.create_causal_mask(**mask_kw),
                     "sliding_attention": masking_utils.create_sliding_window_causal_mask(**mask_kw)}
        types = self.config.layer_types
        enc_pe = {t: self.encoder.rotary_emb(enc_h, batch.position_ids, t) for t in set(types)}
        dec_pe = {t: self.decoder.rotary_emb(dec_h, batch.canvas_positions, t) for t in set(types)}
        rows = cache if rows_identity else select_cache_rows(cache, batch.row_item[:0])
        n_enc = enc_h.shape[0] * enc_h.shape[1]
        for index, (enc, dec) in enumerate(zip(self.encoder.layers, self.decoder.layers, strict=True)):
            kind = types[index]
            enc_attn, _ = enc.self_attn(
                hidden_states=enc.input_layernorm(enc_h), position_embeddings=enc_pe[kind],
                attention_mask=enc_masks[kind], position_ids=batch.position_ids,
                **{self._cache_kw: cache})
            if not rows_identity:  # one decoder row per (item, draw): this layer's rows only
                layer = cache.layers[index]
                rows.layers[index].keys = layer.keys.index_select(0, batch.row_item)
                rows.layers[index].values = layer.values.index_select(0, batch.row_item)
            dec_attn, _ = dec.self_attn(
                hidden_states=dec.input_layernorm(dec_h), position_embeddings=dec_pe[kind],
                attention_mask=None, position_ids=batch.canvas_positions,
                **{self._cache_kw: rows})
            hidden = self.ffn(
                enc,
                torch.cat([enc_attn.reshape(n_enc, -1), dec_attn.reshape(-1, dec_h.shape[-1])]),
                torch.cat([enc_h.reshape(n_enc, -1), dec_h.reshape(-1, dec_h.shape[-1])]),
            )
            enc_h = hidden[:n_enc].reshape(enc_h.shape) * enc.layer_scalar
            dec_h = hidden[n_enc:].reshape(dec_h.shape) * dec.layer_scalar
        return self.decoder.norm(dec_h)
