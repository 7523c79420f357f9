"""The read's attention parts alone at the real shapes, each kernel against the float32 reference:
which kernel the sliding layers' prefix read (head dim 256, 8 key heads, 1,024 key slots) and the
rows' own-key reads should use at one read and at a batch of 32. Kernels: cuDNN and PyTorch's
memory-efficient attention under the dense bias the reader builds today, FlexAttention (compiled)
under a block mask built from the same visibility, and two bounds that ignore the mask (cuDNN and
flash attention with no bias): how much the dense bias costs. A "split" row reads the prefix as
the slots every query sees (no bias) plus the band's slots (with bias), merged by log-sum-exp.
"flash_*" rows read with no mask tensor at all: FlashAttention-2's
own window, causal and per-sequence key counts (varlen ``seqused_k``) express the same
visibility; "cudnn_gqa_causal" is cuDNN with causal masking and the key heads unfolded.
"stair_*" rows (``prefix_forms.stair_prefix``): a full window read as
the slots every query sees (no mask, or a bias broadcast over the queries hiding the empty slot),
the staircase of the prompt rests by cuDNN's causal kernel with queries and keys reversed, and
the canvases' share of it under a small bias; "stair_part_*" rows time the parts alone (their
outputs are not the answer). "bound_cudnn_key_bias": every slot but the empty one, under a bias
broadcast over the queries (what such a bias costs against none).
CUDA only; every row is one CUDA-graph replay timed by events.

    python -m bench.attention_kernels --out $OUT/attention_kernels.json
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path
from typing import Any

from bench.common import print_table
from bench.prefix_forms import (
    DIM,
    GROUPS,
    HEADS,
    KV_HEADS,
    SLOTS,
    flash,
    flash_prefix,
    flex_compiles,
    flex_prefix,
    no_bias_cudnn,
    no_bias_flash,
    out_and_lse,
    prefix_problem,
    split_kv_rows,
    stair_prefix,
)


def replay_ms(fn: Any, iters: int) -> tuple[float, Any]:
    """Median ms of ``fn`` as a captured CUDA graph (events), and its output."""
    import torch

    from bench.gpu_variants import event_ms

    out = fn()
    torch.cuda.synchronize()
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn()
        return event_ms(graph.replay, iters), out
    except RuntimeError as exc:
        print(f"capture failed ({str(exc)[:120]}), timing eagerly", file=sys.stderr)
        return event_ms(fn, iters), out


def reference(problem: dict[str, Any]) -> tuple[Any, Any]:
    import torch

    from router.backends.torch.kernels.attention import attend_math, to_bias

    bias = to_bias(problem["visible"][None], GROUPS, torch.float32)
    return attend_math(problem["q"].float(), problem["k"].float(), problem["v"].float(), bias)


def compare(got: tuple[Any, Any], ref: tuple[Any, Any]) -> dict[str, float]:
    out, lse = got
    err = float((out.float() - ref[0]).norm() / ref[0].norm())
    lse_err = float((lse.float().reshape(ref[1].shape) - ref[1]).abs().max()) if lse is not None else -1.0
    return {"rel_err": round(err, 5), "lse_err": round(lse_err, 5)}


def prefix_rows(items: int, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from router.backends.torch.kernels.attention import (
        attend_causal_cudnn,
        attend_cudnn,
        attend_efficient,
        merge,
        to_bias,
    )

    problem = prefix_problem(items, args.width, args.canvas, args.prefix_tokens)
    q, k, v = problem["q"], problem["k"], problem["v"]
    n_keys, flops = SLOTS, 4 * HEADS * problem["n_queries"] * SLOTS * DIM
    bias = to_bias(problem["visible"][None], GROUPS, torch.bfloat16)
    ref = reference(problem)
    band_slots = args.width  # slots [0, width) are where the band's edge falls; the rest all see
    full_bias, part_bias = bias[..., band_slots:], bias[..., :band_slots]

    def split() -> tuple[Any, Any]:
        out_a, lse_a = attend_cudnn(q, k[:, :, :band_slots], v[:, :, :band_slots], part_bias)
        out_b, lse_b = no_bias_cudnn(q, k[:, :, band_slots:], v[:, :, band_slots:])
        lse = torch.logaddexp(lse_a, lse_b)
        return merge(out_a, lse_a, out_b, lse_b), lse

    kernels: dict[str, Any] = {
        "cudnn_bias": lambda: attend_cudnn(q, k, v, bias),
        "efficient_bias": lambda: attend_efficient(q, k, v, bias),
        "split_cudnn": split,
        "bound_cudnn_no_bias": lambda: no_bias_cudnn(q, k, v),
        "bound_flash_no_bias": lambda: no_bias_flash(q, k, v),
    }
    del full_bias
    for splits in args.splits:
        kernels.update(split_kv_rows(q, k, v, bias, splits))
    # what a bias broadcast over the queries costs (the empty slot hidden; a bound: the band is not)
    key_row = torch.zeros((1, 1, 1, n_keys), dtype=q.dtype, device=q.device)
    key_row[..., problem["filled"]:] = -1.0e30
    kernels["bound_cudnn_key_bias"] = lambda: attend_cudnn(q, k, v, key_row.expand(1, 1, q.shape[2], -1))
    try:  # the staircase form (a candidate: the reader does not use it)
        kernels.update(stair_prefix(problem, items, args.width, causal=attend_causal_cudnn,
                                    plain=lambda q, k, v: attend_cudnn(q, k, v, None),
                                    biased=attend_cudnn))
    except ValueError as exc:  # not a full window
        row_notes = {"stair": str(exc)}
    else:
        row_notes = {}
    kernels["flash_varlen_band"] = partial(flash_prefix, problem, items, args.width, args.canvas)
    row: dict[str, Any] = {"queries": problem["n_queries"], "keys": n_keys, **row_notes}
    for name, fn in flex_compiles(problem).items():
        kernels[name] = fn
    for name, inside in (("flex_block_mask", False), ("flex_mask_built_in_call", True)):
        if not wanted(name, args):
            continue
        try:
            kernels[name] = flex_prefix(problem, inside)[0]
        except Exception as exc:  # noqa: BLE001 (reported)
            row[name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    for name, fn in kernels.items():
        if not wanted(name, args):
            continue
        try:
            ms, got = replay_ms(fn, args.iters)
            row[name] = {"ms": round(ms, 4), "tflops": round(flops / ms / 1e9, 1), **compare(got, ref)}
        except Exception as exc:  # noqa: BLE001 (a kernel refusing these shapes is reported)
            row[name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    return row


def own_rows(items: int, args: argparse.Namespace) -> dict[str, Any]:
    """The rows' own-key reads: prompt rests causally over themselves (real tokens only), canvases
    over their prompt rest's real tokens and the whole canvas; cuDNN under the dense bias (today)
    against FlexAttention under block masks (batch = items)."""
    import torch
    from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

    from router.backends.torch.kernels.attention import attend_cudnn, attend_math, to_bias

    gen = torch.Generator(device="cuda").manual_seed(1)
    width, canvas = args.width, args.canvas
    lengths = torch.randint(width // 2, width + 1, (items,), generator=gen, device="cuda")
    steps = torch.arange(width, device="cuda")
    enc_vis = (steps[None, :, None] >= steps[None, None, :]) & (steps[None, None, :] < lengths[:, None, None])
    dec_rest = (steps[None, :] < lengths[:, None])
    dec_vis = torch.cat([dec_rest, torch.ones((items, canvas), dtype=torch.bool, device="cuda")], 1)
    dec_vis = dec_vis[:, None, :].expand(-1, canvas, -1)
    attend: Any = torch.compile(flex_attention, dynamic=False)
    attend_dynamic: Any = torch.compile(flex_attention, dynamic=True)
    out: dict[str, Any] = {}
    for part, n_q, n_k, vis in (("enc_own", width, width, enc_vis), ("dec_own", canvas, width + canvas, dec_vis)):
        q = (torch.randn((items, KV_HEADS, GROUPS * n_q, DIM), generator=gen, device="cuda") / DIM ** 0.5).bfloat16()
        k, v = (torch.randn((items, KV_HEADS, n_k, DIM), generator=gen, device="cuda").bfloat16() for _ in range(2))
        ref = attend_math(q.float(), k.float(), v.float(), to_bias(vis, GROUPS, torch.float32))
        bias = to_bias(vis, GROUPS, torch.bfloat16)
        flops = 4 * HEADS * items * n_q * n_k * DIM
        row: dict[str, Any] = {"queries": items * n_q, "keys": n_k}

        def mask_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any, vis: Any = vis, n_q: int = n_q) -> Any:
            return vis[b, q_idx % n_q, kv_idx]

        try:
            if not wanted("flex", args):
                raise LookupError("flex rows not asked for (--kernels)")
            block = create_block_mask(mask_mod, items, None, GROUPS * n_q, n_k, device="cuda", _compile=True)
            kernels = {"cudnn_bias": lambda q=q, k=k, v=v, bias=bias: attend_cudnn(q, k, v, bias),
                       "flex_block_mask": lambda q=q, k=k, v=v, block=block: out_and_lse(attend(
                           q, k, v, block_mask=block, scale=1.0, return_aux=AuxRequest(lse=True))),
                       "flex_dynamic": lambda q=q, k=k, v=v, block=block: out_and_lse(attend_dynamic(
                           q, k, v, block_mask=block, scale=1.0, return_aux=AuxRequest(lse=True)))}
        except Exception as exc:  # noqa: BLE001 (reported)
            if not isinstance(exc, LookupError):
                row["flex_block_mask"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            kernels = {"cudnn_bias": lambda q=q, k=k, v=v, bias=bias: attend_cudnn(q, k, v, bias)}
        refs = dict.fromkeys(kernels, ref)
        for name, (fn, own_ref) in mask_free_own(part, q, k, v, lengths, vis, width, canvas).items():
            kernels[name], refs[name] = fn, own_ref
        for name, fn in kernels.items():
            if not wanted(name, args):
                continue
            try:
                ms, got = replay_ms(fn, args.iters)
                row[name] = {"ms": round(ms, 4), "tflops": round(flops / ms / 1e9, 1),
                             **compare(got, refs[name])}
            except Exception as exc:  # noqa: BLE001 (reported)
                row[name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        out[part] = row
    return out


def mask_free_own(part: str, q: Any, k: Any, v: Any, lengths: Any, vis: Any, width: int,
                  canvas: int) -> dict[str, tuple[Any, Any]]:
    """Own-key reads with no mask tensor, each with the reference it must match (folded layout).
    Prompt rests: causal alone (exact for the real queries while the width is under the window;
    the padding queries then also see padding keys, which nothing reads, so their reference is
    the causal one), by FlashAttention-2 and by cuDNN with grouped-query heads unfolded. Canvases:
    each row's keys laid canvas first, so what it sees is a leading run of C + its length
    (FlashAttention-2 varlen, ``seqused_k``)."""
    import torch

    from router.backends.torch.kernels.attention import attend_math, to_bias

    items, n_q, n_k = q.shape[0], q.shape[2] // GROUPS, k.shape[2]
    i32, dev = torch.int32, q.device
    q_rows = q.view(items, HEADS, n_q, DIM).transpose(1, 2)  # (B, M, H, D) view
    k_rows, v_rows = (x.transpose(1, 2) for x in (k, v))  # (B, N, H_kv, D)

    def folded(out: Any, lse: Any) -> tuple[Any, Any]:
        return (out.transpose(1, 2).reshape(items, KV_HEADS, GROUPS * n_q, DIM),
                lse.reshape(items, KV_HEADS, GROUPS * n_q))

    if part == "enc_own":
        steps = torch.arange(n_q, device=dev)
        causal = (steps[:, None] >= steps[None, :])[None].expand(items, -1, -1)
        ref = attend_math(q.float(), k.float(), v.float(), to_bias(causal, GROUPS, torch.float32))

        def flash_causal() -> tuple[Any, Any]:
            return folded(*flash(q_rows, k_rows, v_rows, None, None, n_q, n_k, causal=True))

        def cudnn_causal() -> tuple[Any, Any]:
            out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(
                q.view(items, HEADS, n_q, DIM), k, v, None, True, 0.0, True, False, scale=1.0)[:2]
            return out.reshape(items, KV_HEADS, GROUPS * n_q, DIM), lse.reshape(items, KV_HEADS, -1)

        return {"flash_causal": (flash_causal, ref), "cudnn_gqa_causal": (cudnn_causal, ref)}
    # canvases: keys [canvas | prompt rest] per row (the rows_kv copy would lay them so)
    k_first, v_first = (torch.cat([x[:, :, width:], x[:, :, :width]], 2).transpose(1, 2).reshape(-1, KV_HEADS, DIM)
                        for x in (k, v))
    ref = attend_math(q.float(), k.float(), v.float(), to_bias(vis, GROUPS, torch.float32))
    cum_q = torch.arange(0, items * canvas + 1, canvas, device=dev, dtype=i32)
    cum_k = torch.arange(0, items * n_k + 1, n_k, device=dev, dtype=i32)
    used = (canvas + lengths).to(i32)
    q_packed = q_rows.reshape(items * n_q, HEADS, DIM)

    def flash_canvas_first() -> tuple[Any, Any]:
        out, lse = flash(q_packed, k_first, v_first, cum_q, cum_k, n_q, n_k, used_k=used)
        return folded(out.view(items, n_q, HEADS, DIM), lse.reshape(HEADS, items, n_q).transpose(0, 1))

    return {"flash_varlen_canvas_first": (flash_canvas_first, ref)}


def projection_rows(items: int, args: argparse.Namespace) -> dict[str, Any]:
    """One sliding layer's attention projections (q 4,096, k 2,048, v 2,048 outputs; o back to
    2,816) as the read runs them today (each stream apart: its prompt rests, then its canvases)
    against both streams' rows in one product each, and against q/k/v as one product."""
    import torch

    hidden = 2816
    gen = torch.Generator(device="cuda").manual_seed(2)
    w = {name: (torch.randn((n, hidden), generator=gen, device="cuda") * hidden ** -0.5).bfloat16()
         for name, n in (("q", 4096), ("k", 2048), ("v", 2048))}
    w_o = (torch.randn((hidden, 4096), generator=gen, device="cuda") * 4096 ** -0.5).bfloat16()
    w_qkv = torch.cat([w["q"], w["k"], w["v"]])
    n_enc, n_dec = items * args.width, items * args.canvas
    x = torch.randn((n_enc + n_dec, hidden), generator=gen, device="cuda").bfloat16()
    a = torch.randn((n_enc + n_dec, 4096), generator=gen, device="cuda").bfloat16()
    lin = torch.nn.functional.linear

    def apart() -> Any:
        for part, att in ((x[:n_enc], a[:n_enc]), (x[n_enc:], a[n_enc:])):
            outs = [lin(part, w[n]) for n in "qkv"]
            outs.append(lin(att, w_o))
        return outs

    def joint() -> Any:
        return [lin(x, w[n]) for n in "qkv"] + [lin(a, w_o)]

    def joint_merged() -> Any:
        return [lin(x, w_qkv), lin(a, w_o)]

    flops = 2 * (n_enc + n_dec) * hidden * (8192 + 4096)
    row: dict[str, Any] = {"rows": n_enc + n_dec}
    for name, fn in (("streams_apart", apart), ("streams_joint", joint), ("joint_qkv_merged", joint_merged)):
        ms, _ = replay_ms(fn, args.iters)
        row[name] = {"ms": round(ms, 4), "tflops": round(flops / ms / 1e9, 1)}
    return row


def wanted(name: str, args: argparse.Namespace) -> bool:
    """Whether ``--kernels`` (name prefixes; none: all) asks for the kernel ``name``."""
    return not args.kernels or name.startswith(tuple(args.kernels))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--width", type=int, default=224)
    parser.add_argument("--canvas", type=int, default=64)
    parser.add_argument("--prefix-tokens", type=int, default=1404)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--out", default="")
    parser.add_argument("--kernels", nargs="*", default=[],
                        help="only the kernels whose names start so (e.g. cudnn flash); default all")
    parser.add_argument("--no-projections", action="store_true")
    parser.add_argument("--splits", type=int, nargs="*", default=[2, 4, 8],
                        help="key-chunk counts for the split-KV rows of the prefix read")
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        sys.exit("bench.attention_kernels needs CUDA")
    # Every static flex row compiles flex_attention anew per shape: past dynamo's default limit
    # of 8 a compile falls back to eager flex (which materializes the scores: ~10 ms rows, the
    # defect of this bench's second run, 2026-12-03), so the limit is raised for the whole run.
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 256)
    results: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                               "sliding_prefix": {}, "own": {}}
    table = []
    for items in args.items:
        parts = {"prefix": prefix_rows(items, args), **own_rows(items, args)}
        results["sliding_prefix"][str(items)] = parts.pop("prefix")
        results["own"][str(items)] = parts
        if not args.no_projections:
            parts["projections"] = results.setdefault("projections", {})[str(items)] = projection_rows(items, args)
        for part, row in (("prefix", results["sliding_prefix"][str(items)]), *parts.items()):
            for name, got in row.items():
                if isinstance(got, dict):
                    table.append([items, part, name, got.get("ms", "-"), got.get("tflops", "-"),
                                  got.get("rel_err", got.get("error", "")), got.get("lse_err", "")])
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=2))
    print_table("attention parts at the read's shapes", ["items", "part", "kernel", "ms", "TFLOP/s", "rel err (or error)", "lse err"], table)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
