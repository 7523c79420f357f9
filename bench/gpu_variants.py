"""Which fast kernels pay: the compiled, graph-replayed one-pass read at one batch size with the
band prefix read (attention.attend_band) and the row-copy experts (moe.py) each on or off,
plus the prefix attention alone at the read's shapes (dense-bias kernels against the band GEMMs),
and a kernel profile of the last variant. Same model and items as bench/gpu_read.py.

    python -m bench.gpu_variants --config .devcarry/diffusiongemma-26B-A4B-it.config.json \\
        --out $OUT/variants.json
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from bench.gpu_read import ROOT, build_model, make_items, profile, sync, time_reads
from router.backends.torch.model.choice import KernelChoice, default_choice
from router.backends.torch.serve.diffusion import DiffusionSlotReader
from router.backends.torch.serve.graphs import KEY_ALIGN, GraphShapes
from router.backends.torch.serve.warm_up import warm_up

BOTH = frozenset({"sliding_attention", "full_attention"})
# Each variant: the device's shipped choice (compiled, default_choice) with these switches changed;
# a combination the choice refuses is reported as an error.
VARIANTS: dict[str, dict[str, Any]] = {
    "shipped": {}, "no_band": {"band": frozenset()}, "band_all": {"band": BOTH},
    "no_rows_moe": {"rows_moe": False, "fused_moe": False}, "no_merge_op": {"merge_op": False},
    "no_triton": {"rows_moe": False, "fused_moe": False, "merge_op": False, "triton": False},
    "fused_moe": {"rows_moe": False, "fused_moe": True},
    "no_fused_moe": {"rows_moe": True, "fused_moe": False},
    "streams_apart": {"joint_streams": False, "joint_streams_items": 0},
    # every read joint
    "joint_all": {"joint_streams_items": 0},
    # the prompt rests' own keys under their dense causal bias, not a causal kernel
    "biased_own": {"causal_own": False},
}


def event_ms(fn: Any, iters: int) -> float:
    """Median milliseconds of ``fn`` by CUDA events (CPU clock elsewhere)."""
    import torch

    fn()
    fn()
    times = []
    for _ in range(iters):
        if torch.cuda.is_available():
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(float(start.elapsed_time(end)))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1000)
    return sorted(times)[len(times) // 2]


def attention_micro(args: argparse.Namespace, reader: DiffusionSlotReader, device: Any) -> dict[str, Any]:
    """One layer's prefix read per head dim at the batch's shapes: the dense-bias kernel the reader
    picked, cuDNN, memory-efficient, and the band GEMMs (softmax compiled)."""
    import torch

    from router.backends.torch.kernels.attention import (
        Band,
        attend_band,
        attend_cudnn,
        attend_efficient,
        band_softmax,
        to_bias,
    )
    from router.backends.torch.model.inputs import FAR

    dtype = next(reader.model.parameters()).dtype
    config = reader.model.config.get_text_config()
    n_queries = args.batch * (args.width + args.canvas)
    softmax = torch.compile(band_softmax, dynamic=True) if device.type == "cuda" else band_softmax
    out: dict[str, Any] = {"queries": n_queries}
    gen = torch.Generator(device=device).manual_seed(0)
    for index in sorted({config.layer_types.index(t) for t in set(config.layer_types)}):
        layer = config.per_layer_config[index]
        kv, dim = int(layer.num_key_value_heads), int(layer.head_dim)
        groups = int(config.num_attention_heads) // kv
        sliding = config.layer_types[index] == "sliding_attention"
        n_keys = min(args.prefix_capacity, int(config.sliding_window) - 1) if sliding else args.prefix_capacity
        n_keys = -(-n_keys // KEY_ALIGN) * KEY_ALIGN  # as graphs.py lays the static prefix out
        q = torch.randn((1, kv, groups * n_queries, dim), generator=gen, device=device, dtype=dtype) / dim**0.5
        k, v = (torch.randn((1, kv, n_keys, dim), generator=gen, device=device, dtype=dtype) for _ in range(2))
        filled = min(n_keys, args.static_tokens)
        key_pos = torch.full((n_keys,), FAR, device=device)
        key_pos[:filled] = torch.arange(args.static_tokens - filled, args.static_tokens, device=device)
        start = torch.tensor(args.static_tokens, device=device)
        low = (start + torch.arange(n_queries, device=device) % args.width - (config.sliding_window - 1)
               if sliding else None)
        visible = (key_pos[None, :] < start) & ((key_pos[None, :] >= low[:, None]) if low is not None else True)
        bias = to_bias(visible.expand(n_queries, -1)[None], groups, dtype)
        band = Band(key_pos, low.repeat(groups) if low is not None else None, start)
        row: dict[str, Any] = {"kv_heads": kv, "head_dim": dim, "keys": n_keys}
        ref = None
        kernels = {"cudnn": partial(attend_cudnn, q, k, v, bias),
                   "efficient": partial(attend_efficient, q, k, v, bias),
                   "band_gemm": partial(attend_band, q, k, v, band, softmax)}
        for name, fn in kernels.items():
            try:
                ms = event_ms(fn, args.iters)
                got = fn()[0].float()
                ref = got if ref is None else ref
                flops = 4 * kv * groups * n_queries * n_keys * dim
                row[name] = {"ms": round(ms, 3), "tflops": round(flops / ms / 1e9, 1),
                             "rel_diff_vs_first": float((got - ref).norm() / ref.norm())}
            except Exception as exc:  # noqa: BLE001 (a kernel that refuses these shapes is reported)
                row[name] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        out[config.layer_types[index]] = row
    return out


def variant(args: argparse.Namespace, model: Any, device: Any, changes: dict[str, Any],
            items: list[Any]) -> tuple[dict[str, Any], Any]:
    import torch

    on_cuda = device.type == "cuda"
    shipped = default_choice(model, compiled=True, compile_backend="inductor" if on_cuda else "aot_eager")
    choice = replace(shipped, **changes)
    started = time.monotonic()
    batches = tuple(sorted({1, args.batch, *args.graph_batches}))
    shapes = GraphShapes(batches=batches, draws=(1,), widths=(args.width,),
                         prefix_tokens=args.prefix_capacity, labels=128, capture=on_cuda)
    reader = warm_up(DiffusionSlotReader(model, choice=choice, graphs=shapes), items[0])
    row: dict[str, Any] = {"choice": reader.choice.summary(), "compiled": reader.compiled}
    if on_cuda and reader.graphs is not None:
        graph = reader.graphs.graphs[(args.batch, args.batch, args.width)].graph
        row["replay_ms"] = event_ms(graph.replay, args.iters)
        row["replay_batch1_ms"] = event_ms(reader.graphs.graphs[(1, 1, args.width)].graph.replay,
                                           args.iters)
        row["replay_by_batch_ms"] = {
            str(n): event_ms(reader.graphs.graphs[(n, n, args.width)].graph.replay, args.iters)
            for n in batches}
    row["compile_capture_s"] = time.monotonic() - started
    row["read"] = time_reads(reader.read, items, args.batch, device, args.iters)
    reads = reader.read(items[: args.batch])
    del reader
    torch.cuda.empty_cache() if on_cuda else None
    return row, reads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / ".devcarry/diffusiongemma-26B-A4B-it.config.json"))
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--layers", type=int, default=0)
    parser.add_argument("--dtype", default="")
    parser.add_argument("--experts", default="grouped_mm")
    parser.add_argument("--static-tokens", type=int, default=1400)
    parser.add_argument("--message-tokens", type=int, default=200)
    parser.add_argument("--prefix-capacity", type=int, default=1536)
    parser.add_argument("--canvas", type=int, default=64)
    parser.add_argument("--slot", type=int, default=8)
    parser.add_argument("--options", type=int, default=77)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--width", type=int, default=224)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--graph-batches", type=int, nargs="*", default=[],
                        help="more graph buckets (items) to replay, besides 1 and --batch")
    parser.add_argument("--top-ops", type=int, default=16)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS))
    parser.add_argument("--blocks", nargs="+", default=["micro", "variants", "profile"])
    parser.add_argument("--out", default="variants.json")
    args = parser.parse_args()
    args.batches = [args.batch]

    import numpy as np
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    started = time.monotonic()
    model = build_model(args, device)
    vocab = model.config.get_text_config().vocab_size
    items = make_items(args, vocab, args.batch * 2, 1)
    results: dict[str, Any] = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                               "torch": torch.__version__, "batch": args.batch, "width": args.width,
                               "canvas": args.canvas, "variants": {}}

    def save() -> None:
        Path(args.out).write_text(json.dumps(results, indent=2))
        print(json.dumps(results)[-3000:], flush=True)

    print(f"model built in {time.monotonic() - started:.1f} s", flush=True)
    if "micro" in args.blocks:
        results["attention_micro"] = attention_micro(args, DiffusionSlotReader(model, choice=KernelChoice()),
                                                     device)
        save()
    first = None
    for name in args.variants if "variants" in args.blocks else []:
        try:
            row, reads = variant(args, model, device, VARIANTS[name], items)
            first = reads if first is None else first
            row["max_abs_proba_diff_vs_first"] = max(float(np.abs(a.draws - b.draws).max())
                                                     for a, b in zip(reads, first))
        except Exception as exc:  # noqa: BLE001 (a failed variant is reported; the others run)
            row = {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}
        results["variants"][name] = row
        save()
    if "profile" in args.blocks and device.type == "cuda":
        reader = DiffusionSlotReader(model, choice=default_choice(model, compiled=True))  # shipped
        results["profile_default"] = profile(args, model, reader, device)
        sync(device)
        save()
    results["total_s"] = time.monotonic() - started
    save()


if __name__ == "__main__":
    main()
