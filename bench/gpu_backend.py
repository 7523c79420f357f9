"""The ``backend`` block of bench/gpu_read.py: the DiffusionGemma read measured through
``TorchBackend.read`` as shipped (prompt building, coalescing, compiled read, CUDA graphs), with a
real tokenizer building the prompts: a question of 77 options whose static prefix is about
``--static-tokens`` tokens and states of about ``--message-tokens`` tokens, the prefix cached."""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections.abc import Callable
from typing import Any

from policies.types import DecisionRequest, Option
from router.backends.torch.backend import TorchBackend
from router.backends.torch.options import TorchOptions
from router.backends.torch.serve.build import make_reader
from router.backends.torch.serve.diffusion import DiffusionSlotReader
from router.backends.torch.serve.reader import SlotReader

WORDS = ["card", "account", "money", "transfer", "refund", "payment", "my", "the", "a", "is", "not", "arrived", "yesterday", "please", "why", "still", "charged", "twice", "fee", "exchange", "rate", "top", "up", "pending", "cash", "machine", "declined", "lost", "stolen", "pin", "blocked", "verify", "identity", "app", "country", "limit", "balance", "wrong", "amount", "cancel"]


def build_requests(backend: TorchBackend, args: argparse.Namespace) -> Callable[[int, int], DecisionRequest]:
    """A factory of requests (seed k, samples) of one question sized to ``--static-tokens``, or
    with ``--questions`` Q of them (each its own static prefix: its own instructions), request k
    asking one drawn by k: traffic that mixes questions."""
    options = tuple(Option(f"intent_{k:02d}", f"the customer asks about topic {k}") for k in range(args.options))
    context = ""
    while True:
        probe = DecisionRequest("intent", "Which intent is this?", options, "x", context=context)
        if len(backend.item(probe).prefix_ids) >= args.static_tokens:
            break
        context += "Read the customer's message carefully and pick the closest banking intent. "
    tokenizer = backend.tokenizer

    def state(k: int) -> str:
        rng = random.Random(k)
        words: list[str] = []
        while len(tokenizer.encode(" ".join(words), add_special_tokens=False)) < args.message_tokens:
            words.extend(rng.choice(WORDS) for _ in range(16))
        return " ".join(words)

    states: dict[int, str] = {}

    questions = getattr(args, "questions", 1)

    def make(k: int, samples: int) -> DecisionRequest:
        if k not in states:
            states[k] = state(k)
        q = question_of(k, questions)
        ask = ("intent", "Which intent is this?") if q == 0 else (f"q{q}", f"Which intent is this (form {q})?")
        return DecisionRequest(*ask, options, states[k], context=context, samples=samples, seed=k)

    return make


def question_of(k: int, questions: int) -> int:
    """Which of ``questions`` request ``k`` asks (drawn by k, so every run asks the same)."""
    return random.Random(k).randrange(questions) if questions > 1 else 0


def covering_keys(questions: int, start: int, at_least: int = 3) -> list[int]:
    """Request keys from ``start`` until every one of ``questions`` was asked (``make`` draws a
    question by key): warming them all keeps the first encoding of a prefix out of the timings."""
    keys: list[int] = []
    seen: set[int] = set()
    k = start
    while len(seen) < questions or len(keys) < at_least:
        keys.append(k)
        seen.add(question_of(k, questions))
        k += 1
    return keys


CALLERS = (1, 8, 16, 32, 64, 128)


class TimedReader:
    """The backend's reader with the time of each batch's read summed (no tokenizing in it)."""

    def __init__(self, inner: SlotReader) -> None:
        self.inner, self.read_ms = inner, 0.0
        self.device, self.compiled, self.needs_warm_up = inner.device, inner.compiled, False

    def read(self, items: Any) -> Any:
        t = time.perf_counter()
        try:
            return self.inner.read(items)
        finally:
            self.read_ms += (time.perf_counter() - t) * 1000

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        return self.inner.batch_sizes

    def warm_up(self, sample: Any) -> SlotReader:
        return self


class Phases:
    """The coalescer's batch function replaced by one that times its parts in the worker thread:
    tokenizing (``TorchBackend.items``) and the read; the timestamps tell the hops apart."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.entered = self.tokenized = self.read_done = 0.0
        self.read_ms = 0.0  # summed over batches
        self._run_batch = backend._coalescer.run_batch
        backend._coalescer.run_batch = self.run_batch

    def restore(self) -> None:
        self.backend._coalescer.run_batch = self._run_batch

    def run_batch(self, pending: list[Any]) -> list[Any]:
        self.entered = time.perf_counter()
        items = self.backend.items(pending)
        self.tokenized = time.perf_counter()
        reads = self.backend.reader.read(items)
        self.read_done = time.perf_counter()
        self.read_ms += (self.read_done - self.tokenized) * 1000
        return list(reads)


async def phase_rows(backend: TorchBackend, phases: Phases,
                     requests: list[DecisionRequest]) -> dict[str, list[float]]:
    """Each request read alone, its time split by ``phases`` (installed on ``backend``), ms:
    before the worker thread starts, tokenizing the state, the reader's read, and from its end to
    the caller."""
    rows: dict[str, list[float]] = {k: [] for k in ("total", "before_worker", "tokenize", "read",
                                                    "after_worker")}
    for request in requests:
        t0 = time.perf_counter()
        await backend.read([request])
        t1 = time.perf_counter()
        for name, seconds in (("total", t1 - t0), ("before_worker", phases.entered - t0),
                              ("tokenize", phases.tokenized - phases.entered),
                              ("read", phases.read_done - phases.tokenized),
                              ("after_worker", t1 - phases.read_done)):
            rows[name].append(seconds * 1000)
    return rows


async def single_phases(backend: TorchBackend, make: Callable[[int, int], DecisionRequest],
                        iters: int) -> dict[str, float]:
    """Where a single read's time goes: ``phase_rows``' medians."""
    phases = Phases(backend)
    try:
        rows = await phase_rows(backend, phases, [make(20_000 + k, 1) for k in range(iters)])
    finally:
        phases.restore()
    return {name: percentile(values, 50) for name, values in rows.items()}


def measure_backend(args: argparse.Namespace, model: Any, device: Any, log: Callable[[str], None],
                    deadline: float) -> dict[str, Any]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer, local_files_only=True)
    top = max(getattr(args, "callers", CALLERS))
    options = TorchOptions(
        kind="diffusion", canvas_length=args.canvas, turn_close_id=int(tokenizer.eos_token_id or 0),
        max_batch=top, coalesce_window_ms=2.0, compiled=device.type == "cuda",
        graph_batches=[b for b in (1, 2, 4, 8, 16, 32, 64, 128) if b <= top], graph_draws=[1, 4],
        graph_widths=[224, 256], graph_prefix_tokens=args.prefix_capacity,
        split_kv_items=getattr(args, "split_kv_items", None),
        split_kv_chunks=getattr(args, "split_kv_chunks", None),
        prefix_cache_entries=max(8, getattr(args, "questions", 1)))
    backend = TorchBackend(make_reader(options, model, tokenizer), tokenizer, options,
                           model_id="random-weights")
    measuring = _measure(backend, build_requests(backend, args), args, log, deadline)
    if getattr(args, "loop", "asyncio") == "uvloop":  # what `slotgate serve` runs on when installed
        import uvloop

        return uvloop.run(measuring)
    return asyncio.run(measuring)


async def _measure(backend: TorchBackend, make: Callable[[int, int], DecisionRequest],
                   args: argparse.Namespace, log: Callable[[str], None], deadline: float) -> dict[str, Any]:
    import torch

    started = time.monotonic()
    while not await backend.ready():
        if time.monotonic() > deadline:
            raise TimeoutError("backend warm-up did not finish within the time budget")
        await asyncio.sleep(0.2)
    out: dict[str, Any] = {"compiled": backend.compiled, "warm_up_s": time.monotonic() - started,
                           "questions": getattr(args, "questions", 1),
                           "fixed_cost_items": backend.options.fixed_cost_items,
                           "loop": type(asyncio.get_running_loop()).__module__}
    first = backend.item(make(0, 1))
    out["prefix_tokens"], out["suffix_tokens"] = len(first.prefix_ids), len(first.suffix_ids)
    reader = backend.reader
    assert isinstance(reader, DiffusionSlotReader)
    out["graphs"] = len(reader.graphs.graphs) if reader.graphs is not None else 0
    out["choice"] = reader.choice.summary()
    log(f"backend ready: {out}")
    for samples, name in ((1, "single"), (4, "draws4")):
        for k in covering_keys(getattr(args, "questions", 1), 10_000):  # warm: prefix caches,
            await backend.read([make(k, samples)])  # static prompts, first replay
        times = []
        # fresh states for each figure: the backend keeps tokenized states (TorchBackend.items),
        # so 4 draws of the single reads' states would skip tokenizing
        first_key = 0 if samples == 1 else 5_000
        for request in [make(first_key + k, samples) for k in range(args.iters)]:  # built before timing
            t0 = time.perf_counter()
            await backend.read([request])
            times.append((time.perf_counter() - t0) * 1000)
        out[f"{name}_p50_ms"], out[f"{name}_p99_ms"] = percentile(times, 50), percentile(times, 99)
    out["draws4_over_draws1"] = out["draws4_p50_ms"] / out["single_p50_ms"]
    out["single_phases_ms"] = await single_phases(backend, make, args.iters)
    log(f"single read phases (median ms): {out['single_phases_ms']}")

    async def caller(requests: list[DecisionRequest], latencies: list[float]) -> None:
        for request in requests:
            t0 = time.perf_counter()
            await backend.read([request])
            latencies.append((time.perf_counter() - t0) * 1000)

    def plan(callers: int, rounds: int, base: int) -> list[list[DecisionRequest]]:  # built before timing
        return [[make(base + c * rounds + j, 1) for j in range(rounds)] for c in range(callers)]

    timed = TimedReader(reader)
    backend.reader = timed  # the backend's attribute; the reader itself is unchanged
    curve: dict[str, Any] = {}
    base = 30_000
    for callers in getattr(args, "callers", CALLERS):
        if time.monotonic() > deadline:
            curve[str(callers)] = {"skipped": "time budget"}
            continue
        rounds = max(args.rounds, 2 * max(1, 256 // callers)) if callers < 32 else args.rounds
        warm: list[float] = []
        await asyncio.gather(*(caller(r, warm) for r in plan(callers, 1, base)))  # warm the shapes
        requests = plan(callers, rounds, base + 1_000 * callers)
        torch.cuda.reset_peak_memory_stats() if torch.cuda.is_available() else None
        latencies: list[float] = []
        before, timed.read_ms = backend._coalescer.batches, 0.0
        t0 = time.perf_counter()
        await asyncio.gather(*(caller(r, latencies) for r in requests))
        wall = time.perf_counter() - t0
        batches = backend._coalescer.batches - before
        row = {"reads_per_s": callers * rounds / wall, "p50_ms": percentile(latencies, 50),
               "p99_ms": percentile(latencies, 99), "mean_batch": callers * rounds / batches,
               "batch_ms": wall * 1000 / batches, "reader_ms_per_batch": timed.read_ms / batches,
               "reads": callers * rounds}
        if torch.cuda.is_available():
            row["gpu_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
            row["gpu_reserved_gib"] = torch.cuda.memory_reserved() / 2**30
        curve[str(callers)] = row
        log(f"callers {callers}: {row}")
        base += 100_000
    out["curve"] = curve
    if "32" in curve and "reads_per_s" in curve["32"]:
        out["concurrent32_reads_per_s"] = curve["32"]["reads_per_s"]
        out["concurrent32_reader_ms_per_batch"] = curve["32"]["reader_ms_per_batch"]
    backend.reader = reader
    # misses past the warm-up mean re-encoded prefixes inside the timings (several questions)
    out["prefix_cache"] = backend.serving().get("prefix_cache")
    await backend.aclose()
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]
