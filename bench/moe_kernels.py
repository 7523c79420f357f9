"""One DiffusionGemma MoE layer's experts at the real sizes (H 2816, I 704, 128 experts, top 8):
moe.experts_forward with the Triton row ops (two CUTLASS grouped GEMMs) against triton_moe's
fused kernels over a sweep of launch shapes, each replayed from a CUDA graph, at one read (264
tokens: memory bound) and a batch of 32 reads (8,448 tokens: compute bound). CUDA only.

    python -m bench.moe_kernels --out $OUT/moe_kernels.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bench.common import print_table

HIDDEN, INTER, EXPERTS, TOP_K = 2816, 704, 128, 8
# Per token count: (block_m, gate/up tile, down tile), each tile (block_n, block_k, group_m,
# num_warps, num_stages), swept; the heuristic's own pick (pick_config) is always run too.
Shape = tuple[int, tuple[int, int, int, int, int], tuple[int, int, int, int, int]]
SWEEP: dict[int, list[Shape]] = {
    264: [(16, (64, 128, 1, 4, 4), (128, 64, 1, 4, 4)), (32, (64, 128, 1, 4, 4), (128, 64, 1, 4, 4)),
          (32, (32, 128, 1, 4, 4), (64, 64, 1, 4, 4)), (32, (64, 64, 1, 4, 6), (256, 64, 1, 4, 4)),
          (32, (64, 128, 4, 4, 3), (128, 64, 4, 4, 4)), (64, (64, 64, 4, 4, 4), (128, 64, 4, 4, 4)),
          (16, (64, 128, 1, 4, 3), (128, 64, 1, 4, 4))],
    8448: [(128, (128, 64, 8, 8, 3), (128, 64, 8, 8, 3)), (128, (128, 64, 8, 8, 4), (128, 64, 8, 8, 3)),
           (128, (128, 64, 8, 8, 3), (256, 64, 8, 8, 3)), (128, (64, 64, 8, 4, 4), (256, 64, 8, 8, 3)),
           (64, (128, 64, 8, 8, 4), (128, 64, 8, 4, 4)), (256, (128, 64, 8, 8, 3), (128, 64, 8, 8, 3)),
           (128, (128, 64, 16, 8, 4), (256, 64, 16, 8, 3)), (128, (128, 64, 4, 8, 4), (256, 64, 4, 8, 3))],
}
QUICK_SWEEP = 2  # configs per token count under --quick (after the heuristic's pick)


def wide_sweep(n_tokens: int, picked: Any) -> list[Any]:
    """``--wide``: one kernel's tile varied at a time, the other kept at the pick's (the two
    kernels run one after the other, so a row's difference from the pick is its varied kernel's),
    over each row-block size; then the pick's grouping varied for both. Shapes past the chip's
    shared memory are reported as errors and the sweep goes on."""
    from router.backends.torch.kernels.triton_moe import MoeConfig, Tile

    small = n_tokens * TOP_K / EXPERTS <= 32
    # 64-row blocks at a batch of reads measured 20% slower (the full sweep of 2026-12-03)
    block_ms = (16, 32) if small else (128,)
    gate_up_nk = [(32, 128), (64, 128), (64, 256), (128, 128)] if small else \
        [(64, 64), (64, 128), (128, 32), (128, 64)]
    down_nk = [(64, 128), (128, 64), (128, 128), (256, 64)] if small else \
        [(128, 64), (128, 128), (256, 32), (256, 64)]
    launch = [(4, 3), (4, 4), (8, 4)] if small else [(4, 4), (8, 3), (8, 4), (8, 5)]
    group = picked.gate_up.group_m
    configs = []
    for block_m in block_ms:
        for n, k in gate_up_nk:
            configs += [MoeConfig(block_m, Tile(n, k, group, w, s), picked.down) for w, s in launch]
        for n, k in down_nk:
            configs += [MoeConfig(block_m, picked.gate_up, Tile(n, k, group, w, s)) for w, s in launch]
    for g in (1, 4, 16, 32):
        configs.append(MoeConfig(picked.block_m, replace(picked.gate_up, group_m=g),
                                 replace(picked.down, group_m=g)))
    return list(dict.fromkeys(c for c in configs if c != picked))


def graph_ms(fn: Any, iters: int) -> tuple[float, Any, bool]:
    """Median ms of ``fn`` over ``iters`` replays of one captured CUDA graph (events around each
    replay), its output, and whether capture worked (else ``fn`` itself is timed)."""
    import torch

    from bench.gpu_variants import event_ms

    out = fn()  # compiles the Triton kernels outside the capture
    torch.cuda.synchronize()
    run = fn
    captured = True
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn()
        run = graph.replay
    except RuntimeError as exc:
        print(f"capture failed, timing eagerly: {exc}", file=sys.stderr)
        captured = False
    return event_ms(run, iters), out, captured


def layer(n_tokens: int, seed: int) -> tuple[Any, Any, Any, Any]:
    """Random bf16 experts, hidden rows and a softmax-over-top-8 routing of random logits."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    scale = HIDDEN ** -0.5

    def rand(*shape: int, std: float = 1.0) -> Any:
        return (torch.randn(shape, generator=gen, device="cuda") * std).bfloat16()

    experts = SimpleNamespace(num_experts=EXPERTS, gate_up_proj=rand(EXPERTS, 2 * INTER, HIDDEN, std=scale),
                              down_proj=rand(EXPERTS, HIDDEN, INTER, std=INTER ** -0.5),
                              act_fn=partial(torch.nn.functional.gelu, approximate="tanh"))
    hidden = rand(n_tokens, HIDDEN)
    logits = torch.randn((n_tokens, EXPERTS), generator=gen, device="cuda")
    weights, index = torch.topk(logits.softmax(-1), TOP_K, dim=-1)
    return experts, hidden, index, weights / weights.sum(-1, keepdim=True)


def measure(n_tokens: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    import torch

    from router.backends.torch.kernels import triton_moe
    from router.backends.torch.kernels.moe import experts_forward
    from router.backends.torch.kernels.row_ops import TRITON_OPS

    experts, hidden, index, weights = layer(n_tokens, seed=n_tokens)
    weight_bytes = (experts.gate_up_proj.numel() + experts.down_proj.numel()) * 2
    flops = 2 * n_tokens * TOP_K * 3 * INTER * HIDDEN

    def row(kernel: str, config: str, ms: float, captured: bool) -> dict[str, Any]:
        return {"tokens": n_tokens, "kernel": kernel, "config": config, "ms": round(ms, 4),
                "weight_tb_s": round(weight_bytes / ms / 1e9, 3),
                "tflop_s": round(flops / ms / 1e9, 1), "graph": captured}

    def fused_row(kernel: str, config: str, fn: Any) -> Any:
        """Times ``fn``, appends its row (or its error's) and returns its output (None if failed)."""
        try:
            ms, out, captured = graph_ms(fn, args.iters)
        # a shape past the chip's registers or shared memory is reported, the others run
        except Exception as exc:  # noqa: BLE001
            rows.append({"tokens": n_tokens, "kernel": kernel, "config": config,
                         "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
            return None
        rows.append(row(kernel, config, ms, captured) | {
            "vs_peer": round(peer_ms / ms, 3),
            "max_abs_diff": float((out.float() - peer.float()).abs().max())})
        return out

    with torch.inference_mode():
        peer_ms, peer, captured = graph_ms(
            partial(experts_forward, experts, hidden, index, weights, TRITON_OPS), args.iters)
        rows = [row("grouped_mm", "cutlass", peer_ms, captured) | {"vs_peer": 1.0,
                                                                   "max_abs_diff": 0.0}]
        picked = triton_moe.pick_config(n_tokens * TOP_K, EXPERTS)
        align_ms, _, captured = graph_ms(
            partial(triton_moe.align_pairs, index, EXPERTS, picked.block_m), args.iters)
        rows.append({"tokens": n_tokens, "kernel": "align_pairs (torch ops, the reference)",
                     "ms": round(align_ms, 4), "config": f"m{picked.block_m}", "graph": captured})
        for pairs in sorted({triton_moe.ALIGN_PAIRS_A_PROGRAM, 256, 1024}):
            align_ms, _, captured = graph_ms(partial(triton_moe.align_pairs_triton, index, EXPERTS,
                                                     picked.block_m, pairs_a_program=pairs), args.iters)
            shipped = pairs == triton_moe.ALIGN_PAIRS_A_PROGRAM
            rows.append({"tokens": n_tokens, "kernel": f"align_pairs_triton, {pairs} pairs a program",
                         "ms": round(align_ms, 4), "graph": captured,
                         "config": f"m{picked.block_m}" + (" (part of the pick)" if shipped else "")})
        if args.wide:
            others = wide_sweep(n_tokens, picked)
        else:
            swept = (triton_moe.MoeConfig(m, triton_moe.Tile(*gate_up), triton_moe.Tile(*down))
                     for m, gate_up, down in SWEEP[n_tokens])
            others = [c for c in swept if c != picked][: QUICK_SWEEP if args.quick else None]
        bf16_fused = partial(triton_moe.fused_experts, hidden, experts.gate_up_proj, experts.down_proj,
                             index, weights)
        fused_row("triton_fused", f"{picked} (pick)", partial(bf16_fused, config=picked))
        for config in others:
            fused_row("triton_fused", str(config), partial(bf16_fused, config=config))
        if args.wide:  # the pick again after the sweep: how far the chip drifted meanwhile
            fused_row("triton_fused", f"{picked} (pick, again)", partial(bf16_fused, config=picked))
        rows[0]["peer_max_abs"] = float(peer.float().abs().max())
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=sorted(SWEEP), choices=sorted(SWEEP))
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--quick", action="store_true",
                        help=f"the heuristic's pick and {QUICK_SWEEP} more configs, 10 replays")
    parser.add_argument("--wide", action="store_true",
                        help="sweep each kernel's tile alone over more shapes (wide_sweep)")
    parser.add_argument("--out", default="", help="write the rows as JSON here")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        sys.exit("bench.moe_kernels needs a CUDA device (Triton kernels at an H200's sizes); "
                 "none found")
    args.iters = 10 if args.quick else args.iters
    started = time.monotonic()
    rows = [r for n_tokens in args.tokens for r in measure(n_tokens, args)]
    columns = ["tokens", "kernel", "config", "ms", "weight_tb_s", "tflop_s", "vs_peer",
               "max_abs_diff", "graph"]  # config: m<block_m> gate_up <tile> down <tile>, a tile
    # being block_n/block_k/group_m/num_warps/num_stages; max_abs_diff: against the peer
    print_table(f"MoE experts on {torch.cuda.get_device_name()} (vs_peer: peer ms / ms)", columns,
                [[r.get(c, r.get("error", "")) if c == "ms" else r.get(c, "") for c in columns]
                 for r in rows])
    print(f"ran in {time.monotonic() - started:.1f} s", file=sys.stderr)
    if args.out:
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                              "torch": torch.__version__, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
