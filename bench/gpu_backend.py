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
from router.backends.torch import backend as backend_module
from router.backends.torch.backend import TorchBackend
from router.backends.torch.diffusion import DiffusionSlotReader
from router.backends.torch.prompt import encode
from router.backends.torch.prompt import encode_many as shipped_encode_many

WORDS = ["card", "account", "money", "transfer", "refund", "payment", "my", "the", "a", "is", "not", "arrived", "yesterday", "please", "why", "still", "charged", "twice", "fee", "exchange", "rate", "top", "up", "pending", "cash", "machine", "declined", "lost", "stolen", "pin", "blocked", "verify", "identity", "app", "country", "limit", "balance", "wrong", "amount", "cancel"]


def one_by_one(tokenizer: Any, texts: list[str]) -> list[tuple[int, ...]]:
    """The states tokenized one at a time (before batched tokenizing): the on/off comparison."""
    return [encode(tokenizer, text) for text in texts]


def build_requests(backend: TorchBackend, args: argparse.Namespace) -> Callable[[int, int], DecisionRequest]:
    """A factory of requests (seed k, samples) sharing one question sized to ``--static-tokens``."""
    options = tuple(Option(f"intent_{k:02d}", f"the customer asks about topic {k}") for k in range(args.options))
    context = ""
    while True:
        probe = DecisionRequest("intent", "Which intent is this?", options, "x", context=context)
        if len(backend.item(probe).prefix_ids) >= args.static_tokens:
            break
        context += "Read the customer's message carefully and pick the closest banking intent. "
    tokenizer = backend.tokenizer

    def state(k: int) -> str:
        rng, words = random.Random(k), []
        while len(tokenizer.encode(" ".join(words), add_special_tokens=False)) < args.message_tokens:
            words.extend(rng.choice(WORDS) for _ in range(16))
        return " ".join(words)

    states: dict[int, str] = {}

    def make(k: int, samples: int) -> DecisionRequest:
        if k not in states:
            states[k] = state(k)
        return DecisionRequest("intent", "Which intent is this?", options, states[k], context=context,
                               samples=samples, seed=k)

    return make


def measure_backend(args: argparse.Namespace, model: Any, device: Any, log: Callable[[str], None],
                    deadline: float) -> dict[str, Any]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer, local_files_only=True)
    backend = TorchBackend(
        DiffusionSlotReader(model), tokenizer, kind="diffusion", model_id="random-weights",
        canvas_length=args.canvas, turn_close_id=int(tokenizer.eos_token_id or 0),
        max_batch=32, coalesce_window_ms=2.0, compiled=device.type == "cuda",
        graph_batches=(1, 2, 4, 8, 16, 32), graph_draws=(1, 4), graph_widths=(224, 256),
        graph_prefix_tokens=args.prefix_capacity)
    return asyncio.run(_measure(backend, build_requests(backend, args), args, log, deadline))


async def _measure(backend: TorchBackend, make: Callable[[int, int], DecisionRequest],
                   args: argparse.Namespace, log: Callable[[str], None], deadline: float) -> dict[str, Any]:
    started = time.monotonic()
    while not await backend.ready():
        if time.monotonic() > deadline:
            raise TimeoutError("backend warm-up did not finish within the time budget")
        await asyncio.sleep(0.2)
    out: dict[str, Any] = {"compiled": backend.compiled, "warm_up_s": time.monotonic() - started}
    first = backend.item(make(0, 1))
    out["prefix_tokens"], out["suffix_tokens"] = len(first.prefix_ids), len(first.suffix_ids)
    graphs = backend.reader.graphs
    out["graphs"] = len(graphs.graphs) if graphs is not None else 0
    out["attention_kernels"] = getattr(backend.reader.onepass.attend, "kernels", None)
    log(f"backend ready: {out}")
    for samples, name in ((1, "single"), (4, "draws4")):
        for k in range(3):  # warm: prefix cache, static prompt, first replay
            await backend.read([make(10_000 + k, samples)])
        times = []
        for request in [make(k, samples) for k in range(args.iters)]:  # built before timing
            t0 = time.perf_counter()
            await backend.read([request])
            times.append((time.perf_counter() - t0) * 1000)
        times.sort()
        out[f"{name}_p50_ms"] = times[len(times) // 2]
        out[f"{name}_p99_ms"] = times[min(len(times) - 1, round(0.99 * (len(times) - 1)))]
    out["draws4_over_draws1"] = out["draws4_p50_ms"] / out["single_p50_ms"]

    async def caller(requests: list[DecisionRequest]) -> None:
        for request in requests:
            await backend.read([request])

    def plan(rounds: int, base: int) -> list[list[DecisionRequest]]:  # built before timing
        return [[make(base + c * rounds + j, 1) for j in range(rounds)] for c in range(32)]

    await asyncio.gather(*(caller(r) for r in plan(1, 20_000)))  # warm the batched shapes
    reader_read, read_ms = backend.reader.read, [0.0]

    def timed_read(items: list[Any]) -> Any:  # the reader's share of each batch (no tokenizing)
        t = time.perf_counter()
        try:
            return reader_read(items)
        finally:
            read_ms[0] += (time.perf_counter() - t) * 1000

    backend.reader.read = timed_read
    # the states tokenized in one batched call per batch (shipped), then one by one, as before
    for suffix, encode_many in (("", None), ("_states_one_by_one", one_by_one)):
        if encode_many is not None:
            backend_module.encode_many = encode_many
        try:
            timed = plan(args.rounds, 30_000 if not suffix else 60_000)
            before, read_ms[0] = backend._coalescer.batches, 0.0
            t0 = time.perf_counter()
            await asyncio.gather(*(caller(r) for r in timed))
            wall = time.perf_counter() - t0
        finally:
            backend_module.encode_many = shipped_encode_many
        batches = backend._coalescer.batches - before
        out[f"concurrent32{suffix}_reads_per_s"] = 32 * args.rounds / wall
        out[f"concurrent32{suffix}_mean_batch"] = 32 * args.rounds / batches
        out[f"concurrent32{suffix}_batch_ms"] = wall * 1000 / batches
        out[f"concurrent32{suffix}_reader_ms_per_batch"] = read_ms[0] / batches
        if not suffix:
            out["concurrent32_reads"] = 32 * args.rounds
    backend.reader.read = reader_read
    await backend.aclose()
    return out
