"""CUDA graphs of the one-pass read (fused.py), captured at start-up for a few shape buckets.

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
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from router.backends.torch.coalescer import bucket_take, padded_size
from router.backends.torch.read_inputs import FAR, OnePassBatch, PrefixGroups, PrefixKV
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
    prefix: PrefixKV | PrefixGroups  # what it reads: the first static buffer, or all (mixed)


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
    # Buckets of several questions (0: none): ``mixed_groups`` static prefix buffers, and buckets
    # of G groups of g one-draw items (read_inputs.PrefixGroups; TorchOptions.mixed_question_reads)
    # for G = 2, 4, ... below ``mixed_groups`` and ``mixed_groups`` itself, and every g of
    # ``batches`` whose G groups fit in the largest batch (``mixed_buckets``)
    mixed_groups: int = 0
    # A read's fixed cost in items' worth (TorchOptions.fixed_cost_items): a mixed bucket reads a
    # batch only where it costs less than one bucket a question (``mixed_pays``)
    fixed_cost_items: float = 4.0

    def __post_init__(self) -> None:
        for name in ("batches", "draws", "widths"):
            values = tuple(sorted(set(getattr(self, name))))
            if not values or values[0] < 1:
                raise ConfigError(f"graph shapes: {name} must be positive counts, got {values}",
                                  field=f"graph_{name}")
            object.__setattr__(self, name, values)
        if self.mixed_groups == 1 or self.mixed_groups < 0:
            raise ConfigError(f"graph shapes: mixed_groups must be 0 (none) or at least 2, got "
                              f"{self.mixed_groups}", field="graph_mixed_groups")

    @classmethod
    def from_options(cls, options: TorchOptions, *, capture: bool, labels: int) -> GraphShapes:
        """The graph buckets ``options`` ask for: unset, every batch size of the defaults up to
        ``max_batch`` and 1 and ``samples`` draws; with ``mixed_question_reads``, the buckets of
        ``graph_mixed_groups`` questions too."""
        default = cls()
        batches = options.graph_batches or [b for b in default.batches if b <= options.max_batch]
        draws = options.graph_draws or sorted({1, options.samples or 1})
        return cls(batches=tuple(b for b in batches if b <= options.max_batch) or (1,),
                   draws=tuple(draws), widths=tuple(options.graph_widths or default.widths),
                   prefix_tokens=options.graph_prefix_tokens, labels=labels, capture=capture,
                   mixed_groups=options.graph_mixed_groups if options.mixed_question_reads else 0,
                   fixed_cost_items=options.fixed_cost_items)

    def mixed_counts(self) -> tuple[int, ...]:
        """The group counts of the mixed buckets: every power of two from 2 below
        ``mixed_groups``, and ``mixed_groups``. Why fewer groups than buffers: a bucket pads its
        every group, so two questions in a bucket of four groups read two groups of fillers and
        cost more than reading each question alone (bench.host_path, ninth session)."""
        if not self.mixed_groups:
            return ()
        return tuple(sorted({2 ** k for k in range(1, self.mixed_groups.bit_length())
                             if 2 ** k < self.mixed_groups} | {self.mixed_groups}))

    def mixed_buckets(self) -> tuple[tuple[int, int], ...]:
        """The mixed buckets as (groups, items a group), by their padded size then groups."""
        return tuple(sorted(((n, g) for n in self.mixed_counts() for g in self.batches
                             if g * n <= self.batches[-1]), key=lambda b: (b[0] * b[1], b[0])))

    def mixed_cost(self, bucket: tuple[int, int]) -> float:
        """A mixed bucket's read in items' worth: its fixed cost and its every padded item."""
        return self.fixed_cost_items + bucket[0] * bucket[1]

    def mixed_pays(self, bucket: tuple[int, int], runs: Sequence[int]) -> bool:
        """Whether mixed ``bucket`` reads runs of these item counts (one a question) for less
        than one bucket a run: a read of b items costs about ``fixed_cost_items`` + b, padding
        included (a mixed bucket reads its every group)."""
        one_each = sum(self.fixed_cost_items + padded_size(n, self.batches) for n in runs)
        return self.mixed_cost(bucket) < one_each

    def mixed_bucket(self, runs: Sequence[int]) -> tuple[int, int] | None:
        """The cheapest mixed bucket that holds these runs (a group a run, each within its
        group's items) where it pays (``mixed_pays``), or None: a read one bucket a question."""
        return next((b for b in self.mixed_buckets()
                     if b[0] >= len(runs) and b[1] >= max(runs, default=0)
                     and self.mixed_pays(b, runs)), None) if len(runs) > 1 else None

    def mixed_take(self, counts: Sequence[int]) -> list[int]:
        """How many of each question's waiting items (``counts``, oldest question first) a batch
        takes: the most items per cost of the first question alone (``bucket_take``) or, for each
        mixed bucket of G groups of g, the first G questions, up to g items each (cost as
        ``mixed_cost``). Why: a mixed bucket pads each question's group up to g, so a batch of 32
        over 4 questions (10, 7, 9, 6 waiting) reads best as 8, 7, 8, 6 in groups of 8 (36 items'
        worth) than as groups of 16 (68) or one question at a time; two questions (16, 16) read
        best in two groups of 16 (32 items for 36), not in four (68) nor one alone (16 for 20)."""
        fixed = self.fixed_cost_items
        alone = bucket_take(counts[0], self.batches, fixed)
        best = [alone] + [0] * (len(counts) - 1)
        rate = alone / (fixed + padded_size(alone, self.batches))
        for bucket in self.mixed_buckets() if len(counts) > 1 else ():
            n, g = bucket
            take = [min(c, g) for c in counts[:n]] + [0] * max(0, len(counts) - n)
            if sum(take) / self.mixed_cost(bucket) > rate:
                best, rate = take, sum(take) / self.mixed_cost(bucket)
        return best

    def count(self) -> int:
        return (len(self.batches) * len(self.draws) + len(self.mixed_buckets())) * len(self.widths)


# FlexAttention compiled per shape (KernelChoice.static_flex_items) compiles once for each
# attention shape of a bucket: the prompt rests' and the canvases' own keys, and the prefix
FLEX_SHAPES_A_BUCKET = 3


def allow_recompiles(extra: int) -> None:
    """Raise dynamo's recompile limits by ``extra`` compiles of one function (past a limit dynamo
    runs the function uncompiled: for FlexAttention, a kernel that materializes the scores)."""
    import torch

    from router.backends.torch.compiled import RECOMPILE_LIMIT

    config = torch._dynamo.config
    for name, floor in (("recompile_limit", RECOMPILE_LIMIT), ("cache_size_limit", RECOMPILE_LIMIT),
                        ("accumulated_recompile_limit", 256), ("accumulated_cache_size_limit", 256)):
        if hasattr(config, name):
            setattr(config, name, max(int(getattr(config, name)), floor + extra))


class GraphSet:
    """Captured reads for every (items, rows, width) bucket of ``shapes``, for ``reader`` (a
    one-pass DiffusionSlotReader; built by it, filled once by ``warm_up``)."""

    def __init__(self, reader: Any, shapes: GraphShapes) -> None:
        import torch

        if reader.onepass is None:
            raise ValueError("graphs need the one-pass read (tied encoder/decoder weights)")
        self.reader, self.onepass, self.shapes = reader, reader.onepass, shapes
        # buckets of at most ``flex_items`` items compile FlexAttention per shape at warm-up
        # (KernelChoice.static_flex_items; each bucket's read: ``onepass_for``)
        self.flex_items = reader.choice.static_flex_items
        self.batches, self.draws, self.widths = list(shapes.batches), list(shapes.draws), list(shapes.widths)
        self.labels, self.capture = shapes.labels, shapes.capture
        prefix_tokens = shapes.prefix_tokens
        self.graphs: dict[tuple[int, int, int], _Captured] = {}
        # mixed buckets by (groups, items a group, width): a group a static prefix buffer
        self.mixed: dict[tuple[int, int, int], _Captured] = {}
        self.pool = torch.cuda.graph_pool_handle() if shapes.capture else None
        # the static prefix buffers (one-question buckets read the first) and what each holds
        self.buffers = [self._static_prefix(prefix_tokens) for _ in range(max(1, shapes.mixed_groups))]
        self.held: list[tuple[int, ...] | None] = [None] * len(self.buffers)

    @property
    def prefix(self) -> PrefixKV:
        """The static prefix buffer the one-question buckets read."""
        return self.buffers[0]

    @property
    def loaded(self) -> tuple[int, ...] | None:
        """The prefix ids ``prefix`` holds (None: none yet)."""
        return self.held[0]

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

    def load(self, prefix_ids: tuple[int, ...], cache: Any, buffer: int = 0) -> bool:
        """Copy a prefix's cached keys/values into static buffer ``buffer``; False when it does
        not fit."""
        import torch

        if self.held[buffer] == prefix_ids:
            return True
        target = self.buffers[buffer]
        stored = [layer.keys.shape[2] for layer in cache.layers]
        if any(n > buf.shape[2] for n, buf in zip(stored, target.keys, strict=True)):
            return False
        # A switch of prefix happens on every batch of mixed-question traffic: few launches. The
        # keys and values go as two multi-tensor copies (one Python call each, where a copy a
        # layer took 60), and each layer kind's slot positions (shared by its layers) are set once.
        dst = [buf[:, :, :n] for buf, n in zip(target.keys + target.values, stored * 2, strict=True)]
        torch._foreach_copy_(dst, [layer.keys for layer in cache.layers] +
                             [layer.values for layer in cache.layers])
        length = len(prefix_ids)
        for kind, n in dict(zip(self.onepass.kinds(), stored, strict=True)).items():
            pos = target.positions[kind]
            pos.fill_(FAR)
            pos[:n] = torch.arange(length - n, length, device=pos.device)
        target.length.fill_(length)
        self.held[buffer] = prefix_ids
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
        from router.backends.torch.reader import SlotItem

        self.held = [None] * len(self.buffers)
        cache = self.reader.prefix_cache(prefix_ids)
        if not all(self.load(prefix_ids, cache, b) for b in range(len(self.buffers))):
            raise ValueError(f"warm-up prefix of {len(prefix_ids)} tokens exceeds prefix_tokens")
        started = time.monotonic()
        flex = sum(n <= self.flex_items for n in self.batches) * len(self.draws) * len(self.widths)
        if flex:
            allow_recompiles(flex * FLEX_SHAPES_A_BUCKET)
        for n_items in self.batches:
            for d in self.draws:
                for width in self.widths:
                    items = [SlotItem(prefix_ids, (1,) * width, canvas_ids, slot,
                                      tuple(range(2, 2 + self.labels)), d, seed=k)
                             for k in range(n_items)]
                    self.graphs[(n_items, n_items * d, width)] = self._capture(items, n_items * d, width)
        for n_groups, size in self.shapes.mixed_buckets():
            for width in self.widths:
                items = [SlotItem(prefix_ids, (1,) * width, canvas_ids, slot,
                                  tuple(range(2, 2 + self.labels)), 1, seed=k)
                         for k in range(n_groups * size)]
                self.mixed[(n_groups, size, width)] = self._capture(
                    items, n_groups * size, width, self.mixed_groups(n_groups, size))
        log.info("torch read: %d graphs ready in %.1f s", len(self.graphs) + len(self.mixed),
                 time.monotonic() - started)

    def onepass_for(self, n_items: int) -> Any:
        """The one-pass read a bucket of ``n_items`` items runs (captured with, replayed as):
        the reader's for that bucket (``KernelChoice.for_read``)."""
        return self.reader.onepass_for(n_items, graph=True)

    def mixed_buffers(self, n_groups: int) -> range:
        """The static prefix buffers a mixed bucket of ``n_groups`` groups reads, a group each:
        the last ``n_groups`` (buffer 0, the one-question buckets', only when it needs all)."""
        return range(len(self.buffers) - n_groups, len(self.buffers))

    def mixed_groups(self, n_groups: int, size: int) -> PrefixGroups:
        """A mixed bucket's groups: ``size`` one-draw items a static prefix buffer of
        ``mixed_buffers``, in order."""
        bounds = tuple(range(0, size * n_groups + 1, size))
        return PrefixGroups(tuple(self.buffers[b] for b in self.mixed_buffers(n_groups)), bounds, bounds)

    def _capture(self, items: list[Any], n_rows: int, width: int,
                 groups: PrefixGroups | None = None) -> _Captured:
        import torch

        batch = self.reader.prepare_onepass(items, prefix_len=int(self.prefix.length), n_rows=n_rows,
                                            width=width, n_labels=self.labels, device=self.reader.device)
        prefix = groups if groups is not None else self.prefix
        if not self.capture:
            return _Captured(batch, (), None, prefix)
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
        return _Captured(batch, out, graph, prefix)

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

    def run_mixed(self, runs: Sequence[tuple[tuple[int, ...], Sequence[Any], Any]]
                  ) -> tuple[Any, Any, Any] | None:
        """``run`` of a read of several prefixes: ``runs`` of (prefix ids, its items, its cache),
        one a prefix, read by the cheapest mixed bucket that holds them where it pays
        (``GraphShapes.mixed_bucket``; a static buffer a run, one that holds its prefix already
        where one does: traffic repeats its questions), or None when none does (one-draw items
        only). The real rows in the order of ``runs``."""
        import torch

        items = [item for _, run, _ in runs for item in run]
        width = max(len(item.suffix_ids) for item in items)
        bucket = self.shapes.mixed_bucket([len(run) for _, run, _ in runs])
        s = bisect.bisect_left(self.widths, width)
        if (bucket is None or s == len(self.widths)
                or any(item.draws != 1 for item in items)
                or max(len(item.label_ids) for item in items) > self.labels
                or (*bucket, self.widths[s]) not in self.mixed):
            return None
        n_groups, size = bucket
        buffers = self.mixed_buffers(n_groups)
        place = self._place([prefix_ids for prefix_ids, _, _ in runs], buffers)
        if not all(self.load(prefix_ids, cache, b)
                   for (prefix_ids, _, cache), b in zip(runs, place, strict=True)):
            return None
        filler = replace(items[0], prefix_ids=(), suffix_ids=(self.reader.pad_id,),
                         label_ids=items[0].label_ids[:1], draws=1, seed=0)
        laid: list[Any] = [filler] * (size * n_groups)
        rows: list[int] = []
        for (_, run, _), b in zip(runs, place, strict=True):
            at = (b - buffers.start) * size  # the group reading buffer b
            laid[at:at + len(run)] = run
            rows.extend(range(at, at + len(run)))
        fresh = self.reader.prepare_onepass(laid, prefix_len=1, n_rows=len(laid),
                                            width=self.widths[s], n_labels=self.labels)
        out = self._replay(self.mixed[(n_groups, size, self.widths[s])], fresh)
        index = torch.tensor(rows, dtype=torch.long, device=out[0].device)
        return out[0][index], out[1][index], out[2][index]

    def _place(self, prefixes: Sequence[tuple[int, ...]], buffers: range) -> list[int]:
        """A static buffer of ``buffers`` for each of ``prefixes`` (distinct, at most as many):
        the one holding it already, else one holding none of them (the one-question buckets'
        buffer last)."""
        place: dict[tuple[int, ...], int] = {}
        for p in prefixes:  # the first buffer holding it (warm-up leaves one prefix in all)
            held = next((b for b in buffers if self.held[b] == p and b not in place.values()), None)
            if held is not None:
                place[p] = held
        free = sorted((b for b in buffers if b not in place.values()), key=lambda b: b == 0)
        return [place[p] if p in place else free.pop(0) for p in prefixes]

    def _replay(self, captured: _Captured, fresh: OnePassBatch) -> tuple[Any, ...]:
        """``fresh`` copied into a bucket's inputs, then its graph replayed (or, uncaptured, its
        read run over those inputs): its outputs."""
        for f in fields(OnePassBatch):
            getattr(captured.batch, f.name).copy_(getattr(fresh, f.name), non_blocking=True)
        if captured.graph is None:
            n_items = captured.batch.input_ids.shape[0]
            return self.onepass_for(n_items)(captured.prefix, captured.batch)  # type: ignore[no-any-return]
        captured.graph.replay()
        return captured.out
