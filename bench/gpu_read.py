"""Speed of a DiffusionGemma one-step slot read (router/backends/torch/diffusion.py) on a GPU.

Builds the full DiffusionGemma-26B-A4B architecture with random bf16 weights (speed does not depend
on weight values), a 1,600-token prompt (1,400 static tokens + 200 message tokens), canvas 64, 77
labels, and times single reads (p50/p99) and batched reads per second, with the static prefix
cached and not, for 1 and 4 noise draws, eager and replayed as CUDA graphs. ``--tiny`` runs the
same code on a tiny config (CPU is fine) to catch bugs before a device call.

    python -m bench.gpu_read --config .devcarry/diffusiongemma-26B-A4B-it.config.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

from bench.gpu_speedups import (
    GraphedRead,
    compile_attention_inputs,
    compile_ffn_blocks,
    compile_layers,
    fuse_norms,
)
from router.backends.torch.diffusion import DiffusionSlotReader, SlotItem


def tiny_config() -> Any:
    from transformers import DiffusionGemmaConfig

    return DiffusionGemmaConfig(
        text_config={
            "vocab_size": 4096, "hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 2,
            "layer_types": ["sliding_attention", "full_attention"], "num_attention_heads": 2,
            "num_key_value_heads": 1, "head_dim": 16, "global_head_dim": 32, "num_global_key_value_heads": 1,
            "num_experts": 8, "top_k_experts": 2, "moe_intermediate_size": 32, "sliding_window": 1024,
        },
        vision_config={
            "model_type": "gemma4_vision", "hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 1,
            "num_attention_heads": 2, "head_dim": 16, "patch_size": 4, "pooling_kernel_size": 2,
            "position_embedding_size": 64,
        },
        canvas_length=64,
    )


def build_model(args: argparse.Namespace, device: Any) -> Any:
    import torch
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

    if args.tiny:
        config = tiny_config()
    else:
        config = DiffusionGemmaConfig(**json.loads(Path(args.config).read_text()))
    config.canvas_length = args.canvas
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        model = DiffusionGemmaForBlockDiffusion._from_config(
            config, dtype=dtype, attn_implementation="sdpa", experts_implementation=args.experts
        )
    return model.eval()


def make_items(args: argparse.Namespace, vocab: int, n: int, draws: int) -> list[SlotItem]:
    import torch

    g = torch.Generator().manual_seed(1234)
    prefix = tuple(torch.randint(10, vocab, (args.static_tokens,), generator=g).tolist())
    labels = tuple(torch.randperm(vocab - 10, generator=g)[: args.options].add(10).tolist())
    canvas = [int(x) for x in torch.randint(10, vocab, (args.canvas,), generator=g)]
    canvas[args.slot + 1 :] = [106] + [0] * (args.canvas - args.slot - 2)
    items = []
    for k in range(n):
        suffix = tuple(torch.randint(10, vocab, (args.message_tokens,), generator=g).tolist())
        items.append(SlotItem(prefix, suffix, tuple(canvas), args.slot, labels, draws, seed=k))
    return items


def sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def time_calls(fn: Callable[[], Any], device: Any, iters: int) -> list[float]:
    times = []
    for _ in range(iters):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - start) * 1000)
    return times


def measure(args: argparse.Namespace, model: Any, device: Any, log: Callable[[str], None],
            *, tag: str = "", modes: list[str] | None = None, deadline: float | None = None,
            configs: tuple[tuple[int, int], ...] | None = None) -> dict[str, Any]:
    import torch

    vocab = model.config.get_text_config().vocab_size
    results: dict[str, Any] = {}
    deadline = deadline or time.monotonic() + args.budget_s
    configs = configs or ((1, 1), (1, args.batch), (4, 1), (4, args.batch))
    for mode in modes or args.modes:
        for cached in (True, False):
            reader = DiffusionSlotReader(model, use_prefix_cache=cached, fused_pass=not args.two_pass)
            passes = "" if args.two_pass or reader.fused is None else "onepass+"
            for draws, batch in configs:
                key = f"{tag}{passes}{mode}/{'cached' if cached else 'uncached'}/draws{draws}/batch{batch}"
                if time.monotonic() > deadline:
                    results[key] = {"skipped": "time budget"}
                    continue
                pool = make_items(args, vocab, max(8, batch) * 2, draws)
                try:
                    if mode == "graph":
                        graphed = GraphedRead(reader, pool[:batch], cached)
                        call = graphed
                    else:
                        call = reader.read
                    for k in range(2):
                        call(pool[k * batch : (k + 1) * batch])
                    # rotate through several input sets, so no read repeats the last one's inputs
                    sets = [pool[k * batch : (k + 1) * batch] for k in range(len(pool) // batch)]
                    rotation = iter(sets * 10**4)
                    times = time_calls(lambda call=call, rotation=rotation: call(next(rotation)),
                                       device, args.iters if batch == 1 else max(5, args.iters // 2))
                    row = {
                        "p50_ms": percentile(times, 50), "p99_ms": percentile(times, 99),
                        "reads_per_s": batch / (percentile(times, 50) / 1000), "n": len(times),
                    }
                    if mode == "graph":
                        del graphed
                except Exception as exc:  # noqa: BLE001 (a failed variant is reported; the run goes on)
                    row = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
                results[key] = row
                log(f"{key:40s} {json.dumps(row)}")
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    return results


def breakdown(args: argparse.Namespace, model: Any, device: Any, log: Callable[[str], None]) -> dict[str, Any]:
    """Where one eager cached read spends its time: encoder vs decoder vs slot read (CUDA
    events), the profiler's top ops, and GPU-busy time against wall time."""
    import torch

    vocab = model.config.get_text_config().vocab_size
    reader = DiffusionSlotReader(model, use_prefix_cache=True)
    item = make_items(args, vocab, 2, 1)
    reader.read(item[:1])
    out: dict[str, Any] = {}
    if device.type == "cuda":
        batch = reader.prepare(item[1:], prefix_len=len(item[0].prefix_ids))
        base = reader.prefix_cache(item[0].prefix_ids)
        from router.backends.torch.kv_cache import fork_cache, select_cache_rows

        with torch.inference_mode():
            for _ in range(2):
                ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
                t0 = time.perf_counter()
                ev[0].record()
                cache = fork_cache(base, 1)
                kw = {reader._encoder_cache_kw: cache}
                reader.encoder(input_ids=batch.input_ids, position_ids=batch.position_ids, **kw)
                ev[1].record()
                rows = select_cache_rows(cache, batch.row_item)
                reader.decoder(
                    decoder_input_ids=batch.canvas, decoder_position_ids=batch.canvas_positions,
                    **{reader._decoder_cache_kw: rows},
                )
                ev[2].record()
                torch.cuda.synchronize()
                wall = (time.perf_counter() - t0) * 1000
            out["encoder_ms"] = ev[0].elapsed_time(ev[1])
            out["decoder_ms"] = ev[1].elapsed_time(ev[2])
            out["wall_ms"] = wall
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        reader.read(item[1:])
        sync(device)
    sort = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    table = prof.key_averages().table(sort_by=sort, row_limit=args.top_ops)
    log(table)
    batch_items = make_items(args, vocab, args.batch, 1)
    reader.read(batch_items)
    with profile(activities=activities) as batch_prof:
        reader.read(batch_items)
        sync(device)
    log(f"batch {args.batch}, cached prefix, eager:")
    log(batch_prof.key_averages().table(sort_by=sort, row_limit=args.top_ops))
    out["batch_top_ops"] = [
        {"op": e.key[:60], "count": e.count, "device_ms": getattr(e, "device_time_total", 0) / 1000}
        for e in sorted(batch_prof.key_averages(),
                        key=lambda e: getattr(e, "device_time_total", 0) or e.cpu_time_total,
                        reverse=True)[: args.top_ops]
    ]
    events = prof.key_averages()
    if device.type == "cuda":
        gpu_us = sum(getattr(e, "self_device_time_total", 0) for e in events)
        out["gpu_busy_ms"] = gpu_us / 1000
        out["kernel_launches"] = sum(e.count for e in events if e.key.startswith("cudaLaunchKernel"))
    out["top_ops"] = [
        {"op": e.key[:60], "count": e.count,
         "device_ms": getattr(e, "device_time_total", 0) / 1000, "cpu_ms": e.cpu_time_total / 1000}
        for e in sorted(events, key=lambda e: getattr(e, "device_time_total", 0) or e.cpu_time_total,
                        reverse=True)[: args.top_ops]
    ]
    log(json.dumps({k: v for k, v in out.items() if k != "top_ops"}))
    return out


def summary(results: dict[str, Any], batch: int) -> dict[str, Any]:
    """The headline numbers: the fastest mode that worked, per prefix setting."""
    best: dict[str, Any] = {}
    for prefix in ("cached", "uncached"):
        def pick(draws: int, b: int, field: str, prefix: str = prefix) -> tuple[float | None, str | None]:
            found = [
                (row[field], key.split("/")[0]) for key, row in results.items()
                if f"/{prefix}/draws{draws}/batch{b}" in key and field in row
            ]
            if not found:
                return None, None
            return (min(found) if field == "p50_ms" else max(found))

        p50, mode = pick(1, 1, "p50_ms")
        p99 = results.get(f"{mode}/{prefix}/draws1/batch1", {}).get("p99_ms") if mode else None
        batched = [
            (row["reads_per_s"], key.split("/")[0], int(key.rsplit("batch", 1)[1]))
            for key, row in results.items()
            if f"/{prefix}/draws1/batch" in key and "reads_per_s" in row
            and not key.endswith("/batch1")
        ]
        rps, rps_mode, batch = max(batched) if batched else (None, None, batch)
        d4 = results.get(f"{mode}/{prefix}/draws4/batch1", {}).get("p50_ms") if mode else None
        best[prefix] = {
            "single_p50_ms": p50, "single_p99_ms": p99, "single_mode": mode,
            "batched_reads_per_s": rps, "batched_mode": rps_mode, "batch": batch,
            "draws4_over_draws1": (d4 / p50) if (d4 and p50) else None,
        }
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / ".devcarry/diffusiongemma-26B-A4B-it.config.json"))
    parser.add_argument("--tiny", action="store_true", help="tiny random config (CPU test)")
    parser.add_argument("--static-tokens", type=int, default=1400)
    parser.add_argument("--message-tokens", type=int, default=200)
    parser.add_argument("--canvas", type=int, default=64)
    parser.add_argument("--slot", type=int, default=8)
    parser.add_argument("--options", type=int, default=77)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--batches", type=int, nargs="+", default=[16],
                        help="batch sizes of the optimised variants' throughput runs")
    parser.add_argument("--experts", default="grouped_mm")
    parser.add_argument("--modes", nargs="+", default=["eager", "graph"])
    parser.add_argument("--budget-s", type=float, default=420.0)
    parser.add_argument("--top-ops", type=int, default=15)
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--two-pass", action="store_true",
                        help="encoder then decoder (two passes over the weights), as transformers does")
    parser.add_argument("--profile-after", action="store_true",
                        help="profile one eager read again after the optimisations")
    parser.add_argument("--opts", nargs="+", default=["base"],
                        help="base, then cumulative optimisations: fused_norm, compiled_ffn, compiled_qkv, compiled_layers")
    parser.add_argument("--opt-modes", nargs="+", default=["graph"])
    parser.add_argument("--apply-only", nargs="*", default=[],
                        help="optimisations to apply without measuring (measured in an earlier run)")
    parser.add_argument("--out", default=str(ROOT / "bench/results/gpu_read.json"))
    args = parser.parse_args()

    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu":
        args.modes = [m for m in args.modes if m != "graph"]
    started = time.monotonic()
    lines: list[str] = []

    def log(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    import transformers

    model = build_model(args, device)
    log(f"built model in {time.monotonic() - started:.1f} s on {device}; torch {torch.__version__}, "
        f"transformers {transformers.__version__}, "
        f"params {sum(p.numel() for p in model.parameters()) / 1e9:.2f} B")
    info: dict[str, Any] = {}
    if not args.no_profile:
        try:
            info = breakdown(args, model, device, log)
        except Exception as exc:  # noqa: BLE001 (report and carry on: partial results still count)
            log(f"breakdown failed: {type(exc).__name__}: {exc}")
    results: dict[str, Any] = {}
    deadline = time.monotonic() + args.budget_s
    for opt in args.opts:
        if opt == "base":
            results.update(measure(args, model, device, log, deadline=deadline))
            continue
        if time.monotonic() > deadline:
            log(f"{opt}: skipped (time budget)")
            continue
        try:
            if opt == "fused_norm":
                fuse_norms()
            elif opt == "compiled_ffn":
                compile_ffn_blocks()
            elif opt == "compiled_qkv":
                compile_attention_inputs()
            else:
                compile_layers(model)
        except Exception as exc:  # noqa: BLE001 (report and carry on: partial results still count)
            log(f"{opt}: could not apply: {type(exc).__name__}: {exc}")
            continue
        if opt in args.apply_only:
            continue
        results.update(measure(args, model, device, log, tag=f"{opt}+", modes=args.opt_modes,
                               deadline=deadline,
                               configs=((1, 1), (4, 1), *((1, b) for b in args.batches))))
        write(args, device, results, info, log, final=False)
    if args.profile_after:
        try:
            info["after_opts"] = breakdown(args, model, device, log)
        except Exception as exc:  # noqa: BLE001 (report and carry on: partial results still count)
            log(f"breakdown after optimisations failed: {type(exc).__name__}: {exc}")
    write(args, device, results, info, log, final=True)
    log(f"total {time.monotonic() - started:.0f} s")


def write(args: argparse.Namespace, device: Any, results: dict[str, Any], info: dict[str, Any],
          log: Callable[[str], None], *, final: bool) -> None:
    """The JSON (rewritten after each optimisation, so a run cut short keeps what it measured)
    and, at the end, the table."""
    import torch
    import transformers

    best = summary(results, args.batch)
    payload = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "transformers": transformers.__version__,
        "tiny": args.tiny, "static_tokens": args.static_tokens, "message_tokens": args.message_tokens,
        "canvas": args.canvas, "options": args.options, "experts": args.experts,
        "cached": best["cached"], "uncached": best["uncached"],
        "single_p50_ms": {k: best[k]["single_p50_ms"] for k in best},
        "batched_reads_per_s": {k: best[k]["batched_reads_per_s"] for k in best},
        "draws4_over_draws1": {k: best[k]["draws4_over_draws1"] for k in best},
        "variants": results, "breakdown": info,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(payload, indent=2))
    if not final:
        return
    log("")
    log(f"{'prefix':9s} {'p50 ms':>8s} {'p99 ms':>8s} {'mode':>6s} {'reads/s':>9s} {'4 draws/1':>10s}")
    for prefix, row in best.items():
        def fmt(v: Any) -> str:
            return f"{v:.1f}" if isinstance(v, float) else str(v)
        log(f"{prefix:9s} {fmt(row['single_p50_ms']):>8s} {fmt(row['single_p99_ms']):>8s} "
            f"{row['single_mode']!s:>6s} {fmt(row['batched_reads_per_s']):>9s} "
            f"{fmt(row['draws4_over_draws1']):>10s}")


if __name__ == "__main__":
    main()
