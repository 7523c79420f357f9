"""The one-pass DiffusionGemma slot read (model/onepass.py) of a tied ``DiffusionGemmaForBlockDiffusion``.

The static prefix's encoder KV cache is kept and reused across requests, the canvas holds the
answer template with uniform random noise at the slot only, one decoder step runs (in the same
pass over the weights as the prompt rests' encoding), and the slot's soft-capped logits are read
over the label ids. Models whose encoder and decoder weights are not tied are read by
two_pass.py's reader, behind the same port (build.py picks).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from router.backends.torch.model.choice import KernelChoice, build_layer_ops, default_choice
from router.backends.torch.model.frozen import Frozen
from router.backends.torch.model.inputs import OnePassBatch
from router.backends.torch.model.joint_streams import weights_shared
from router.backends.torch.model.onepass import OnePass
from router.backends.torch.serve.batch import (
    PrefixEncoder,
    Rows,
    prepare_batch,
    read_in_groups,
    slot_reads,
)
from router.backends.torch.serve.graphs import GraphSet, GraphShapes
from router.backends.torch.serve.prefix_lru import PrefixLRU
from router.backends.torch.serve.reader import SlotItem, SlotRead, SlotReader
from router.errors import ConfigError


class DiffusionSlotReader(Frozen):
    """The one-pass read of a tied DiffusionGemma; keeps up to ``prefix_cache_entries`` prefix
    caches (keyed by their token ids; ``prefixes`` shares another reader's; ``qkv_weights``
    another reader's merged q/k/v copies, onepass.OnePass, else made here when joint_streams asks).
    ``choice`` (default: the device's, choice.py ``default_choice``) fixes the kernels its one
    pass runs. ``graphs`` (graphs.py), when given, are the shapes whose reads ``warm_up`` captures
    as CUDA graphs (padded, uncaptured on the CPU). Immutable once built. Not thread-safe: the
    backend serialises calls. A model whose encoder and decoder weights are not tied is refused
    (ConfigError): two_pass.py reads it."""

    def __init__(
        self, model: Any, *, choice: KernelChoice | None = None, graphs: GraphShapes | None = None,
        prefix_cache_entries: int = 8, use_prefix_cache: bool = True, pad_id: int = 0,
        prefixes: PrefixLRU | None = None, qkv_weights: Any = None,
    ) -> None:
        if not weights_shared(model, attention=False):
            raise ConfigError("the one-pass read needs tied encoder/decoder weights (two_pass.py "
                              "reads other models)", field="model")
        self.model = model.eval()
        self.use_prefix_cache = use_prefix_cache
        self.pad_id = pad_id
        self.prefixes = prefixes if prefixes is not None else PrefixLRU(max_entries=prefix_cache_entries)
        self.prefix_cache = PrefixEncoder(model, self.prefixes)
        text_config = model.config.get_text_config()
        self.vocab_size = int(text_config.vocab_size)
        self.device = next(model.parameters()).device
        self.choice = choice if choice is not None else default_choice(model)
        self.choice.check(layer_kinds=set(text_config.layer_types), device=self.device)
        # the eager read of few items (below: ``passes``, one per distinct read-level choice)
        single = self.choice.for_read(1)
        self.onepass = OnePass(model, build_layer_ops(single), single.band, single.joint_streams,
                               qkv_weights or None)
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
        return DiffusionSlotReader(self.model, choice=choice,
                                   graphs=self.graph_shapes if graphs else None,
                                   use_prefix_cache=self.use_prefix_cache, pad_id=self.pad_id,
                                   prefixes=self.prefixes,
                                   qkv_weights=self.onepass.qkv_weights if choice.joint_streams else None)

    def warm_up(self, sample: SlotItem) -> SlotReader:
        from router.backends.torch.serve.warm_up import warm_up

        return warm_up(self, sample) if self.needs_warm_up else self

    def read(self, items: Sequence[SlotItem]) -> list[SlotRead]:
        """Read every item; items sharing a prefix and canvas width run as one batch."""
        return read_in_groups(items, self._read_group)

    def _read_group(self, items: list[SlotItem]) -> list[SlotRead]:
        return slot_reads(items, self.read_onepass(items, items[0].prefix_ids if self.use_prefix_cache else ()))

    def read_onepass(self, items: list[SlotItem], prefix: tuple[int, ...]) -> Rows:
        """The one-pass read of one group: a captured graph when one holds its shape, else eager."""
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
        """The read's tensors (batch.py ``prepare_batch``) with this reader's vocabulary and pad id."""
        return prepare_batch(items, prefix_len=prefix_len, vocab_size=self.vocab_size,
                             pad_id=self.pad_id, n_items=n_items, n_rows=n_rows, width=width,
                             n_labels=n_labels, device=device)
