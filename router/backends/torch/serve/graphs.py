"""CUDA graphs of the one-pass read (onepass.py), captured at start-up for a few shape buckets.

A read is padded up to the smallest bucket that holds it (items, canvas rows, prompt-rest tokens,
labels), its tensors are copied into that bucket's captured inputs, and the graph replays: no
per-kernel launch cost (an eager read launches ~900 kernels). The shared prefix's keys/values sit
in one static buffer of ``prefix_tokens`` capacity that every graph reads; a read whose prefix is
not the one loaded copies it in first. A read no bucket holds returns None (the caller reads
eagerly). With ``capture=False`` the same buffers and padding run eagerly (tests on the CPU).
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from router.backends.torch.model.inputs import FAR, OnePassBatch, PrefixKV
from router.errors import ConfigError

if TYPE_CHECKING:
    from router.backends.torch.options import TorchOptions

log = logging.getLogger(__name__)

# Key slots of the static prefix buffer come in multiples of this: a sliding layer keeps
# window - 1 = 1,023 keys, and an odd key count puts GEMMs and attention kernels on their slow
# unaligned paths (cuBLAS picked sm75 align-1 kernels for the band read at 1,023 keys).
KEY_ALIGN = 16


@dataclass
class _Captured:
    batch: OnePassBatch  # the graph's input tensors
    out: tuple[Any, ...]  # its output tensors (proba, entropy, mass); () when not captured
    graph: Any  # torch.cuda.CUDAGraph, or None when not captured


@dataclass(frozen=True, slots=True)
class GraphShapes:
    """The buckets a reader's graphs hold: ``batches`` item counts, rows per item from ``draws``,
    ``widths`` prompt-rest token counts, prefixes up to ``prefix_tokens``, ``labels`` label slots
    (the backend's alphabet holds at most 128). ``capture``: CUDA graphs (off: the same buffers
    and padding run eagerly, as the CPU tests do)."""

    batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    draws: tuple[int, ...] = (1,)
    widths: tuple[int, ...] = (32, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512)
    prefix_tokens: int = 2048
    labels: int = 128
    capture: bool = True
    def __post_init__(self) -> None:
        for name in ("batches", "draws", "widths"):
            values = tuple(sorted(set(getattr(self, name))))
            if not values or values[0] < 1:
                raise ConfigError(f"graph shapes: {name} must be positive counts, got {values}",
                                  field=f"graph_{name}")
            object.__setattr__(self, name, values)

    @classmethod
    def from_options(cls, options: TorchOptions, *, capture: bool, labels: int) -> GraphShapes:
        """The graph buckets ``options`` ask for: unset, every batch size of the defaults up to
        ``max_batch`` and 1 and ``samples`` draws."""
        default = cls()
        batches = options.graph_batches or [b for b in default.batches if b <= options.max_batch]
        draws = options.graph_draws or sorted({1, options.samples or 1})
        return cls(batches=tuple(b for b in batches if b <= options.max_batch) or (1,),
                   draws=tuple(draws), widths=tuple(options.graph_widths or default.widths),
                   prefix_tokens=options.graph_prefix_tokens, labels=labels, capture=capture)

    def count(self) -> int:
        return len(self.batches) * len(self.draws) * len(self.widths)


class GraphSet:
    """Captured reads for every (items, rows, width) bucket of ``shapes``, for ``reader`` (a
    one-pass DiffusionSlotReader; built by it, filled once by ``warm_up``)."""

    def __init__(self, reader: Any, shapes: GraphShapes) -> None:
        import torch

        if reader.onepass is None:
            raise ValueError("graphs need the one-pass read (tied encoder/decoder weights)")
        self.reader, self.onepass, self.shapes = reader, reader.onepass, shapes
        self.batches, self.draws, self.widths = list(shapes.batches), list(shapes.draws), list(shapes.widths)
        self.labels, self.capture = shapes.labels, shapes.capture
        prefix_tokens = shapes.prefix_tokens
        self.graphs: dict[tuple[int, int, int], _Captured] = {}
        self.pool = torch.cuda.graph_pool_handle() if shapes.capture else None
        # the static prefix buffer every bucket reads, and the prefix ids it holds (None: none)
        self.prefix = self._static_prefix(prefix_tokens)
        self.loaded: tuple[int, ...] | None = None

    def _static_prefix(self, tokens: int) -> PrefixKV:
        import torch

        config, window = self.onepass.config, self.onepass.window
        dtype, device = next(self.reader.model.parameters()).dtype, self.reader.device
        keys, values, positions = [], [], {}
        for index, kind in enumerate(self.onepass.kinds()):
            cap = min(tokens, window - 1) if kind == "sliding_attention" and window > 0 else tokens
            cap = -(-cap // KEY_ALIGN) * KEY_ALIGN  # slots past the prefix stay empty (FAR)
            layer = config.per_layer_config[index]
            shape = (1, int(layer.num_key_value_heads), cap, int(layer.head_dim))
            keys.append(torch.zeros(shape, dtype=dtype, device=device))
            values.append(torch.zeros(shape, dtype=dtype, device=device))
            positions[kind] = torch.full((cap,), FAR, dtype=torch.long, device=device)
        return PrefixKV(keys, values, positions, torch.zeros((), dtype=torch.long, device=device))

    def load(self, prefix_ids: tuple[int, ...], cache: Any) -> bool:
        """Copy a prefix's cached keys/values into the static prefix buffer; False when it does
        not fit."""
        import torch

        if self.loaded == prefix_ids:
            return True
        target = self.prefix
        stored = [layer.keys.shape[2] for layer in cache.layers]
        if any(n > buf.shape[2] for n, buf in zip(stored, target.keys, strict=True)):
            return False
        # Traffic over several questions switches prefix often: few launches. The keys and values
        # go as two multi-tensor copies (one Python call each, not one a layer), and each layer
        # kind's slot positions (shared by its layers) are set once.
        dst = [buf[:, :, :n] for buf, n in zip(target.keys + target.values, stored * 2, strict=True)]
        torch._foreach_copy_(dst, [layer.keys for layer in cache.layers] +
                             [layer.values for layer in cache.layers])
        length = len(prefix_ids)
        for kind, n in dict(zip(self.onepass.kinds(), stored, strict=True)).items():
            pos = target.positions[kind]
            pos.fill_(FAR)
            pos[:n] = torch.arange(length - n, length, device=pos.device)
        target.length.fill_(length)
        self.loaded = prefix_ids
        return True

    def bucket(self, items: Sequence[Any], width: int) -> tuple[int, int, int] | None:
        """The smallest (items, rows, width) bucket holding these items, or None."""
        n_rows = sum(item.draws for item in items)
        b = bisect.bisect_left(self.batches, len(items))
        s = bisect.bisect_left(self.widths, width)
        if b == len(self.batches) or s == len(self.widths):
            return None
        n_items = self.batches[b]
        # as many rows as items only when each item has one draw: such a bucket lays row r for
        # item r, so its canvases read their prompt rests in place (OnePass.in_place)
        rows = [n_items * d for d in self.draws
                if n_items * d >= n_rows and (n_items * d > n_items or n_rows == len(items))]
        if not rows or max(len(item.label_ids) for item in items) > self.labels:
            return None
        return n_items, min(rows), self.widths[s]

    def warm_up(self, prefix_ids: tuple[int, ...], canvas_ids: tuple[int, ...], slot: int) -> None:
        """Run and capture every bucket (compiling what is compiled) with ``prefix_ids`` loaded."""
        from router.backends.torch.serve.reader import SlotItem

        self.loaded = None
        cache = self.reader.prefix_cache(prefix_ids)
        if not self.load(prefix_ids, cache):
            raise ValueError(f"warm-up prefix of {len(prefix_ids)} tokens exceeds prefix_tokens")
        started = time.monotonic()
        for n_items in self.batches:
            for d in self.draws:
                for width in self.widths:
                    items = [SlotItem(prefix_ids, (1,) * width, canvas_ids, slot,
                                      tuple(range(2, 2 + self.labels)), d, seed=k)
                             for k in range(n_items)]
                    self.graphs[(n_items, n_items * d, width)] = self._capture(items, n_items * d, width)
        log.info("torch read: %d graphs ready in %.1f s", len(self.graphs),
                 time.monotonic() - started)

    def onepass_for(self, n_items: int) -> Any:
        """The one-pass read a bucket of ``n_items`` items runs (captured with, replayed as):
        the reader's for that bucket (``KernelChoice.for_read``)."""
        return self.reader.onepass_for(n_items)

    def _capture(self, items: list[Any], n_rows: int, width: int) -> _Captured:
        import torch

        batch = self.reader.prepare_onepass(items, prefix_len=int(self.prefix.length), n_rows=n_rows,
                                            width=width, n_labels=self.labels, device=self.reader.device)
        prefix = self.prefix
        if not self.capture:
            return _Captured(batch, (), None)
        onepass = self.onepass_for(len(items))
        stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        stream.wait_stream(torch.cuda.current_stream())
        with torch.inference_mode(), torch.cuda.stream(stream):
            for _ in range(2):  # compile, autotune and warm the allocator outside the capture
                onepass(prefix, batch)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(graph, pool=self.pool):
            out = onepass(prefix, batch)
        return _Captured(batch, out, graph)

    def run(self, items: Sequence[Any], prefix_ids: tuple[int, ...], cache: Any) -> tuple[Any, Any, Any] | None:
        """(proba, entropy, mass) of the real rows, or None when no bucket holds this read. The
        tensors are the graph's outputs: read them before the next call."""
        width = max(len(item.suffix_ids) for item in items)
        key = self.bucket(items, width)
        if key is None or key not in self.graphs or not self.load(prefix_ids, cache):
            return None
        fresh = self.reader.prepare_onepass(list(items), prefix_len=len(prefix_ids), n_items=key[0],
                                            n_rows=key[1], width=key[2], n_labels=self.labels)
        out = self._replay(self.graphs[key], fresh)
        n_rows = sum(item.draws for item in items)
        return out[0][:n_rows], out[1][:n_rows], out[2][:n_rows]

    def _replay(self, captured: _Captured, fresh: OnePassBatch) -> tuple[Any, ...]:
        """``fresh`` copied into a bucket's inputs, then its graph replayed (or, uncaptured, its
        read run over those inputs): its outputs."""
        for f in fields(OnePassBatch):
            getattr(captured.batch, f.name).copy_(getattr(fresh, f.name), non_blocking=True)
        if captured.graph is None:
            n_items = captured.batch.input_ids.shape[0]
            return self.onepass_for(n_items)(self.prefix, captured.batch)  # type: ignore[no-any-return]
        captured.graph.replay()
        return captured.out
