"""Causal-LM slot read: the next-token logits after the prompt, over the label ids.

The static prefix's KV cache is kept and reused, so a request runs only its state and the answer
tail (right-padded batches).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from router.backends.torch.serve.kv_cache import cache_kwarg, fork_cache
from router.backends.torch.serve.prefix_lru import PrefixLRU
from router.backends.torch.serve.reader import EagerReader, SlotItem, SlotRead


def label_read(logits: Any, items: Sequence[SlotItem]) -> list[SlotRead]:
    """Softmax over each item's label ids of its (n_vocab,) logit row; entropy and label mass
    over the full vocabulary, for the logs."""
    import torch

    log_p = torch.log_softmax(logits.float(), dim=-1)
    entropy = -(log_p.exp() * log_p).sum(dim=-1).cpu().numpy()
    out = []
    for row, item in enumerate(items):
        ids = torch.tensor(item.label_ids, dtype=torch.long, device=logits.device)
        label_logits = logits[row].float().index_select(0, ids)
        proba = torch.softmax(label_logits, dim=-1).cpu().numpy().astype(np.float64)
        mass = float(log_p[row].index_select(0, ids).exp().sum())
        out.append(SlotRead(proba=proba, draws=proba[None, :], entropy_nats=float(entropy[row]),
                            label_mass=mass))
    return out


def softcapped(model: Any, logits: Any) -> Any:
    import torch

    cap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap else logits


class CausalSlotReader(EagerReader):
    """Next-token read after ``prefix_ids + suffix_ids`` (the suffix ends with the answer prefix)."""

    def __init__(self, model: Any, *, pad_id: int = 0, prefix_cache_entries: int = 8,
                 use_prefix_cache: bool = True) -> None:
        self.model = model.eval()
        self.pad_id = pad_id
        self.use_prefix_cache = use_prefix_cache
        self.prefixes = PrefixLRU(max_entries=prefix_cache_entries)
        self.device = next(model.parameters()).device
        self._cache_kw = cache_kwarg(model.get_decoder().forward)
        self._seal()

    def read(self, items: Sequence[SlotItem]) -> list[SlotRead]:
        import torch

        groups: dict[tuple[int, ...], list[int]] = {}
        for index, item in enumerate(items):
            key = item.prefix_ids if self.use_prefix_cache else ()
            groups.setdefault(key, []).append(index)
        out: list[SlotRead | None] = [None] * len(items)
        with torch.inference_mode():
            for prefix, indices in groups.items():
                group = [items[i] for i in indices]
                for i, result in zip(indices, self._read_group(prefix, group)):
                    out[i] = result
        return [r for r in out if r is not None]

    def prefix_cache(self, prefix_ids: tuple[int, ...]) -> Any:
        """The KV cache of ``prefix_ids`` (batch 1), computed once and reused (LRU)."""
        import torch
        from transformers import DynamicCache

        def build() -> Any:
            cache = DynamicCache(config=self.model.config)
            ids = torch.tensor([prefix_ids], dtype=torch.long, device=self.device)
            with torch.inference_mode():
                self.model.get_decoder()(input_ids=ids, use_cache=True, **{self._cache_kw: cache})
            return cache

        return self.prefixes.get_or_build(prefix_ids, build)

    def _read_group(self, prefix: tuple[int, ...], items: list[SlotItem]) -> list[SlotRead]:
        import torch

        seqs = [item.suffix_ids if prefix else item.prefix_ids + item.suffix_ids for item in items]
        lengths = torch.tensor([len(s) for s in seqs])
        width = int(lengths.max())
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), len(prefix) + width), dtype=torch.long)
        mask[:, : len(prefix)] = 1
        for i, seq in enumerate(seqs):
            ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            mask[i, len(prefix) : len(prefix) + len(seq)] = 1
        positions = (len(prefix) + torch.arange(width)).unsqueeze(0).repeat(len(seqs), 1)
        kwargs: dict[str, Any] = {}
        if prefix:
            kwargs[self._cache_kw] = fork_cache(self.prefix_cache(prefix), len(seqs))
        hidden = self.model.get_decoder()(
            input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
            position_ids=positions.to(self.device), use_cache=bool(prefix), **kwargs,
        ).last_hidden_state
        last = hidden[torch.arange(len(seqs)), (lengths - 1).to(self.device)]
        logits = softcapped(self.model, self.model.get_output_embeddings()(last))
        return label_read(logits, items)
