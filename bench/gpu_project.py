"""A PROJECTION of the DiffusionGemma read on an A100-80GB from the kernel profile measured on the
H200 (bench/results/gpu_read.json, written by bench/gpu_read.py). Nothing here ran on an A100.

Each profiled kernel is scaled by the ratio of the two GPUs' datasheet rates for what bounds it:
at batch 1 every kernel streams weights (memory bandwidth); at batch 32 the matrix kernels (expert
grouped GEMMs, dense GEMMs, attention) are bound by bf16 arithmetic and the rest by bandwidth.
Host time (measured read minus kernel time) is carried over unchanged.

    python -m bench.gpu_project
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Datasheet figures: H200 SXM 4.8 TB/s HBM3e, 989 TFLOP/s dense bf16; A100-80GB SXM 2.039 TB/s
# HBM2e, 312 TFLOP/s dense bf16. Both run at a similar fraction of these in practice.
H200 = {"bandwidth_tb_s": 4.8, "bf16_tflop_s": 989.0}
A100 = {"bandwidth_tb_s": 2.039, "bf16_tflop_s": 312.0}
MATRIX_KERNELS = ("gemm", "nvjet", "fmha", "attention", "sdpa")


def project(profile: dict[str, Any], *, compute_bound: bool) -> dict[str, float]:
    """(H200 kernel ms, projected A100 kernel ms) from one profiled read's top kernels; kernels
    outside the top list are counted as bandwidth-bound."""
    memory = H200["bandwidth_tb_s"] / A100["bandwidth_tb_s"]
    compute = H200["bf16_tflop_s"] / A100["bf16_tflop_s"]
    total = profile["gpu_kernel_ms"]
    matrix = sum(k["ms"] for k in profile.get("kernels", profile.get("top_kernels", []))
                 if any(tag in k["kernel"].lower() for tag in MATRIX_KERNELS)) if compute_bound else 0.0
    return {"h200_kernel_ms": total, "a100_kernel_ms": matrix * compute + (total - matrix) * memory,
            "matrix_ms": matrix}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", default=str(ROOT / "bench/results/gpu_read.json"))
    args = parser.parse_args()
    results = json.loads(Path(args.results).read_text())
    profile, backend = results["profile"], results["backend"]
    single = project(profile["batch1"], compute_bound=False)
    batch = project(profile["batch32"], compute_bound=True)
    host_single = max(0.0, backend["single_p50_ms"] - single["h200_kernel_ms"])
    batch_ms = 32 * 1000 / backend["concurrent32_reads_per_s"]
    host_batch = max(0.0, batch_ms - batch["h200_kernel_ms"])
    rows = {
        "single_p50_ms": (backend["single_p50_ms"], single["a100_kernel_ms"] + host_single),
        "concurrent32_reads_per_s": (backend["concurrent32_reads_per_s"],
                                     32 * 1000 / (batch["a100_kernel_ms"] + host_batch)),
        "batch1_kernel_ms": (single["h200_kernel_ms"], single["a100_kernel_ms"]),
        "batch32_kernel_ms": (batch["h200_kernel_ms"], batch["a100_kernel_ms"]),
    }
    print("PROJECTION for an A100-80GB (not measured): H200 figures scaled by datasheet ratios "
          f"(bandwidth {H200['bandwidth_tb_s'] / A100['bandwidth_tb_s']:.2f}x, "
          f"bf16 {H200['bf16_tflop_s'] / A100['bf16_tflop_s']:.2f}x)")
    print(f"{'figure':26s} {'H200 measured':>14s} {'A100 projected':>15s}")
    for name, (measured, projected) in rows.items():
        print(f"{name:26s} {measured:14.1f} {projected:15.1f}")
    print(f"weights: {results['params_b']} B params x 2 bytes = {results['params_b'] * 2:.1f} GB of 80 GB")


if __name__ == "__main__":
    main()
