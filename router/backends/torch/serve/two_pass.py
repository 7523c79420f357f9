"""transformers' own two-pass DiffusionGemma read, behind the same port as the one-pass read
(``SlotReader``): the reader for models whose encoder and decoder weights are not tied (the one
pass needs them tied), and the reference every one-pass form is tested against.

A read encodes the prompt rests onto a fork of the static prefix's cached encoder KV (expanded
to the batch, never written), copies each canvas row's item's cache rows, runs one decoder step
and reads the slot's soft-capped logits over the label ids. Its batch is the one-pass read's
(batch.py ``prepare_batch``), turned into transformers' inputs here (``TwoPassInputs``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from router.backends.torch.model.frozen import Frozen
from router.backends.torch.model.inputs import OnePassBatch
from router.backends.torch.model.onepass import at_slots, slot_read
from router.backends.torch.serve.batch import (
    PrefixEncoder,
    Rows,
    prepare_batch,
    read_in_groups,
    slot_reads,
)
from router.backends.torch.serve.kv_cache import cache_kwarg, fork_cache, select_cache_rows
from router.backends.torch.serve.prefix_lru import PrefixLRU
from router.backends.torch.serve.reader import SlotItem, SlotRead


@dataclass(frozen=True)
class TwoPassInputs:
    """transformers' inputs of one batch: positions of the prompt rests (B, S) and the canvases
    (R, C), and the padding masks (None when no prompt rest is padded)."""

    position_ids: Any
    encoder_mask: Any  # (B, P+S) bool or None
    canvas_positions: Any
    decoder_mask: Any  # (R, P+S+C) bool or None

    @classmethod
    def of(cls, batch: OnePassBatch, prefix_len: int) -> TwoPassInputs:
        import torch

        n_items, width = batch.input_ids.shape
        device, canvas_len = batch.input_ids.device, batch.canvas.shape[1]
        steps = torch.arange(width, device=device)
        row_len = batch.lengths.index_select(0, batch.row_item)
        canvas_positions = (prefix_len + row_len)[:, None] + torch.arange(canvas_len, device=device)
        encoder_mask = decoder_mask = None
        if bool((batch.lengths < width).any()):
            real = steps[None, :] < batch.lengths[:, None]
            encoder_mask = torch.cat([torch.ones((n_items, prefix_len), dtype=torch.bool, device=device),
                                      real], dim=1)
            decoder_mask = torch.cat([encoder_mask.index_select(0, batch.row_item),
                                      torch.ones((row_len.shape[0], canvas_len), dtype=torch.bool,
                                                 device=device)], dim=1)
        return cls((prefix_len + steps).unsqueeze(0).expand(n_items, width), encoder_mask,
                   canvas_positions, decoder_mask)


class TwoPassSlotReader(Frozen):
    """transformers' two-pass read of any DiffusionGemma (see the module's docstring); keeps up
    to ``prefix_cache_entries`` prefix caches (``prefixes``: another reader's). Eager: nothing
    to compile or warm up. Not thread-safe: the backend serialises calls."""

    compiled = False
    needs_warm_up = False
    batch_sizes: tuple[int, ...] = ()

    def __init__(self, model: Any, *, prefix_cache_entries: int = 8, use_prefix_cache: bool = True,
                 pad_id: int = 0, prefixes: PrefixLRU | None = None) -> None:
        self.model = model.eval()
        self.use_prefix_cache = use_prefix_cache
        self.pad_id = pad_id
        self.prefixes = prefixes if prefixes is not None else PrefixLRU(max_entries=prefix_cache_entries)
        self.prefix_cache = PrefixEncoder(model, self.prefixes)
        text_config = model.config.get_text_config()
        self.vocab_size = int(text_config.vocab_size)
        self.softcap = text_config.final_logit_softcapping
        self.encoder, self.decoder = model.model.encoder, model.model.decoder
        self._encoder_cache_kw = cache_kwarg(self.encoder.forward)
        self._decoder_cache_kw = cache_kwarg(self.decoder.forward)
        self.device = next(model.parameters()).device
        self._seal()

    def warm_up(self, sample: SlotItem) -> TwoPassSlotReader:
        return self

    def read(self, items: Sequence[SlotItem]) -> list[SlotRead]:
        """Every item read; items sharing a prefix and canvas width run as one batch."""
        return read_in_groups(items, self._read_group)

    def _read_group(self, items: list[SlotItem]) -> list[SlotRead]:
        prefix = items[0].prefix_ids if self.use_prefix_cache else ()
        batch = prepare_batch(items, prefix_len=len(prefix), vocab_size=self.vocab_size,
                              pad_id=self.pad_id, device=self.device)
        return slot_reads(items, self.forward(batch, self.prefix_cache(prefix) if prefix else None,
                                              len(prefix)))

    def forward(self, batch: OnePassBatch, base_cache: Any | None, prefix_len: int) -> Rows:
        """Encode the prompt rests onto a fork of ``base_cache`` (a new cache when None), run one
        decoder step, and return (label proba (R, L), full-vocab entropy (R,), label mass (R,))."""
        inputs = TwoPassInputs.of(batch, prefix_len)
        n_items = batch.input_ids.shape[0]
        cache = fork_cache(base_cache, n_items) if base_cache is not None else self.prefix_cache.new_cache()
        self.encoder(input_ids=batch.input_ids, attention_mask=inputs.encoder_mask,
                     position_ids=inputs.position_ids, **{self._encoder_cache_kw: cache})
        hidden = self.decoder(
            decoder_input_ids=batch.canvas, decoder_position_ids=inputs.canvas_positions,
            decoder_attention_mask=inputs.decoder_mask,
            **{self._decoder_cache_kw: select_cache_rows(cache, batch.row_item)},
        ).last_hidden_state
        return slot_read(self.model, self.softcap, at_slots(hidden, batch.slots), batch.label_index,
                         batch.label_valid)
