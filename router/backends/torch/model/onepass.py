"""One pass over the weights for a DiffusionGemma read, attending to a shared prompt prefix once.

The encoder (rest of the prompt) and the decoder (canvas) run layer by layer together, and each
layer's feed-forward half (dense MLP, router, experts) runs once over both streams' tokens. Why:
the two stacks share their layer weights and a read is bound by reading the ~45 GB of expert
weights; within a layer the decoder only needs the encoder's keys/values of that same layer.

Attention is split (attention.py): every query of the batch (prompt rest and canvas, all
rows) attends to the shared prefix's cached keys/values in ONE call over a batch of one, and each
row attends to its own keys (its prompt rest, its canvas) in another; the two merge by their
log-sum-exp. No row copies the prefix, so a batch costs its per-row tokens only. Every shape and
mask is computed on the device from tensors, so the whole read can be captured as a CUDA graph.

Semantics are the model's single unpadded read (tested against transformers' two-pass read):
sliding layers' encoder queries see keys within the window; the decoder's sliding layers see the
last ``window - 1`` prompt tokens (what the DynamicCache keeps) and the whole canvas.

The per-layer functions it calls (norms, q/k/v, feed-forward half) are a ``LayerOps``
(layer_ops.py), fixed when it is built; the joint streams' helpers are joint_streams.py's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from router.backends.torch.kernels.attention import (
    Band,
    attend_band,
    fold_groups,
    group_view,
    to_bias,
    unfold_groups,
)
from router.backends.torch.model.frozen import Frozen
from router.backends.torch.model.inputs import OnePassBatch, PrefixKV
from router.backends.torch.model.joint_streams import (
    QkvStreams,
    joined,
    merged_qkv_weights,
    o_proj_joint,
    qkv_joint,
    weights_shared,
)
from router.backends.torch.model.layer_ops import EAGER, LayerOps


class OnePass(Frozen):
    """The one-pass read of a tied DiffusionGemma with ``ops`` (each computes what its eager
    default does). ``band`` names the layer kinds whose shared prefix is read with ``attend_band``
    under a position band instead of ``ops.attend`` under a dense bias (the same visibility).
    The last layer computes only what the read uses (``last_layer``); the same result, less work.
    ``joint_streams`` (joint_streams.py): each layer's hidden state is both streams' rows end to
    end, normed and projected to q/k/v by one product over a merged copy of the (tied) q/k/v weights
    (``qkv_weights``, made here: the model's parameters are untouched; it follows them only on
    the device they are on now), and their attention outputs projected by one o_proj call; the
    same result, each weight read once (needs tied attention weights: ConfigError otherwise).
    In batches of one canvas row an item, the canvases read their prompt rests' keys where they
    lie and their own canvas unmasked (``in_place``, ``canvas_own``), no per-row copy; the same
    result. (The prompt rests' causal read is one of them: ``ops.attend_causal``, ``causal_own``.)
    Immutable once built: the kernels are chosen before (choice.py), never swapped while serving."""

    def __init__(self, model: Any, ops: LayerOps = EAGER, band: Iterable[str] = (),
                 joint_streams: bool = True,
                 qkv_weights: tuple[tuple[Any, Any], ...] | None = None) -> None:
        self.model = model
        self.encoder = model.model.encoder.language_model
        self.decoder = model.model.decoder
        self.config = self.encoder.config
        self.window = int(self.config.sliding_window or 0)
        self.softcap = self.config.final_logit_softcapping
        self.ops = ops
        self.band = frozenset(band)
        if joint_streams and not weights_shared(model, attention=True):
            from router.errors import ConfigError

            raise ConfigError("kernel choice: joint_streams needs tied encoder/decoder attention "
                              "weights", field="joint_streams")
        self.joint_streams = joint_streams
        self.streams = JointStreams if joint_streams else ApartStreams
        # per layer (tied: the encoder's serve both streams), built before sealing; or another
        # OnePass's over this model (``qkv_weights``), so two readers hold one copy
        if joint_streams and qkv_weights is None:
            qkv_weights = tuple(merged_qkv_weights(layer.self_attn) for layer in self.encoder.layers)
        if joint_streams and len(qkv_weights or ()) != len(self.encoder.layers):
            raise ValueError("qkv_weights: one (weight, bias) per layer")
        self.qkv_weights = qkv_weights if joint_streams and qkv_weights is not None else ()
        self._seal()

    def __call__(self, prefix: PrefixKV | None, batch: OnePassBatch) -> tuple[Any, Any, Any]:
        """(label proba (R, L), full-vocab entropy (R,), label mass (R,)) of every row. ``prefix``:
        the batch's shared prefix (None: the prompt rests are whole prompts). One path through
        the layers: how the streams are projected (``self.streams``), how the prompt rests read
        their own keys (``own_attend``) and how the shared prefix joins (``prefix_part``) are
        chosen before the loop, from this OnePass and the batch's static shapes."""
        import torch

        enc_h = self.encoder.embed_tokens(batch.input_ids)
        dec_h = self.decoder.embed_tokens(batch.canvas)
        dec_h = self.decoder.self_conditioning(dec_h, torch.zeros_like(dec_h))
        width, canvas_len = batch.input_ids.shape[1], batch.canvas.shape[1]
        enc_pos, row_start, row_len = self.positions(prefix, batch)
        dec_pos = (row_start + row_len)[:, None] + torch.arange(canvas_len, device=enc_h.device)
        types = self.kinds()
        rotary = ({t: self.encoder.rotary_emb(enc_h, enc_pos, t) for t in set(types)},
                  {t: self.decoder.rotary_emb(dec_h, dec_pos, t) for t in set(types)})
        masks = self.masks(prefix, batch, enc_pos, row_start, row_len, enc_h.dtype)
        part = prefix_part(self, prefix)
        own = {kind: self.own_attend(kind, width) for kind in set(types)}
        state = self.streams.start(self, (enc_h, dec_h), rotary)
        layers = list(zip(self.encoder.layers, self.decoder.layers, strict=True))
        for index, (enc, dec) in enumerate(layers[:-1]):
            kind = types[index]
            (q_e, k_e, v_e), (q_d, k_d, v_d) = self.streams.qkv(self, index, state, kind)
            q_e, q_d = q_e.contiguous(), q_d.contiguous()  # (views where the streams are joint)
            out_e, lse_e = own[kind](q_e, k_e, v_e, masks.get(("enc", kind)))
            out_d, lse_d = self.canvas_attend(q_d, (k_e, v_e), (k_d, v_d), batch, masks, kind,
                                              merged=part.merged_own)
            attn = part.join(index, (q_e, q_d), (out_e, out_d), (lse_e, lse_d),
                             masks.get(("prefix", kind)))
            state = self.streams.ffn(self, (enc, dec), attn, state)
        (enc, dec), index = layers[-1], len(layers) - 1
        at_slot = self.last_layer(enc, dec, index, state, part, batch, masks)
        return slot_read(self.model, self.softcap, self.decoder.norm(at_slot), batch.label_index,
                         batch.label_valid)

    def own_attend(self, kind: str, width: int) -> Callable[[Any, Any, Any, Any], tuple[Any, Any]]:
        """The prompt rests' attention to their own keys at layer ``kind`` for ``width`` tokens,
        folded (out, lse): causal with no bias where ``causal_own`` holds, else under their
        dense bias (the "enc" mask)."""
        if self.causal_own(kind, width):
            causal = self.ops.attend_causal
            assert causal is not None
            return lambda q, k, v, mask: causal(q, k, v)
        return lambda q, k, v, mask: self.ops.attend(fold_groups(q, k.shape[1]), k, v, mask)

    def positions(self, prefix: PrefixKV | None, batch: OnePassBatch) -> tuple[Any, Any, Any]:
        """The prompt rests' token positions (B, S), the prefix length (0-d) and each canvas
        row's prompt-rest length (R,): an item's tokens follow the prefix."""
        import torch

        device = batch.input_ids.device
        n_items, width = batch.input_ids.shape
        steps = torch.arange(width, device=device)
        row_len = batch.lengths.index_select(0, batch.row_item)
        start = (prefix.length if prefix is not None
                 else torch.zeros((), dtype=torch.long, device=device))
        return (start + steps).unsqueeze(0).expand(n_items, width), start, row_len

    def masks(self, prefix: PrefixKV | None, batch: OnePassBatch, enc_pos: Any,
              row_start: Any, row_len: Any, dtype: Any) -> dict[tuple[str, str], Any]:
        """Additive biases per (part, layer kind), built once per read from lengths on the device
        (the prefix part's a ``Band`` for the kinds in ``band``). Parts: "enc" and "dec" (each
        stream's own keys), "prefix" (every query of the batch to the shared prefix), and "slot"
        and "prefix_slot" for the last layer's kind (one query a canvas row). ``enc_pos`` (B, S):
        the prompt rests' positions; ``row_start`` (0-d): the prefix length."""
        import torch

        device = batch.input_ids.device
        width, canvas_len = batch.input_ids.shape[1], batch.canvas.shape[1]
        groups = {kind: self.config.num_attention_heads // self.kv_heads(kind) for kind in set(self.kinds())}
        last_kind = self.kinds()[-1]
        query = torch.arange(width, device=device)
        own = query[None, :, None] >= query[None, None, :]  # causal over the prompt rest
        real = query[None, None, :] < batch.lengths[:, None, None]
        # decoder: a row reads its prompt rest's real tokens and its whole canvas
        rest = query[None, :] < row_len[:, None]
        last = query[None, :] >= row_len[:, None] - (self.window - 1)  # sliding: last window-1
        canvas = torch.ones((row_len.shape[0], canvas_len), dtype=torch.bool, device=device)
        # a query's lowest visible prefix position under a sliding window: the prompt rest's
        # tokens, then each canvas row's (all its canvas queries share it)
        enc_low = enc_pos.reshape(-1) - (self.window - 1)
        row_low = row_start + row_len - (self.window - 1)
        out: dict[tuple[str, str], Any] = {}
        for kind, g in groups.items():
            sliding = kind == "sliding_attention" and self.window > 0
            enc_vis = own & real
            dec_rest = rest & last if sliding else rest
            if sliding:
                enc_vis = enc_vis & (query[None, :, None] - query[None, None, :] < self.window)
            if not self.causal_own(kind, width):
                out[("enc", kind)] = to_bias(enc_vis, g, dtype)
            if self.in_place(batch):  # the canvases' prompt rests read in place (canvas_own)
                out[("dec_rest", kind)] = to_bias(dec_rest[:, None, :].expand(-1, canvas_len, -1),
                                                  g, dtype)
                if kind == last_kind:
                    out[("slot_rest", kind)] = to_bias(dec_rest[:, None, :], g, dtype)
            else:
                dec_vis = torch.cat([dec_rest, canvas], dim=1)[:, None, :]
                out[("dec", kind)] = to_bias(dec_vis.expand(-1, canvas_len, -1), g, dtype)
                if kind == last_kind:
                    out[("slot", kind)] = to_bias(dec_vis, g, dtype)
            if prefix is None:
                continue
            # (expand, not repeat_interleave: that one syncs with the host, breaking capture)
            low = torch.cat([enc_low, row_low[:, None].expand(-1, canvas_len).reshape(-1)])
            n_rows = row_len.shape[0]
            out[("prefix", kind)] = self.prefix_mask(prefix, kind, g, low if sliding else None,
                                                     enc_low.shape[0] + n_rows * canvas_len, dtype)
            if kind == last_kind:
                out[("prefix_slot", kind)] = self.prefix_mask(
                    prefix, kind, g, row_low if sliding else None, n_rows, dtype)
        return out

    def prefix_mask(self, prefix: PrefixKV, kind: str, groups: int, low: Any | None,
                    n_queries: int, dtype: Any) -> Any:
        """What each of ``n_queries`` queries sees of ``prefix``: the filled slots, from its
        ``low`` position on (sliding layers; None: no lower bound); a ``Band`` for the kinds in
        ``band``, else a bias."""
        key_pos, start = prefix.positions[kind], prefix.length
        if kind in self.band:  # the same visibility as two vectors (attention.Band)
            return Band(key_pos, low.repeat(groups) if low is not None else None, start)
        visible = key_pos[None, :] < start  # filled slots only
        if low is not None:
            visible = visible & (key_pos[None, :] >= low[:, None])
        else:
            visible = visible.expand(n_queries, -1)
        return to_bias(visible.unsqueeze(0), groups, dtype)

    def qkv_joint(self, index: int, rows: Any, rotary: tuple[Any, Any], enc_rows: tuple[int, int],
                  dec_rows: tuple[int, int]) -> QkvStreams:
        """``joint.qkv_joint`` of layer ``index`` with this read's norm and merged q/k/v weights."""
        return qkv_joint(self.encoder.layers[index], self.qkv_weights[index], rows, rotary,
                         enc_rows, dec_rows, norm=self.ops.norm, qkv=self.ops.qkv_merged)

    def causal_own(self, kind: str, width: int) -> bool:
        """Whether layer ``kind``'s prompt rests (``width`` tokens) read their own keys by
        ``ops.attend_causal``: exact when the window does not bind within a prompt rest (a real
        query's causal keys are then exactly its visible ones; a padding query also sees padding
        keys, and nothing reads its output but its own next layer) and the kind's kernel has a
        causal form. Decided per call from static shapes, so a captured graph holds one path."""
        if self.ops.attend_causal is None:
            return False
        index = self.kinds().index(kind)
        if int(self.config.per_layer_config[index].head_dim) in self.ops.no_causal_dims:
            return False
        return kind != "sliding_attention" or self.window <= 0 or width <= self.window

    def canvas_attend(self, query: Any, enc_kv: tuple[Any, Any], dec_kv: tuple[Any, Any],
                      batch: OnePassBatch, masks: dict[tuple[str, str], Any], kind: str, *,
                      slot: bool = False, merged: bool = True) -> tuple[Any, Any]:
        """The canvas rows' (or, ``slot``, their slot queries') attention to their own keys, folded
        (out, lse): in place (``canvas_own``; its two parts unmerged unless ``merged``) where
        ``in_place``, else over per-row copies of their prompt rest's and canvas's keys
        (``rows_kv``) under the dense bias."""
        if self.in_place(batch):
            return self.canvas_own(query, enc_kv, dec_kv,
                                   masks[("slot_rest" if slot else "dec_rest", kind)], merged=merged)
        rows_k, rows_v = self.ops.rows_kv(*enc_kv, *dec_kv, batch.row_item)
        return self.ops.attend(fold_groups(query, dec_kv[0].shape[1]), rows_k, rows_v,
                                  masks[("slot" if slot else "dec", kind)])

    def in_place(self, batch: OnePassBatch) -> bool:
        """Whether the canvases read their item's prompt-rest keys where they lie (no per-row
        copy, ``rows_kv``): when there are as many canvas rows as items.
        The readers lay such batches out row r = item r (diffusion.prepare_onepass: one draw an
        item; graphs.GraphSet.bucket sends batches with more draws to buckets of more rows).
        Decided from static shapes, so a captured graph holds one path."""
        return bool(batch.canvas.shape[0] == batch.input_ids.shape[0])

    def canvas_own(self, query: Any, enc_kv: tuple[Any, Any], dec_kv: tuple[Any, Any],
                   rest_mask: Any, *, merged: bool = True) -> tuple[Any, Any]:
        """The canvas rows' own-key attention in two parts: their item's prompt-rest keys in place
        under ``rest_mask`` and their own canvas's keys with no mask (a canvas sees all of
        itself). ``merged``: as one folded (out, lse), what one read over [prompt rest, canvas]
        gives; else the parts as ((out_rest, out_canvas), (lse_rest, lse_canvas)), which
        ``with_prefix`` merges with the prefix part in one three-part merge (no merged copy)."""
        n_kv = dec_kv[0].shape[1]
        folded = fold_groups(query, n_kv)
        out_c, lse_c = self.ops.attend(folded, *dec_kv, None)
        out_r, lse_r = self.ops.attend(folded, *enc_kv, rest_mask)
        if merged:
            return self.ops.merge_parts(out_r, lse_r, out_c, lse_c)
        return (out_r, out_c), (lse_r, lse_c)

    def with_prefix(self, prefix: PrefixKV, index: int, queries: Sequence[Any],
                        outs: Sequence[Any], lses: Sequence[Any], mask: Any) -> list[Any]:
        """Each stream's attention output merged with its attention to the shared prefix: all
        queries of the batch, laid out as one sequence, read the prefix (batch of one) at once
        under ``mask`` (a bias or a ``Band``). ``queries`` (B, H, M, D) per stream; ``outs``/``lses``:
        each stream's own-key attention in ``fold_groups``' layout, or two parts of it
        (``canvas_own``'s, a pair each), merged with the prefix in one three-part merge. Returned
        as (B, M, H*D), the output projection's input."""
        n_heads = queries[0].shape[1]
        n_kv = prefix.keys[index].shape[1]
        folded = fold_groups(head_major(tuple(queries)).unsqueeze(0), n_kv)
        if isinstance(mask, Band):
            out_p, lse_p = attend_band(folded, prefix.keys[index], prefix.values[index], mask,
                                       self.ops.band_softmax)
        else:
            attend = self.ops.attend_prefix or self.ops.attend
            out_p, lse_p = attend(folded, prefix.keys[index], prefix.values[index], mask)
        g, offset, merged = n_heads // n_kv, 0, []
        for out, lse, q in zip(outs, lses, queries, strict=True):
            part = {"items": q.shape[0], "rows": q.shape[2], "offset": offset}
            prefix_part = (group_view(out_p, g, **part), group_view(lse_p, g, **part))
            if isinstance(out, tuple):  # two own-key parts (canvas_own): one three-part merge
                merged.append(self.ops.merge3(group_view(out[0], g), group_view(lse[0], g),
                                                 group_view(out[1], g), group_view(lse[1], g),
                                                 *prefix_part))
            else:
                merged.append(self.ops.merge(group_view(out, g), group_view(lse, g), *prefix_part))
            offset += q.shape[0] * q.shape[2]
        return merged

    def last_layer(self, enc: Any, dec: Any, index: int, state: Any, part: PrefixPart,
                   batch: OnePassBatch, masks: dict[tuple[str, str], Any]) -> Any:
        """The last layer cut to what the read uses, returning each row's state at its slot (R, E).
        Why it is exact: the read takes the last hidden state at the slot only, and the last
        layer's encoder tokens feed nothing but their keys/values (which the canvas reads); every
        step after attention is per position. So the encoder stops at its keys/values, and the
        decoder runs attention and the feed-forward half for one query a row: of a batch of 32
        reads (8,448 tokens) the feed-forward half runs over 32. ``state``: the streams' state
        after the layers before (``self.streams``)."""
        import torch

        kind = self.kinds()[index]
        (_, k_e, v_e), (q_d, k_d, v_d) = self.streams.qkv(self, index, state, kind)
        rows = torch.arange(q_d.shape[0], device=q_d.device)
        query = q_d[rows, :, batch.slots].unsqueeze(2).contiguous()  # (R, H, 1, D)
        out, lse = self.canvas_attend(query, (k_e, v_e), (k_d, v_d), batch, masks, kind, slot=True,
                                      merged=part.merged_own)
        (out,) = part.join(index, (query,), (out,), (lse,), masks.get(("prefix_slot", kind)))
        attn = dec.self_attn.o_proj(out).flatten(0, 1)  # (R, E)
        dec_h = self.streams.hidden(state)[1]
        return self.ops.ffn(dec, attn, at_slots(dec_h, batch.slots)) * dec.layer_scalar

    def prefix_kv(self, cache: Any, prefix_len: int) -> PrefixKV:
        """Views of a transformers DynamicCache holding an encoded prefix (no copy)."""
        import torch

        keys, values, positions = [], [], {}
        for kind, layer in zip(self.kinds(), cache.layers, strict=True):
            keys.append(layer.keys)
            values.append(layer.values)
            stored = layer.keys.shape[2]  # sliding layers keep the last window - 1 tokens
            positions[kind] = torch.arange(prefix_len - stored, prefix_len, device=layer.keys.device)
        length = torch.tensor(prefix_len, dtype=torch.long, device=keys[0].device)
        return PrefixKV(keys, values, positions, length)

    def kinds(self) -> list[str]:
        return list(self.config.layer_types)

    def kv_heads(self, kind: str) -> int:
        index = self.kinds().index(kind)
        return int(self.config.per_layer_config[index].num_key_value_heads)


class ApartStreams:
    """Each stream normed and projected by its own calls (the streams' state: their hidden
    states, encoder (B, S, E) and decoder (R, C, E), and their rotary tables)."""

    @staticmethod
    def start(onepass: OnePass, hidden: tuple[Any, Any], rotary: tuple[dict[str, Any], dict[str, Any]]) -> Any:
        return hidden, rotary

    @staticmethod
    def qkv(onepass: OnePass, index: int, state: Any, kind: str) -> QkvStreams:
        (enc_h, dec_h), (enc_pe, dec_pe) = state
        enc, dec, ops = onepass.encoder.layers[index], onepass.decoder.layers[index], onepass.ops
        return (ops.qkv(enc.self_attn, ops.norm(enc.input_layernorm, enc_h), *enc_pe[kind]),
                ops.qkv(dec.self_attn, ops.norm(dec.input_layernorm, dec_h), *dec_pe[kind]))

    @staticmethod
    def ffn(onepass: OnePass, layers: tuple[Any, Any], attn: Sequence[Any], state: Any) -> Any:
        (enc, dec), (hidden, rotary) = layers, state
        projected = (enc.self_attn.o_proj(attn[0]), dec.self_attn.o_proj(attn[1]))
        return onepass.ops.ffn_step(enc, projected, hidden, (enc.layer_scalar, dec.layer_scalar)), rotary

    @staticmethod
    def hidden(state: Any) -> tuple[Any, Any]:
        return state[0]  # type: ignore[no-any-return]


class JointStreams:
    """Both streams' rows end to end, (T, E) encoder first, normed and projected by one call over
    the merged q/k/v weights and one o_proj call (joint_streams.py). The state: the rows, the
    streams' shapes and the rotary tables joined the same way."""

    @staticmethod
    def start(onepass: OnePass, hidden: tuple[Any, Any], rotary: tuple[dict[str, Any], dict[str, Any]]) -> Any:
        rows, pe = joined(hidden, *rotary)
        return rows, (hidden[0].shape, hidden[1].shape), pe

    @staticmethod
    def qkv(onepass: OnePass, index: int, state: Any, kind: str) -> QkvStreams:
        rows, (enc_shape, dec_shape), pe = state
        return onepass.qkv_joint(index, rows, pe[kind], enc_shape[:2], dec_shape[:2])

    @staticmethod
    def ffn(onepass: OnePass, layers: tuple[Any, Any], attn: Sequence[Any], state: Any) -> Any:
        (enc, dec), (rows, shapes, pe) = layers, state
        n_enc = shapes[0][0] * shapes[0][1]
        rows = onepass.ops.ffn_joint(enc, o_proj_joint(enc.self_attn, *attn), rows,
                                     (enc.layer_scalar, dec.layer_scalar), n_enc)
        return rows, shapes, pe

    @staticmethod
    def hidden(state: Any) -> tuple[Any, Any]:
        rows, (enc_shape, dec_shape), _ = state
        n_enc = enc_shape[0] * enc_shape[1]
        return rows[:n_enc].view(enc_shape), rows[n_enc:].view(dec_shape)


class PrefixPart:
    """How each stream's own-key attention becomes its attention output, (B, M, H*D): with no
    shared prefix, unfolded as it is (``merged_own``: the canvases' two own-key parts merged);
    with one, merged with every query's read of the prefix (``OnePass.with_prefix``)."""

    merged_own = True

    def __init__(self, onepass: OnePass, prefix: PrefixKV | None) -> None:
        self.onepass, self.prefix = onepass, prefix

    def join(self, index: int, queries: Sequence[Any], outs: Sequence[Any], lses: Sequence[Any],
             mask: Any) -> list[Any]:
        n_heads = queries[0].shape[1]
        return [unfold_groups(out, n_heads).transpose(1, 2).flatten(2) for out in outs]


class SharedPrefixPart(PrefixPart):
    merged_own = False

    def join(self, index: int, queries: Sequence[Any], outs: Sequence[Any], lses: Sequence[Any],
             mask: Any) -> list[Any]:
        assert self.prefix is not None
        return self.onepass.with_prefix(self.prefix, index, queries, outs, lses, mask)


def prefix_part(onepass: OnePass, prefix: PrefixKV | None) -> PrefixPart:
    return PrefixPart(onepass, None) if prefix is None else SharedPrefixPart(onepass, prefix)


def at_slots(hidden: Any, slots: Any) -> Any:
    """Each row's hidden state at its slot: (R, C, ...) -> (R, ...)."""
    import torch

    return hidden[torch.arange(hidden.shape[0], device=hidden.device), slots]


def slot_read(model: Any, softcap: float | None, at_slot: Any, label_index: Any,
              label_valid: Any) -> tuple[Any, Any, Any]:
    """Soft-capped logits of each row's slot state ``at_slot`` (R, E) (``at_slots``): label
    softmax (R, L), full-vocabulary entropy, label mass."""
    import torch

    logits = model.lm_head(at_slot).float()
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    log_p = torch.log_softmax(logits, dim=-1)
    entropy = -(log_p.exp() * log_p).sum(dim=-1)
    label_logits = logits.gather(1, label_index).masked_fill(~label_valid, float("-inf"))
    proba = torch.softmax(label_logits, dim=-1)
    mass = log_p.gather(1, label_index).exp().masked_fill(~label_valid, 0).sum(-1)
    return proba, entropy, mass


def head_major(queries: tuple[Any, ...]) -> Any:
    """Queries (B, H, M, D) of each stream laid end to end head-major, (H, sum B*M, D), as the
    prefix read takes them, in one pass: one cat where every stream's head-major form is a view
    (one item, or a layout that allows it), else each stream copied into its place. Why: a
    reshape of a transposed view copies where the layout asks it, and a cat would then copy all
    of it again; at one item a cat of views is one kernel where the copies would be two."""
    import torch

    n_heads, dim = queries[0].shape[1], queries[0].shape[3]
    views = []
    for q in queries:
        try:
            views.append(q.transpose(0, 1).view(n_heads, -1, dim))
        except RuntimeError:  # not viewable: copy each stream into place
            break
    else:
        return torch.cat(views, dim=1)
    flat = queries[0].new_empty((n_heads, sum(q.shape[0] * q.shape[2] for q in queries), dim))
    at = 0
    for q in queries:
        rows = q.shape[0] * q.shape[2]
        flat[:, at:at + rows].view(n_heads, q.shape[0], q.shape[2], dim).copy_(q.transpose(0, 1))
        at += rows
    return flat
