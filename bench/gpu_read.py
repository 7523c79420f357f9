"""Speed of a DiffusionGemma one-step slot read on a GPU, raw and through the shipped backend.

Builds the full DiffusionGemma-26B-A4B architecture with random bf16 weights (speed does not depend
on weight values), a 1,400-token static prefix + 200-token message, canvas 64, 77 labels, and times:
- raw-reader blocks (``DiffusionSlotReader.read``): transformers' two-pass read (the peer), the
  one-pass read with shared-prefix attention eagerly, and compiled + replayed as CUDA graphs;
- the ``backend`` block: ``TorchBackend.read`` as shipped (coalescing, compiled, graphs), single
  caller p50, 32 concurrent callers' reads/s, 4 draws over 1 (bench/gpu_backend.py);
- ``agreement``: the compiled/graph and two-pass probabilities against the eager one-pass read;
- ``profile``: kernel time by op of one compiled read at batch 1 and 32 (torch.profiler).
``--tiny`` runs the same code on a tiny config (CPU is fine) to catch bugs before a device call.

    python -m bench.gpu_read --config .devcarry/diffusiongemma-26B-A4B-it.config.json \\
        --tokenizer .devcarry/tokenizer
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.gpu_backend import measure_backend
from router.backends.torch.model.choice import KernelChoice, default_choice
from router.backends.torch.serve.diffusion import DiffusionSlotReader
from router.backends.torch.serve.graphs import GraphShapes
from router.backends.torch.serve.reader import SlotItem
from router.backends.torch.serve.two_pass import TwoPassSlotReader
from router.backends.torch.serve.warm_up import warm_up

ROOT = Path(__file__).resolve().parent.parent
TARGETS = {"single_p50_ms": 22, "concurrent32_reads_per_s": 300, "draws4_over_draws1": 1.3}


def tiny_config() -> Any:
    from transformers import DiffusionGemmaConfig

    return DiffusionGemmaConfig(
        text_config={
            "vocab_size": 49152, "hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 2,
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
    """The model of ``args`` with random weights on ``device``, each tied weight allocated once
    (``materialize``). Why not ``_from_config`` on the device: it allocates the encoder's AND the
    decoder's layer weights before ``post_init`` ties them, twice ~48 GB of experts, which does
    not fit an H100 (78 GiB gone while building)."""
    import torch
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

    if args.tiny:
        config = tiny_config()
    else:
        raw = json.loads(Path(args.config).read_text())
        if args.layers:  # a shallower model of the same width: quick agreement checks
            text = raw["text_config"]
            text["num_hidden_layers"], text["layer_types"] = args.layers, text["layer_types"][: args.layers]
        config = DiffusionGemmaConfig(**raw)
    config.canvas_length = args.canvas
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if args.dtype:
        dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    with torch.device(device), params_on_meta():
        model = DiffusionGemmaForBlockDiffusion._from_config(  # type: ignore[no-untyped-call]
            config, dtype=dtype, attn_implementation="sdpa", experts_implementation=args.experts)
    materialize(model, device, dtype)
    return model.eval()


@contextlib.contextmanager
def params_on_meta() -> Iterator[None]:
    """Parameters created meanwhile go to the meta device (no memory); buffers (the rotary
    tables, layer scalars) are made where they are asked for, with their values."""
    import torch

    original = torch.nn.Module.register_parameter

    def register(module: Any, name: str, param: Any) -> None:
        if param is not None and param.device.type != "meta":
            param = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        original(module, name, param)

    torch.nn.Module.register_parameter = register  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = original  # type: ignore[method-assign]


def materialize(model: Any, device: Any, dtype: Any) -> None:
    """Each distinct meta parameter (a tied weight is one object in both stacks) allocated once
    on ``device`` in ``dtype``, drawn at random, then the model's own ``_init_weights`` run over
    each module that holds parameters (norm scales, router scales: their real start values)."""
    import torch

    made: dict[int, Any] = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is not None and id(param) not in made:
                kind = dtype if param.is_floating_point() else param.dtype
                made[id(param)] = torch.nn.Parameter(torch.empty(param.shape, dtype=kind, device=device),
                                                     requires_grad=False)
            if param is not None:
                module._parameters[name] = made[id(param)]
    with torch.no_grad():
        for module in model.modules():
            own = [value for value in module._parameters.values() if value is not None]
            for value in own:
                value.normal_(0.0, 0.02)
            if own:
                try:
                    model._init_weights(module)
                except Exception as exc:  # noqa: BLE001 (speed does not depend on the values)
                    print(f"build_model: {type(module).__name__} keeps random values: {exc!r}")


def make_items(args: argparse.Namespace, vocab: int, n: int, draws: int, seed: int = 1234) -> list[SlotItem]:
    import torch

    g = torch.Generator().manual_seed(seed)
    prefix = tuple(torch.randint(10, vocab, (args.static_tokens,), generator=torch.Generator().manual_seed(7)).tolist())
    labels = tuple(torch.randperm(vocab - 10, generator=g)[: args.options].add(10).tolist())
    canvas = [int(x) for x in torch.randint(10, vocab, (args.canvas,), generator=g)]
    canvas[args.slot + 1 :] = [106] + [0] * (args.canvas - args.slot - 2)
    return [SlotItem(prefix, tuple(torch.randint(10, vocab, (args.message_tokens,), generator=g).tolist()),
                     tuple(canvas), args.slot, labels, draws, seed=k) for k in range(n)]


def sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def time_reads(read: Callable[[list[SlotItem]], Any], pool: list[SlotItem], batch: int, device: Any,
               iters: int) -> dict[str, float]:
    """p50/p99 of ``read`` over batches rotating through ``pool`` (no read repeats the last's inputs)."""
    sets = [pool[k * batch : (k + 1) * batch] for k in range(len(pool) // batch)]
    for k in range(2):
        read(sets[k % len(sets)])
    times = []
    for k in range(iters):
        sync(device)
        start = time.perf_counter()
        read(sets[k % len(sets)])
        sync(device)
        times.append((time.perf_counter() - start) * 1000)
    p50 = percentile(times, 50)
    return {"p50_ms": p50, "p99_ms": percentile(times, 99), "reads_per_s": batch / (p50 / 1000), "n": iters}


def make_fast(args: argparse.Namespace, model: Any, device: Any,
              choice: KernelChoice | None = None) -> DiffusionSlotReader:
    """The product's compiled one-pass reader (``choice``: default the device's), replaying CUDA
    graphs on the device (padded buffers, uncaptured, on the CPU)."""
    vocab = model.config.get_text_config().vocab_size
    on_cuda = device.type == "cuda"
    # inductor on the device; on the CPU (--tiny) the same graphs traced without a C++ build
    choice = choice or default_choice(model, compiled=True,
                                      compile_backend="inductor" if on_cuda else "aot_eager")
    shapes = GraphShapes(batches=(1, 8, *args.batches), draws=(1, 2, 4), widths=tuple(args.widths),
                         prefix_tokens=args.prefix_capacity, labels=128, capture=on_cuda)
    sample = make_items(args, vocab, 1, 1)[0]
    return warm_up(DiffusionSlotReader(model, choice=choice, graphs=shapes), sample)


def raw_blocks(args: argparse.Namespace, model: Any, device: Any, log: Callable[[str], None],
               results: dict[str, Any], deadline: float) -> DiffusionSlotReader:
    """Raw-reader variants; returns the compiled, graph-replaying reader for later blocks."""
    vocab = model.config.get_text_config().vocab_size
    configs = [(1, 1), (4, 1), *((1, b) for b in args.batches)]
    two_pass = TwoPassSlotReader(model)
    eager = DiffusionSlotReader(model)
    started = time.monotonic()
    fast = make_fast(args, model, device)
    results["raw_compile_capture_s"] = time.monotonic() - started
    log(f"compiled + captured in {results['raw_compile_capture_s']:.1f} s")
    variants: list[tuple[str, Any, list[tuple[int, int]]]] = [("two_pass/eager", two_pass, [(1, 1), (1, args.batches[0])]), ("onepass/eager", eager, configs),
                ("onepass/compiled_graph" if device.type == "cuda" else "onepass/compiled", fast, configs)]
    for name, reader, shapes in variants:
        for draws, batch in shapes:
            key = f"{name}/cached/draws{draws}/batch{batch}"
            if time.monotonic() > deadline:
                results["variants"][key] = {"skipped": "time budget"}
                continue
            pool = make_items(args, vocab, max(4, batch) * 3, draws)
            row: dict[str, Any]
            try:
                row = time_reads(reader.read, pool, batch, device, args.iters if batch == 1 else max(5, args.iters // 3))
            except Exception as exc:  # noqa: BLE001 (a failed variant is reported; the run goes on)
                row = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            results["variants"][key] = row
            log(f"{key:45s} {json.dumps(row)}")
    return fast


def agreement(args: argparse.Namespace, model: Any, fast: DiffusionSlotReader | None,
              device: Any) -> dict[str, Any]:
    """Label-probability differences against transformers' two-pass read of the same items: the
    one-pass read eagerly (with the attention kernel the reader picked, and with the float32
    reference attention) and compiled + replayed (where graphs can be captured in this dtype)."""
    from dataclasses import replace

    import numpy as np

    vocab = model.config.get_text_config().vocab_size
    out: dict[str, Any] = {"dtype": str(next(model.parameters()).dtype),
                           "layers": model.config.get_text_config().num_hidden_layers}
    # dense-bias prefix read, torch MoE, float32 reference attention
    reference = DiffusionSlotReader(model, choice=KernelChoice())
    shipped = DiffusionSlotReader(model)
    # the same kernels with the prompt rests' own keys read under their dense causal bias: the
    # peer of the causal path
    copied = DiffusionSlotReader(model, choice=replace(shipped.choice, causal_own=False))
    readers: list[tuple[str, Any]] = [("onepass_eager", lambda: shipped),
                                      ("onepass_eager_biased_own", lambda: copied),
                                      ("onepass_eager_math_attention", lambda: reference),
                                      ("compiled_graph", lambda: fast if fast is not None and fast.graphs
                                       is not None else make_fast(args, model, device))]
    # 2 draws an item: the canvases' keys copied per row; 1 draw: read in place
    for draws in (2, 1):
        items = make_items(args, vocab, 8, draws, seed=99)
        want = TwoPassSlotReader(model).read(items)
        part: dict[str, Any] = {"items": len(items), "draws": draws,
                                "max_proba": max(float(r.proba.max()) for r in want)}
        for name, make in readers:
            try:
                got = make().read(items)
            except Exception as exc:  # noqa: BLE001 (reported; the other comparisons still count)
                part[name] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
                continue
            diff = max(float(np.abs(a.draws - b.draws).max()) for a, b in zip(got, want))
            top = float(np.mean([a.proba.argmax() == b.proba.argmax() for a, b in zip(got, want)]))
            part[name] = {"max_abs_proba_diff": diff, "same_top_label": top}
        out[f"draws{draws}"] = part
    return out


def profile(args: argparse.Namespace, model: Any, fast: DiffusionSlotReader, device: Any) -> dict[str, Any]:
    """Kernel time by op of one compiled read (its one pass called directly, not graph-replayed:
    the profiler names each kernel), batch 1 and the largest batch."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    assert fast.onepass is not None
    vocab = model.config.get_text_config().vocab_size
    out: dict[str, Any] = {"choice": fast.choice.summary()}
    for batch in (1, args.batches[-1]):
        items = make_items(args, vocab, batch, 1, seed=5)
        prefix = items[0].prefix_ids
        with torch.inference_mode():
            kv = fast.onepass.prefix_kv(fast.prefix_cache(prefix), len(prefix))
            tensors = fast.prepare_onepass(items, prefix_len=len(prefix), device=device)
            onepass = fast.onepass_for(batch)  # as its graph bucket reads
            onepass(kv, tensors)
            sync(device)
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                onepass(kv, tensors)
                sync(device)
        events = prof.key_averages()
        kernels = [e for e in events if getattr(e, "device_type", None) is not None
                   and str(e.device_type).endswith("CUDA") and e.self_device_time_total > 0]
        out[f"batch{batch}"] = {
            "tokens": batch * (len(items[0].suffix_ids) + len(items[0].canvas_ids)),
            "gpu_kernel_ms": sum(e.self_device_time_total for e in kernels) / 1000,
            "kernels": [{"kernel": e.key[:90], "count": e.count, "ms": round(e.self_device_time_total / 1000, 4)}
                        for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[: args.top_ops]],
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / ".devcarry/diffusiongemma-26B-A4B-it.config.json"))
    parser.add_argument("--tokenizer", default=str(ROOT / ".devcarry/tokenizer"),
                        help="a local tokenizer folder for the backend block's prompts")
    parser.add_argument("--tiny", action="store_true", help="tiny random config (CPU test)")
    parser.add_argument("--static-tokens", type=int, default=1400)
    parser.add_argument("--message-tokens", type=int, default=200)
    parser.add_argument("--widths", type=int, nargs="+", default=[224, 256],
                        help="prompt-rest token buckets of the raw reader's graphs")
    parser.add_argument("--prefix-capacity", type=int, default=1536,
                        help="graph_prefix_tokens: the largest static prefix the graphs hold")
    parser.add_argument("--layers", type=int, default=0, help="keep only the first N layers (0: all)")
    parser.add_argument("--dtype", default="", help="model dtype (default: bfloat16 on CUDA, float32 on CPU)")
    parser.add_argument("--canvas", type=int, default=64)
    parser.add_argument("--slot", type=int, default=8)
    parser.add_argument("--options", type=int, default=77)
    parser.add_argument("--questions", type=int, default=1,
                        help="backend block: requests spread over this many questions")
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio",
                        help="backend block's event loop (uvloop: what `slotgate serve` runs on "
                             "when it is installed, as uvicorn[standard] installs it)")
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 32])
    parser.add_argument("--rounds", type=int, default=8, help="reads per concurrent caller")
    parser.add_argument("--callers", type=int, nargs="+", default=[1, 8, 16, 32, 64, 128],
                        help="concurrent callers of the backend block's curve")
    parser.add_argument("--experts", default="grouped_mm")
    parser.add_argument("--split-kv-items", type=int, default=None,
                        help="the backend block's TorchOptions.split_kv_items (default: the "
                             "device's; 0: the prefix read whole)")
    parser.add_argument("--split-kv-chunks", type=int, default=None,
                        help="the backend block's TorchOptions.split_kv_chunks (default: the device's)")
    parser.add_argument("--blocks", nargs="+", default=["raw", "agreement", "profile", "backend"])
    parser.add_argument("--budget-s", type=float, default=480.0)
    parser.add_argument("--top-ops", type=int, default=60)
    parser.add_argument("--out", default=str(ROOT / "bench/results/gpu_read.json"),
                        help="one run a file: bench/results/gpu_read.json for the H200, "
                             "gpu_read_<gpu>.json for another (bench.torch_docs: a table each)")
    parser.add_argument("--commit", default=None,
                        help="the code commit measured (default: git's HEAD, where git is here)")
    args = parser.parse_args()

    import torch
    import transformers

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    started = time.monotonic()
    deadline = started + args.budget_s

    def log(line: str) -> None:
        print(line, flush=True)

    model = build_model(args, device)
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "transformers": transformers.__version__, "tiny": args.tiny,
        "static_tokens": args.static_tokens, "message_tokens": args.message_tokens, "canvas": args.canvas,
        "options": args.options, "experts": args.experts,
        "params_b": round(sum(p.numel() for p in model.parameters()) / 1e9, 2),
        "targets": TARGETS, "variants": {},
        "command": "python -m bench.gpu_read " + " ".join(sys.argv[1:]),
        "code_commit": args.commit or head_commit(),
        "measured_on": datetime.date.today().isoformat(),
    }
    if device.type == "cuda":
        results["build_peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
    log(f"built model in {time.monotonic() - started:.1f} s on {device}; {results['params_b']} B params"
        f"; peak {results.get('build_peak_gib', '-')} GiB")
    fast: Any = None

    def shared_fast() -> DiffusionSlotReader:  # one compiled reader for the blocks that need one
        nonlocal fast
        if fast is None:
            started = time.monotonic()
            fast = make_fast(args, model, device)
            results["fast_compile_capture_s"] = time.monotonic() - started
            results["fast_choice"] = fast.choice.summary()
        return fast  # type: ignore[no-any-return]

    blocks: list[tuple[str, Callable[[], Any]]] = [
        ("raw", lambda: raw_blocks(args, model, device, log, results, deadline)),
        ("agreement", lambda: agreement(args, model, shared_fast(), device)),
        ("profile", lambda: profile(args, model, shared_fast(), device)),
        ("backend", lambda: measure_backend(args, model, device, log, deadline)),
    ]
    for name, run in blocks:
        if name not in args.blocks:
            continue
        if time.monotonic() > deadline:
            results[name] = {"skipped": "time budget"}
            continue
        try:
            value = run()
            if name == "raw":
                fast = value
            else:
                results[name] = value
                log(f"{name}: {json.dumps(value)[:2000]}")
        except Exception as exc:  # noqa: BLE001 (report and carry on: partial results still count)
            results[name] = {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}
            log(f"{name} failed: {results[name]['error']}")
        write(args, results)
    results["total_s"] = time.monotonic() - started
    write(args, results)
    table(results, log)


def head_commit() -> str:
    """git's short HEAD, or "unknown" where the tree has no git (a device copy)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout.strip() or "unknown"
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write(args: argparse.Namespace, results: dict[str, Any]) -> None:
    """Rewritten after each block, so a run cut short keeps what it measured."""
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))


def table(results: dict[str, Any], log: Callable[[str], None]) -> None:
    log("")
    log(f"{'variant':50s} {'p50 ms':>8s} {'p99 ms':>8s} {'reads/s':>9s}")
    for key, row in results["variants"].items():
        if "p50_ms" in row:
            log(f"{key:50s} {row['p50_ms']:8.1f} {row['p99_ms']:8.1f} {row['reads_per_s']:9.1f}")
    backend = results.get("backend", {})
    for field, target in TARGETS.items():
        value = backend.get(field)
        shown = f"{value:.2f}" if isinstance(value, float) else str(value)
        log(f"backend {field:28s} {shown:>10s}   target {target}")
    log(f"backend compiled: {backend.get('compiled')}")


if __name__ == "__main__":
    main()
