"""The DiffusionGemma read's roofline: the kernel profile measured on the H200 (bench/gpu_read.py's
``profile`` block in bench/results/gpu_read.json) grouped by kernel kind, each group's time set
against the FLOPs (matrix groups) or bytes (memory groups) it must do, counted from the model's
shapes, as a share of the H200's datasheet peak; and the same groups PROJECTED onto an A100-80GB
(nothing here ran on an A100): matrix groups scale by the bf16 rate ratio at batch 32, every
group by the bandwidth ratio at batch 1 (where the read streams weights), the rest by bandwidth.

    python -m bench.gpu_roofline [--results bench/results/gpu_read.json]
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT.parent / "shared/models/diffusiongemma-26B-A4B-it.config.json"
# Datasheet peaks (dense bf16, HBM): H200 SXM 989 TFLOP/s, 4.8 TB/s; A100-80GB SXM 312, 2.039.
PEAK = {"H200": (989e12, 4.8e12), "A100-80GB": (312e12, 2.039e12)}
# Kernel groups by name, first match wins; "matrix" groups are counted in FLOPs, the rest in bytes.
GROUPS: list[tuple[str, str, bool]] = [
    ("band softmax / logsumexp", r"logsumexp|softmax", False),
    # inductor names a reduction kernel triton_red_ (looped) or triton_per_ (persistent: one row in
    # registers); both are norms here when they take a mean (they also hold the fused cats, rotary)
    ("norms (compiled)", r"triton_(red|per)_fused.*mean|rsqrt", False),
    ("activation (gelu x up)", r"gelu|tanh", False),
    # the fused Triton MoE's two kernels (gather and activation inside), or CUTLASS's grouped GEMM
    ("expert GEMMs", r"_gate_up_kernel|_down_kernel|enable_3x_kernel_for_sm9x|GroupProblem|grouped_gemm",
     True),
    ("attention (cuDNN / mem-efficient)", r"sdpa|fmha|flash|attention", True),
    ("dense GEMMs (cuBLAS)", r"nvjet|gemm|cutlass|xmma", True),  # with the global layers' band read
    ("MoE row copies (gather, combine)", r"_gather_kernel|_combine_kernel", False),
    ("attention merge", r"_merge_kernel", False),  # the parts' and split_kv's _chunk_merge_kernel
    # the Triton router tail and pair alignment (triton_router.py, triton_moe.align_pairs_triton),
    # or the torch ops they replaced (_align_one_kernel: 7b41684's one-program form, in older profiles)
    ("router top-k, pair alignment", (r"_route_kernel|_count_kernel|_offsets_kernel|_place_kernel|"
     r"_align_one_kernel|sort|topk|histc|histogram|scatter|cumsum"), False),
    ("concatenations, row gathers (rows' own keys)", r"cat|index_select|gather|copy", False),
]


def shapes(config_path: Path) -> dict[str, Any]:
    text = json.loads(config_path.read_text())["text_config"]
    hidden, heads = text["hidden_size"], text["num_attention_heads"]
    layers = []
    for kind in text["layer_types"]:
        glob = kind == "full_attention"
        dim = text["global_head_dim"] if glob else text["head_dim"]
        kv = text["num_global_key_value_heads"] if glob else text["num_key_value_heads"]
        # q, k, v (global layers share k as v: no v_proj), o; the dense MLP (gate, up, down)
        attn = hidden * heads * dim * 2 + hidden * kv * dim * (1 if glob else 2)
        layers.append({"kind": kind, "dim": dim, "kv": kv, "dense": attn + 3 * hidden * text["intermediate_size"]})
    expert = 3 * hidden * text["moe_intermediate_size"]
    return {"hidden": hidden, "heads": heads, "layers": layers, "expert": expert,
            "experts": text["num_experts"], "top_k": text["top_k_experts"], "vocab": text["vocab_size"],
            "window": text["sliding_window"]}


def work(m: dict[str, Any], items: int, width: int, canvas: int, prefix: int,
         fused_moe: bool = False) -> dict[str, float]:
    """FLOPs and bytes one batch of ``items`` reads must do (two streams: ``width`` prompt-rest
    tokens and ``canvas`` canvas tokens per item, a shared prefix of ``prefix`` tokens);
    ``fused_moe``: the experts' gather happens inside their GEMM (only the combine copies rows)."""
    tokens = items * (width + canvas)
    sliding_keys = min(prefix, m["window"] - 1)
    dense_f = sum(2 * tokens * layer["dense"] for layer in m["layers"]) + 2 * items * m["hidden"] * m["vocab"]
    expert_f = len(m["layers"]) * 2 * tokens * m["top_k"] * m["expert"]
    attn_f = band_f = 0.0  # band_f: the global layers' prefix read, run as cuBLAS GEMMs (band)
    for layer in m["layers"]:
        keys = sliding_keys if layer["kind"] == "sliding_attention" else prefix
        own = width / 2 + canvas  # causal prompt rest, plus the canvas over its row's keys
        attn_f += 4 * tokens * m["heads"] * layer["dim"] * (keys + own)
        if layer["kind"] == "full_attention":
            band_f += 4 * tokens * m["heads"] * layer["dim"] * keys
    touched = min(m["experts"], tokens * m["top_k"])  # experts a batch reads (all, past ~16 tokens)
    weight_bytes = 2 * (len(m["layers"]) * touched * m["expert"] + sum(x["dense"] for x in m["layers"])
                        + m["hidden"] * m["vocab"])
    row_bytes = 2 * tokens * m["hidden"]
    layers = len(m["layers"])
    return {"tokens": tokens, "expert_flops": expert_f, "dense_flops": dense_f, "attention_flops": attn_f,
            "band_flops": band_f,
            "weight_bytes": weight_bytes, "expert_weight_bytes": 2 * layers * touched * m["expert"],
            # gather: each token read once (its k copies hit L2), k rows written; combine: k rows read,
            # one written
            "copy_bytes": layers * row_bytes * ((1 + m["top_k"]) if fused_moe else (2 + 2 * m["top_k"])),
            # both parts of each query's heads in, one out (the mean head dim of 256 and 512 layers)
            "merge_bytes": layers * 2 * tokens * m["heads"] * 512 * 3 / 2}


def table(results: dict[str, Any], m: dict[str, Any]) -> list[dict[str, Any]]:
    profile, backend = results["profile"], results.get("backend", {})
    rows = []
    prefix = int(backend.get("prefix_tokens", results.get("static_tokens", 1400)))
    canvas = int(results.get("canvas", 64))
    for key in sorted((k for k in profile if k.startswith("batch")), key=lambda k: int(k[5:])):
        items = int(key[5:])
        prof = profile[key]
        # the profiled items' prompt rests (older results: the message tokens, no "tokens" key)
        width = prof["tokens"] // items - canvas if "tokens" in prof else int(results["message_tokens"])
        fused_moe = bool(profile.get("choice", {}).get("fused_moe", False))
        w = work(m, items, width, canvas, prefix, fused_moe)
        need = {"expert GEMMs": (w["expert_flops"], w["expert_weight_bytes"]),
                "dense GEMMs (cuBLAS)": (w["dense_flops"] + w["band_flops"],
                                         w["weight_bytes"] - w["expert_weight_bytes"]),
                "attention (cuDNN / mem-efficient)": (w["attention_flops"] - w["band_flops"], 0.0),
                "MoE row copies (gather, combine)": (0.0, w["copy_bytes"]),
                "attention merge": (0.0, w["merge_bytes"])}
        grouped: dict[str, float] = {}
        for kernel in prof.get("kernels", prof.get("top_kernels", [])):
            name = next((g for g, pattern, _ in GROUPS if re.search(pattern, kernel["kernel"], re.IGNORECASE)),
                        "other element-wise / copies")
            grouped[name] = grouped.get(name, 0.0) + kernel["ms"]
        grouped["outside the profile's top kernels"] = prof["gpu_kernel_ms"] - sum(grouped.values())
        for name, ms in sorted(grouped.items(), key=lambda kv: -kv[1]):
            matrix = next((flag for g, _, flag in GROUPS if g == name), False)
            flops, bytes_ = need.get(name, (0.0, 0.0))
            row: dict[str, Any] = {"batch": items, "group": name, "h200_ms": round(ms, 2)}
            if flops and matrix:
                row["tflop"] = round(flops / 1e12, 2)
                row["h200_share_of_peak_flops"] = round(flops / (ms / 1e3) / PEAK["H200"][0], 3)
            if bytes_:
                row["gb"] = round(bytes_ / 1e9, 2)
                row["h200_share_of_peak_bw"] = round(bytes_ / (ms / 1e3) / PEAK["H200"][1], 3)
            compute_bound = matrix and items > 1
            ratio = (PEAK["H200"][0] / PEAK["A100-80GB"][0] if compute_bound
                     else PEAK["H200"][1] / PEAK["A100-80GB"][1])
            row["a100_projected_ms"] = round(ms * ratio, 1)
            rows.append(row)
        rows.append({"batch": items, "group": "TOTAL kernels", "h200_ms": round(prof["gpu_kernel_ms"], 2),
                     "a100_projected_ms": round(sum(r["a100_projected_ms"] for r in rows
                                                    if r["batch"] == items), 1),
                     "floor_h200_ms": round(1e3 * max((w["expert_flops"] + w["dense_flops"] + w["attention_flops"])
                                                      / PEAK["H200"][0], w["weight_bytes"] / PEAK["H200"][1]), 1)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", default=str(ROOT / "bench/results/gpu_read.json"))
    parser.add_argument("--config", default=str(CONFIG))
    args = parser.parse_args()
    results = json.loads(Path(args.results).read_text())
    for row in table(results, shapes(Path(args.config))):
        print(json.dumps(row))


if __name__ == "__main__":
    main()
