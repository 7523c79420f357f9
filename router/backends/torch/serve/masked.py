"""Masked-LM slot read: the logits at the ``[MASK]`` position, over the label ids. The whole
prompt runs per request (bidirectional attention cannot reuse a prefix's states)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from router.backends.torch.serve.causal import label_read
from router.backends.torch.serve.reader import EagerReader, SlotItem, SlotRead


class MaskedSlotReader(EagerReader):
    """Fills the ``[MASK]`` in ``prefix_ids + suffix_ids`` (the last mask token is the slot)."""

    def __init__(self, model: Any, *, mask_id: int, pad_id: int = 0) -> None:
        self.model = model.eval()
        self.mask_id = mask_id
        self.pad_id = pad_id
        self.device = next(model.parameters()).device
        self._seal()

    def read(self, items: Sequence[SlotItem]) -> list[SlotRead]:
        import torch

        seqs = [item.prefix_ids + item.suffix_ids for item in items]
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        slots = []
        for i, seq in enumerate(seqs):
            ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            mask[i, : len(seq)] = 1
            positions = [p for p, token in enumerate(seq) if token == self.mask_id]
            if not positions:
                raise ValueError("a masked-LM prompt has no mask token")
            slots.append(positions[-1])
        with torch.inference_mode():
            logits = self.model(input_ids=ids.to(self.device),
                                attention_mask=mask.to(self.device)).logits
            at_slot = logits[torch.arange(len(seqs)), torch.tensor(slots)]
            return label_read(at_slot, items)
