"""FP8 (e4m3) copies of a DiffusionGemma's expert weights, an opt-in read that streams half the
bytes of a single read (``TorchOptions.fp8 = "experts"``).

Weights are quantized once, per output channel (scale = amax / 448, e4m3's largest value), into
copies beside the model's bf16 weights, which stay (the prefix encoding and the reference read
use them; nothing of the model is changed). Two products read them: the fused Triton MoE
weight-only (triton_moe.py: e4m3 widened in the kernel, activations bf16; the device's choice),
and, where that kernel cannot serve, ``torch._scaled_grouped_mm`` with the rows quantized per row
(float32 accumulation, bf16 out; elsewhere an emulation does the same arithmetic: dequantized
e4m3 values, float32 sums, the scales applied after the sum, rounded once to bf16, so the CPU
tests check it). ``fp8_problem`` says whether a device can serve the CUDA product.

Why experts only: FP8 copies of the dense projections through ``torch._scaled_mm`` were measured
slower than bf16 on an H200 (0.25 against 0.03 ms for 1,408 x 2,816 at a single read's 264 rows;
the per-row activation quantization around each product costs more than the bytes it saves) and
were removed (docs/backends.md). Memory added for the released model (30 layers, E=128 experts of
I=704, hidden H=2816): 30 x (128x1408x2816 + 128x2816x704) bytes of e4m3 + float32 scales = 22.90
GB, beside the ~45.7 GB of bf16 experts whose reads it halves.

Keying: the hot path gets a layer's copies as an ``Fp8Layer`` argument (a NamedTuple of tensors),
looked up by layer index outside compiled code. Looking them up by module inside a compiled
function is a trap: ``table[id(module)]`` makes dynamo guard each module's identity (one graph per
module), and a dict keyed by the modules themselves compiled into ONE graph that returned the
first module's weights for every module (torch 2.13, CPU, eager backend).
"""

from __future__ import annotations

import argparse
import functools
import logging
from types import SimpleNamespace
from typing import Any, NamedTuple

import torch

from router.backends.torch.moe import experts_forward
from router.backends.torch.ops import TORCH_OPS, RowOps, row_ops, triton_problem

log = logging.getLogger(__name__)

E4M3_MAX = 448.0  # largest finite float8_e4m3fn
# Hopper's fast FP8 accumulation (no promotion to float32 every few k-steps): gate_up of one layer
# at 67,584 rows took 0.63 ms with it, 2.23 ms without (bf16: 0.99 ms), on an H200
FAST_ACCUM = True
# CUDA vs emulation, over the largest output: sums of 8,192 measured 0.0059 with fast accumulation
# (0.0030 without: one bf16 rounding step); 2^-6 leaves room and is a tenth of e4m3's own error
# against bf16 (0.053), where a wrong layout or scale is off by order 1
CHECK_RTOL = 2.0**-6


class Fp8Weight(NamedTuple):
    """A weight (..., N, K) in e4m3 and its float32 scale per output channel (..., N)."""

    weight: torch.Tensor
    scale: torch.Tensor


class Fp8Layer(NamedTuple):
    """The FP8 copies of one layer's experts (the encoder and decoder layer of an index share
    them: their weights are tied)."""

    gate_up: Fp8Weight  # experts (E, 2I, H)
    down: Fp8Weight  # experts (E, H, I)


def _scale(amax: torch.Tensor) -> torch.Tensor:
    """amax / 448 in float32, 1 where amax is 0 (an all-zero row quantizes to zeros, not NaN)."""
    amax = amax.float()
    return torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))


def quantize_rows(weight: torch.Tensor) -> Fp8Weight:
    """``weight`` (..., N, K) as e4m3 with one float32 scale per row along N (per output channel
    of a weight; per token of activations): ``dequantize(q) ~= weight`` within 2^-4 relative per
    element (e4m3 keeps 3 mantissa bits), or 2^-10 x scale below e4m3's normal range."""
    # two passes (a reduction, then a division into float32 cast to e4m3): with a clamp and float32
    # copies in between, 67,584 rows of 2,816 took 2.0 ms eager on an H200. No clamp needed: the
    # largest |value| / scale is 448 within float32 rounding, far under 464, where e4m3 turns NaN
    scale = _scale(torch.linalg.vector_norm(weight, ord=float("inf"), dim=-1))
    return Fp8Weight((weight / scale[..., None]).to(torch.float8_e4m3fn), scale)


def dequantize(quantized: Fp8Weight) -> torch.Tensor:
    """The float32 values ``quantized`` stands for."""
    return quantized.weight.float() * quantized.scale[..., None]


def grouped_mm_fp8(rows: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                   offsets: torch.Tensor) -> torch.Tensor:
    """rows (S, K) @ weight (E, N, K)^T per expert group (``offsets`` (E,) int32: each group's
    end), weight in e4m3 with scales (E, N); rows quantized per row here. (S, N) in rows' dtype,
    rounded through bf16 (the kernel's output). CUDA: ``torch._scaled_grouped_mm``, which wants
    the rows row-major, the weight column-major (our (E, N, K) storage, transposed), K and N
    multiples of 16, a (S,) and an (E, N) float32 scale; elsewhere ``_grouped_mm_emulated``."""
    row_q, row_scale = quantize_rows(rows)
    if rows.device.type != "cuda":
        return _grouped_mm_emulated(row_q, row_scale, weight, weight_scale, offsets).to(rows.dtype)
    out = torch._scaled_grouped_mm(row_q, weight.transpose(-2, -1), row_scale, weight_scale,
                                   offs=offsets, out_dtype=torch.bfloat16, use_fast_accum=FAST_ACCUM)
    return out.to(rows.dtype)


def _grouped_mm_emulated(row_q: torch.Tensor, row_scale: torch.Tensor, weight: torch.Tensor,
                         weight_scale: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The kernel's arithmetic: e4m3 products summed in float32, scaled after the sum, rounded
    to bf16. Each row takes its expert's weight (memory S x N x K floats: tests and checks)."""
    expert = torch.searchsorted(offsets, torch.arange(row_q.shape[0], device=row_q.device),
                                right=True).clamp(max=weight.shape[0] - 1)
    sums = torch.bmm(weight.index_select(0, expert).float(), row_q.float()[:, :, None])[:, :, 0]
    return (sums * row_scale[:, None] * weight_scale.index_select(0, expert)).to(torch.bfloat16)


def _grouped(rows: torch.Tensor, weight: Fp8Weight, offsets: torch.Tensor) -> torch.Tensor:
    return grouped_mm_fp8(rows, weight.weight, weight.scale, offsets)


def experts_forward_fp8(experts: Any, layer: Fp8Layer, hidden: torch.Tensor, top_k_index: torch.Tensor,
                        top_k_weights: torch.Tensor, ops: RowOps = TORCH_OPS) -> torch.Tensor:
    """``moe.experts_forward`` with ``layer``'s FP8 expert copies: (T, H) from hidden (T, H)."""
    return experts_forward(experts, hidden, top_k_index, top_k_weights, ops,  # type: ignore[no-any-return]
                           weights=(layer.gate_up, layer.down), matmul=_grouped)


class Fp8Model:
    """FP8 copies of every layer's experts of a tied DiffusionGemma (``layers[i]`` serves encoder
    and decoder layer i), built once; the model is only read."""

    def __init__(self, model: Any) -> None:
        layers = []
        with torch.no_grad():
            for enc, dec in zip(model.model.encoder.language_model.layers, model.model.decoder.layers,
                                strict=True):
                untied = _untied(enc, dec)
                if untied:
                    raise ValueError(f"FP8 copies serve both streams: {untied} of layer "
                                     f"{enc.layer_idx} must be tied between encoder and decoder")
                layers.append(Fp8Layer(quantize_rows(enc.experts.gate_up_proj),
                                       quantize_rows(enc.experts.down_proj)))
        self.layers = tuple(layers)

    def nbytes(self) -> int:
        """Bytes the copies hold (weights and scales)."""
        return sum(t.numel() * t.element_size() for layer in self.layers for copy in layer for t in copy)


def _untied(enc: Any, dec: Any) -> str:
    """The first expert weight of ``enc`` that ``dec`` does not share ("" when all are)."""
    for name in ("gate_up_proj", "down_proj"):
        if getattr(enc.experts, name).data_ptr() != getattr(dec.experts, name).data_ptr():
            return f"experts.{name}"
    return ""


@functools.cache
def fp8_problem(device: torch.device) -> str:
    """Why the FP8 product cannot serve on ``device`` ("" when it can): not CUDA, compute
    capability under 9.0 (``_scaled_grouped_mm`` is Hopper's), torch lacking it, or it failing or
    disagreeing with its emulation on random inputs by more than ``CHECK_RTOL`` of the largest
    output. Checked once per device; the log says why when refused."""
    if device.type != "cuda":
        problem = f"FP8 kernels need CUDA, not {device.type}"
    elif torch.cuda.get_device_capability(device) < (9, 0):
        capability = torch.cuda.get_device_capability(device)
        problem = f"FP8 grouped GEMMs need compute capability 9.0, not {capability}"
    elif not hasattr(torch, "_scaled_grouped_mm"):
        problem = f"torch {torch.__version__} lacks _scaled_grouped_mm"
    else:
        try:
            problem = _disagreement(device)
        # a layout or shape the kernels refuse, a launch failure: the bf16 read serves, the log says why
        except Exception as exc:  # noqa: BLE001
            problem = f"{type(exc).__name__}: {exc}"
    if problem:
        log.warning("torch read: FP8 not used: %s", problem)
    return problem


def _disagreement(device: torch.device) -> str:
    """"" when the CUDA product agrees with its emulation, else by how much. Group sizes are
    uneven, one group empty, as routing makes them."""
    errors = kernel_errors(device)
    bad = [f"{name} differs from its emulation by {error:.3g} of its largest output"
           for name, error in errors.items() if not error <= CHECK_RTOL]
    return "; ".join(bad)


def kernel_errors(device: torch.device, rows: int = 64, n: int = 128, k: int = 8192) -> dict[str, float]:
    """Largest |CUDA - emulation| of the grouped product over its largest |emulation| on random
    inputs (k: a long sum, where fast accumulation errs most)."""
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn((rows, k), generator=gen, device=device, dtype=torch.bfloat16)
    weights = quantize_rows(torch.randn((5, n, k), generator=gen, device=device, dtype=torch.bfloat16))
    offsets = torch.tensor([5, 5, 30, 41, rows], dtype=torch.int32, device=device)
    row_q, row_scale = quantize_rows(x)
    pairs = {"_scaled_grouped_mm": (grouped_mm_fp8(x, weights.weight, weights.scale, offsets),
                                    _grouped_mm_emulated(row_q, row_scale, *weights, offsets))}
    return {name: float((got.float() - want.float()).abs().max() / want.float().abs().max())
            for name, (got, want) in pairs.items()}


def _time_ms(fn: Any, repeats: int = 20) -> float:
    for _ in range(3):
        fn()
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return float(start.elapsed_time(end)) / repeats


def self_check(tokens: tuple[int, ...] = (264, 8448), experts: int = 128, top_k: int = 8,
               hidden: int = 2816, inner: int = 704) -> None:
    """One device call's report: the problem string, the kernels' errors against their emulation,
    then per token count one layer's experts (random weights and routing, the released sizes),
    bf16 vs FP8, eager and compiled, with FP8's error relative to bf16."""
    device = torch.device("cuda")
    print(f"fp8_problem: {fp8_problem(device)!r}")
    print(f"kernel vs emulation (max |diff| / max |out|): {kernel_errors(device)}")
    gen = torch.Generator(device=device).manual_seed(1)
    module = SimpleNamespace(
        num_experts=experts, act_fn=torch.nn.GELU(approximate="tanh"),
        gate_up_proj=torch.randn((experts, 2 * inner, hidden), generator=gen, device=device) * 0.02,
        down_proj=torch.randn((experts, hidden, inner), generator=gen, device=device) * 0.02)
    module.gate_up_proj, module.down_proj = module.gate_up_proj.bfloat16(), module.down_proj.bfloat16()
    layer = Fp8Layer(quantize_rows(module.gate_up_proj), quantize_rows(module.down_proj))
    ops = row_ops(not triton_problem(device))
    forms = {"bf16": functools.partial(experts_forward, module, ops=ops),
             "fp8": functools.partial(experts_forward_fp8, module, layer, ops=ops)}
    compiled = {name: torch.compile(fn, dynamic=True) for name, fn in forms.items()}
    modes: dict[str, dict[str, Any]] = {"eager": forms, "compiled": compiled}
    for count in tokens:
        rows = torch.randn((count, hidden), generator=gen, device=device, dtype=torch.bfloat16)
        index = torch.rand((count, experts), generator=gen, device=device).topk(top_k).indices
        weights = torch.softmax(torch.randn((count, top_k), generator=gen, device=device), dim=-1)
        for mode, fns in modes.items():
            want, got = (fns[name](rows, index, weights).float() for name in ("bf16", "fp8"))
            times = {name: _time_ms(functools.partial(fn, rows, index, weights)) for name, fn in fns.items()}
            print(f"T={count} experts {mode}: bf16 {times['bf16']:.3f} ms, fp8 {times['fp8']:.3f} ms, "
                  f"fp8 vs bf16 relative error (Frobenius) {float((got - want).norm() / want.norm()):.4f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="the device self-check (CUDA)")
    if parser.parse_args(argv).check:
        self_check()


if __name__ == "__main__":
    main()
