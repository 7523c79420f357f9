"""DiffusionGemma one-step slot read on a transformers ``DiffusionGemmaForBlockDiffusion``.

The prompt is encoded into the encoder's KV cache (a static prefix's cache is kept and reused
across requests), the canvas holds the answer template with uniform random noise at the slot only,
one decoder step runs, and the slot's soft-capped logits are read over the label ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from router.backends.base import DRAW_SEED_STRIDE
from router.backends.torch.model.choice import KernelChoice, build_layer_ops, default_choice
from router.backends.torch.model.frozen import Frozen
from router.backends.torch.model.inputs import OnePassBatch
from router.backends.torch.model.joint_streams import weights_shared
from router.backends.torch.model.onepass import OnePass, at_slots, slot_read
from router.backends.torch.serve.graphs import GraphSet, GraphShapes
from router.backends.torch.serve.kv_cache import cache_kwarg, fork_cache, select_cache_rows
from router.backends.torch.serve.prefix_lru import PrefixLRU
from router.backends.torch.serve.reader import SlotItem, SlotRead, SlotReader
from router.errors import ConfigError


@dataclass
class GroupBatch:
    """Device tensors for one forward over items that share a prefix and a canvas width."""

    input_ids: Any  # (B, S) prompt ids after the cached prefix (the whole prompt when uncached)
    position_ids: Any  # (B, S)
    encoder_mask: Any  # (B, P+S) bool, or None when no row is padded
    canvas: Any  # (R, C) one row per (item, draw)
    canvas_positions: Any  # (R, C)
    decoder_mask: Any  # (R, P+S+C) bool, or None
    row_item: Any  # (R,) which item each canvas row reads for
    slots: Any  # (R,)
    label_index: Any  # (R, L) label ids, padded with 0
    label_valid: Any  # (R, L) bool


def draw_noise(*, seed: int, draw: int, vocab_size: int, count: int) -> list[int]:
    """The uniform noise ids for one draw, from a CPU generator so reads repeat across devices."""
    import torch

    generator = torch.Generator().manual_seed(seed + DRAW_SEED_STRIDE * draw)
    return torch.randint(0, vocab_size, (count,), generator=generator).tolist()


class DiffusionSlotReader(Frozen):
    """Reads slots from one DiffusionGemma model; keeps up to ``prefix_cache_entries`` prefix
    caches (keyed by their token ids; ``prefixes`` shares another reader's; ``qkv_weights``
    another reader's merged q/k/v copies, onepass.OnePass, else made here when joint_streams asks).
    ``choice`` (default: the device's, choice.py ``default_choice``) fixes its kernels: the
    one-pass read (onepass.py) or transformers' two-pass read, and what the one pass runs. ``graphs`` (graphs.py), when given,
    are the shapes whose reads ``warm_up`` captures as CUDA graphs (padded, uncaptured on the CPU).
    Immutable once built. Not thread-safe: the backend serialises calls."""

    def __init__(
        self, model: Any, *, choice: KernelChoice | None = None, graphs: GraphShapes | None = None,
        prefix_cache_entries: int = 8, use_prefix_cache: bool = True, pad_id: int = 0,
        prefixes: PrefixLRU | None = None, qkv_weights: Any = None,
    ) -> None:
        self.model = model.eval()
        self.use_prefix_cache = use_prefix_cache
        self.pad_id = pad_id
        self.prefixes = prefixes if prefixes is not None else PrefixLRU(max_entries=prefix_cache_entries)
        text_config = model.config.get_text_config()
        self.text_config = text_config
        self.vocab_size = int(text_config.vocab_size)
        self.softcap = text_config.final_logit_softcapping
        self.encoder = model.model.encoder
        self.decoder = model.model.decoder
        self._encoder_cache_kw = cache_kwarg(self.encoder.forward)
        self._decoder_cache_kw = cache_kwarg(self.decoder.forward)
        self.device = next(model.parameters()).device
        self.choice = choice if choice is not None else default_choice(model)
        self.choice.check(layer_kinds=set(text_config.layer_types), device=self.device)
        if self.choice.fused_pass and not weights_shared(model, attention=False):
            raise ConfigError("kernel choice: fused_pass needs tied encoder/decoder weights",
                              field="fused_pass")
        # the eager read of few items (below: ``passes``, one per distinct read-level choice)
        single = self.choice.for_read(1)
        self.onepass = (OnePass(model, build_layer_ops(single), single.band, single.joint_streams,
                                qkv_weights or None)
                        if self.choice.fused_pass else None)
        if graphs is not None and self.onepass is None:
            raise ConfigError("graph shapes need the one-pass read (fused_pass)", field="graph_batches")
        # the one-pass reads by item count (choice.for_read: the streams apart past
        # joint_streams_items, the prefix whole past split_kv_items), over the same weights and
        # merged q/k/v copies, one OnePass per distinct choice
        self.passes = self._passes(graphs.batches if graphs is not None else ())
        if graphs is not None and graphs.capture and self.device.type != "cuda":
            raise ConfigError("graph capture needs a CUDA device", field="capture")
        self.graph_shapes = graphs
        self.graphs = GraphSet(self, graphs) if graphs is not None else None
        self._seal()

    def _passes(self, batches: tuple[int, ...]) -> dict[KernelChoice, OnePass]:
        if self.onepass is None:
            return {}
        out = {self.choice.for_read(1): self.onepass}
        wanted = [self.choice.for_read(n) for n in batches]
        # eager reads past a read-level limit (joint_streams_items, split_kv_items) read otherwise
        wanted += [self.choice.for_read(n) for n in self.choice.read_thresholds()]
        for choice in wanted:
            if choice not in out:
                out[choice] = OnePass(self.model, build_layer_ops(choice), choice.band,
                                      choice.joint_streams, self.onepass.qkv_weights or None)
        return out

    def onepass_for(self, n_items: int) -> OnePass:
        """The one-pass read of ``n_items`` items (eager, or the one a graph bucket of that many
        items is captured with and replays)."""
        return self.passes[self.choice.for_read(n_items)]

    @property
    def compiled(self) -> bool:
        return self.choice.compiled

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """The graph buckets' item counts (a read is padded up to one); () without graphs."""
        return self.graph_shapes.batches if self.graph_shapes is not None else ()

    @property
    def needs_warm_up(self) -> bool:
        return self.choice.compiled or self.graphs is not None

    def rebuilt(self, choice: KernelChoice, *, graphs: bool = True) -> DiffusionSlotReader:
        """A twin over the same model and prefix caches with ``choice`` (and this one's graph
        shapes, unless ``graphs`` is False)."""
        # the merged q/k/v copies (joint_streams) follow the model: a twin shares them too
        merged = self.onepass.qkv_weights if self.onepass is not None else ()
        return DiffusionSlotReader(self.model, choice=choice,
                                   graphs=self.graph_shapes if graphs else None,
                                   use_prefix_cache=self.use_prefix_cache, pad_id=self.pad_id,
                                   prefixes=self.prefixes,
                                   qkv_weights=merged if choice.joint_streams else None)

    def warm_up(self, sample: SlotItem) -> SlotReader:
        from router.backends.torch.serve.warm_up import warm_up

        return warm_up(self, sample) if self.needs_warm_up else self

    # -- public -------------------------------------------------------------------------
    def read(self, items: Sequence[SlotItem]) -> list[SlotRead]:
        """Read every item; items sharing a prefix and canvas width run as one batch."""
        import torch

        groups: dict[tuple[Any, ...], list[int]] = {}
        for index, item in enumerate(items):
            groups.setdefault((item.prefix_ids, len(item.canvas_ids)), []).append(index)
        out: list[SlotRead | None] = [None] * len(items)
        with torch.inference_mode():
            for indices in groups.values():
                group = [items[i] for i in indices]
                for i, result in zip(indices, self._read_group(group)):
                    out[i] = result
        return [r for r in out if r is not None]

    def prefix_cache(self, prefix_ids: tuple[int, ...]) -> Any:
        """The encoder KV cache of ``prefix_ids`` (batch 1), encoded once and then reused."""
        import torch

        def build() -> Any:
            cache = self.new_cache()
            ids = torch.tensor([prefix_ids], dtype=torch.long, device=self.device)
            positions = torch.arange(len(prefix_ids), device=self.device).unsqueeze(0)
            with torch.inference_mode():
                self.encoder(input_ids=ids, position_ids=positions,
                             **{self._encoder_cache_kw: cache})
            return cache

        return self.prefixes.get_or_build(prefix_ids, build)

    def new_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache(config=self.text_config)

    # -- one group ------------------------------------------------------------------------
    def _read_group(self, items: list[SlotItem]) -> list[SlotRead]:
        prefix = items[0].prefix_ids if self.use_prefix_cache else ()
        if self.onepass is not None:
            proba, entropy, mass = self.read_onepass(items, prefix)
        else:
            base = self.prefix_cache(prefix) if prefix else None
            proba, entropy, mass = self.forward(self.prepare(items, prefix_len=len(prefix)), base)
        proba_np = proba.float().cpu().numpy()
        entropy_np = entropy.float().cpu().numpy()
        mass_np = mass.float().cpu().numpy()
        results, row = [], 0
        for item in items:
            n = len(item.label_ids)
            draws = proba_np[row : row + item.draws, :n]
            results.append(
                SlotRead(
                    proba=draws.mean(axis=0),
                    draws=draws,
                    entropy_nats=float(entropy_np[row : row + item.draws].mean()),
                    label_mass=float(mass_np[row : row + item.draws].mean()),
                )
            )
            row += item.draws
        return results

    def read_onepass(self, items: list[SlotItem], prefix: tuple[int, ...]) -> tuple[Any, Any, Any]:
        """The one-pass read of one group: a captured graph when one holds its shape, else eager."""
        assert self.onepass is not None
        cache = self.prefix_cache(prefix) if prefix else None
        if self.graphs is not None and cache is not None:
            replayed = self.graphs.run(items, prefix, cache)
            if replayed is not None:
                return replayed
        kv = self.onepass.prefix_kv(cache, len(prefix)) if cache is not None else None
        onepass = self.onepass_for(len(items))
        return onepass(kv, self.prepare_onepass(items, prefix_len=len(prefix), device=self.device))

    def prepare_onepass(self, items: list[SlotItem], *, prefix_len: int, n_items: int = 0,
                        n_rows: int = 0, width: int = 0, n_labels: int = 0,
                        device: Any = None) -> OnePassBatch:
        """The one-pass read's tensors (on ``device``, else the CPU), padded up to ``n_items``
        items (length-1 fillers), ``n_rows`` canvas rows (reading item 0), ``width`` prompt
        tokens and ``n_labels`` labels; a padded row's outputs are never read."""
        import torch

        seqs = [item.suffix_ids if prefix_len else item.prefix_ids + item.suffix_ids for item in items]
        rows = [(i, draw) for i, item in enumerate(items) for draw in range(item.draws)]
        n_items, n_rows = max(n_items, len(items)), max(n_rows, len(rows))
        width = max(width, *(len(seq) for seq in seqs))
        n_labels = max(n_labels, *(len(item.label_ids) for item in items))
        canvas_len = len(items[0].canvas_ids)
        # Written row by row into numpy arrays, then wrapped: torch's per-row tensor writes are
        # slower, and this host work is serial with the GPU read (bench.host_path times it).
        # Padding items are length-1 fillers; padding rows read item 0's slot 0 and one label.
        ids = np.full((n_items, width), self.pad_id, dtype=np.int64)
        lengths = np.ones(n_items, dtype=np.int64)
        for i, seq in enumerate(seqs):
            ids[i, : len(seq)] = seq
            lengths[i] = len(seq)
        canvas = np.full((n_rows, canvas_len), self.pad_id, dtype=np.int64)
        row_item = np.zeros(n_rows, dtype=np.int64)
        slots = np.zeros(n_rows, dtype=np.int64)
        label_index = np.zeros((n_rows, n_labels), dtype=np.int64)
        label_valid = np.zeros((n_rows, n_labels), dtype=np.bool_)
        label_valid[:, 0] = True  # padded rows read one label: a finite softmax
        for r, (i, draw) in enumerate(rows):
            item = items[i]
            canvas[r] = item.canvas_ids
            # The model has no mask token: uniform noise at the slot is the mask.
            canvas[r, item.slot] = draw_noise(seed=item.seed, draw=draw, vocab_size=self.vocab_size,
                                              count=1)[0]
            row_item[r], slots[r] = i, item.slot
            label_index[r, : len(item.label_ids)] = item.label_ids
            label_valid[r, : len(item.label_ids)] = True
        batch = OnePassBatch(*(torch.from_numpy(a) for a in (ids, lengths, canvas, row_item, slots,
                                                              label_index, label_valid)))
        if device is not None:
            batch = OnePassBatch(*(getattr(batch, f).to(device) for f in batch.__dataclass_fields__))
        return batch

    def prepare(self, items: list[SlotItem], *, prefix_len: int) -> GroupBatch:
        """Pad the prompts (right), noise the canvases, and move everything to the device."""
        import torch

        seqs = [
            list(item.suffix_ids) if prefix_len else list(item.prefix_ids + item.suffix_ids)
            for item in items
        ]
        lengths = [len(s) for s in seqs]
        width = max(lengths)
        padded = any(n < width for n in lengths)
        ids = torch.full((len(items), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(items), prefix_len + width), dtype=torch.bool)
        mask[:, :prefix_len] = True
        for i, seq in enumerate(seqs):
            ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            mask[i, prefix_len : prefix_len + len(seq)] = True
        canvas_len = len(items[0].canvas_ids)
        canvases, positions, row_item, slots, labels = [], [], [], [], []
        for i, item in enumerate(items):
            for draw in range(item.draws):
                canvas = list(item.canvas_ids)
                # The model has no mask token: uniform noise at the slot is the mask.
                canvas[item.slot] = draw_noise(
                    seed=item.seed, draw=draw, vocab_size=self.vocab_size, count=1
                )[0]
                canvases.append(canvas)
                start = prefix_len + lengths[i]
                positions.append(list(range(start, start + canvas_len)))
                row_item.append(i)
                slots.append(item.slot)
                labels.append(list(item.label_ids))
        n_labels = max(len(lab) for lab in labels)
        label_index = torch.zeros((len(labels), n_labels), dtype=torch.long)
        label_valid = torch.zeros((len(labels), n_labels), dtype=torch.bool)
        for r, lab in enumerate(labels):
            label_index[r, : len(lab)] = torch.tensor(lab, dtype=torch.long)
            label_valid[r, : len(lab)] = True
        rows = torch.tensor(row_item, dtype=torch.long)
        decoder_mask = None
        if padded:
            decoder_mask = torch.cat(
                [mask[rows], torch.ones((len(rows), canvas_len), dtype=torch.bool)], dim=1
            )
        dev = self.device
        return GroupBatch(
            input_ids=ids.to(dev),
            position_ids=(prefix_len + torch.arange(width)).unsqueeze(0).repeat(len(items), 1).to(dev),
            encoder_mask=mask.to(dev) if padded else None,
            canvas=torch.tensor(canvases, dtype=torch.long, device=dev),
            canvas_positions=torch.tensor(positions, dtype=torch.long, device=dev),
            decoder_mask=decoder_mask.to(dev) if decoder_mask is not None else None,
            row_item=rows.to(dev),
            slots=torch.tensor(slots, dtype=torch.long, device=dev),
            label_index=label_index.to(dev),
            label_valid=label_valid.to(dev),
        )

    def forward(self, batch: GroupBatch, base_cache: Any | None) -> tuple[Any, Any, Any]:
        """transformers' two-pass read: encode the rest of the prompt onto a fork of
        ``base_cache``, run one decoder step, and return (label proba (R, L), full-vocab entropy
        (R,), label mass (R,))."""
        n_items = batch.input_ids.shape[0]
        cache = fork_cache(base_cache, n_items) if base_cache is not None else self.new_cache()
        self.encoder(
            input_ids=batch.input_ids,
            attention_mask=batch.encoder_mask,
            position_ids=batch.position_ids,
            **{self._encoder_cache_kw: cache},
        )
        rows_cache = select_cache_rows(cache, batch.row_item)
        hidden = self.decoder(
            decoder_input_ids=batch.canvas,
            decoder_position_ids=batch.canvas_positions,
            decoder_attention_mask=batch.decoder_mask,
            **{self._decoder_cache_kw: rows_cache},
        ).last_hidden_state
        return self.slot_read(hidden, batch)

    def slot_read(self, hidden: Any, batch: GroupBatch) -> tuple[Any, Any, Any]:
        return slot_read(self.model, self.softcap, at_slots(hidden, batch.slots),
                         batch.label_index, batch.label_valid)
