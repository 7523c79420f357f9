"""What both DiffusionGemma readers share (diffusion.py's one-pass read, two_pass.py's
transformers read): a read's items laid out as ONE batch of tensors (``prepare_batch``), the
canvases' slot noise (``draw_noise``), items grouped by prefix and canvas width
(``read_in_groups``), each group's rows turned back into ``SlotRead``s (``slot_reads``) and the
static prefixes' encoder caches (``PrefixEncoder``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from router.backends.base import DRAW_SEED_STRIDE
from router.backends.torch.model.inputs import OnePassBatch
from router.backends.torch.serve.kv_cache import cache_kwarg
from router.backends.torch.serve.prefix_lru import PrefixLRU
from router.backends.torch.serve.reader import SlotItem, SlotRead

Rows = tuple[Any, Any, Any]  # (label proba (R, L), full-vocab entropy (R,), label mass (R,))


def draw_noise(*, seed: int, draw: int, vocab_size: int, count: int) -> list[int]:
    """The uniform noise ids for one draw, from a CPU generator so reads repeat across devices."""
    import torch

    generator = torch.Generator().manual_seed(seed + DRAW_SEED_STRIDE * draw)
    return torch.randint(0, vocab_size, (count,), generator=generator).tolist()


def prepare_batch(items: Sequence[SlotItem], *, prefix_len: int, vocab_size: int, pad_id: int,
                  n_items: int = 0, n_rows: int = 0, width: int = 0, n_labels: int = 0,
                  device: Any = None) -> OnePassBatch:
    """A read's tensors (on ``device``, else the CPU): the prompt rests (the whole prompts when
    ``prefix_len`` is 0) right-padded, one canvas row an (item, draw) with uniform noise at its
    slot (the model has no mask token: the noise is the mask), padded up to ``n_items`` items
    (length-1 fillers), ``n_rows`` canvas rows (reading item 0), ``width`` prompt tokens and
    ``n_labels`` labels; a padded row's outputs are never read."""
    import torch

    seqs = [item.suffix_ids if prefix_len else item.prefix_ids + item.suffix_ids for item in items]
    rows = [(i, draw) for i, item in enumerate(items) for draw in range(item.draws)]
    n_items, n_rows = max(n_items, len(items)), max(n_rows, len(rows))
    width = max(width, *(len(seq) for seq in seqs))
    n_labels = max(n_labels, *(len(item.label_ids) for item in items))
    # Written row by row into numpy arrays, then wrapped: torch's per-row tensor writes are
    # slower, and this host work is serial with the GPU read (bench.host_path times it).
    ids = np.full((n_items, width), pad_id, dtype=np.int64)
    lengths = np.ones(n_items, dtype=np.int64)
    for i, seq in enumerate(seqs):
        ids[i, : len(seq)] = seq
        lengths[i] = len(seq)
    canvas = np.full((n_rows, len(items[0].canvas_ids)), pad_id, dtype=np.int64)
    row_item = np.zeros(n_rows, dtype=np.int64)
    slots = np.zeros(n_rows, dtype=np.int64)
    label_index = np.zeros((n_rows, n_labels), dtype=np.int64)
    label_valid = np.zeros((n_rows, n_labels), dtype=np.bool_)
    label_valid[:, 0] = True  # padded rows read one label: a finite softmax
    for r, (i, draw) in enumerate(rows):
        item = items[i]
        canvas[r] = item.canvas_ids
        canvas[r, item.slot] = draw_noise(seed=item.seed, draw=draw, vocab_size=vocab_size, count=1)[0]
        row_item[r], slots[r] = i, item.slot
        label_index[r, : len(item.label_ids)] = item.label_ids
        label_valid[r, : len(item.label_ids)] = True
    arrays = (ids, lengths, canvas, row_item, slots, label_index, label_valid)
    return OnePassBatch(*(torch.from_numpy(a).to(device) if device is not None else torch.from_numpy(a)
                          for a in arrays))


def read_in_groups(items: Sequence[SlotItem],
                   read_group: Callable[[list[SlotItem]], list[SlotRead]]) -> list[SlotRead]:
    """``read_group`` over the items that share a prefix and a canvas width (one batch each),
    the results back in the items' order."""
    import torch

    groups: dict[tuple[Any, ...], list[int]] = {}
    for index, item in enumerate(items):
        groups.setdefault((item.prefix_ids, len(item.canvas_ids)), []).append(index)
    out: list[SlotRead | None] = [None] * len(items)
    with torch.inference_mode():
        for indices in groups.values():
            for i, result in zip(indices, read_group([items[i] for i in indices]), strict=True):
                out[i] = result
    return [r for r in out if r is not None]


def slot_reads(items: Sequence[SlotItem], rows: Rows) -> list[SlotRead]:
    """Each item's ``SlotRead`` from its rows (one a draw, in item order): the mean of its draws."""
    proba, entropy, mass = (t.float().cpu().numpy() for t in rows)
    results, row = [], 0
    for item in items:
        draws = proba[row : row + item.draws, : len(item.label_ids)]
        results.append(SlotRead(proba=draws.mean(axis=0), draws=draws,
                                entropy_nats=float(entropy[row : row + item.draws].mean()),
                                label_mass=float(mass[row : row + item.draws].mean())))
        row += item.draws
    return results


class PrefixEncoder:
    """The encoder KV caches of static prefixes (batch 1), each encoded once and kept in ``lru``."""

    def __init__(self, model: Any, lru: PrefixLRU) -> None:
        self.encoder = model.model.encoder
        self.text_config = model.config.get_text_config()
        self.device = next(model.parameters()).device
        self.lru = lru
        self.cache_kw = cache_kwarg(self.encoder.forward)

    def __call__(self, prefix_ids: tuple[int, ...]) -> Any:
        import torch

        def build() -> Any:
            cache = self.new_cache()
            ids = torch.tensor([prefix_ids], dtype=torch.long, device=self.device)
            positions = torch.arange(len(prefix_ids), device=self.device).unsqueeze(0)
            with torch.inference_mode():
                self.encoder(input_ids=ids, position_ids=positions, **{self.cache_kw: cache})
            return cache

        return self.lru.get_or_build(prefix_ids, build)

    def new_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache(config=self.text_config)
