"""The read's attention parts alone at the real shapes, each kernel against the float32 reference:
which kernel the sliding layers' prefix read (head dim 256, 8 key heads, 1,024 key slots) and the
rows' own-key reads should use at one read and at a batch of 32. Kernels: cuDNN and PyTorch's
memory-efficient attention under the dense bias the reader builds today, FlexAttention (compiled)
under a block mask built from the same visibility, and two bounds that ignore the mask (cuDNN and
flash attention with no bias): how much the dense bias costs. A "split" row reads the prefix as
the slots every query sees (no bias) plus the band's slots (with bias), merged by log-sum-exp.
"flash_*" rows (issue 21, fourth session) read with no mask tensor at all: FlashAttention-2's
own window, causal and per-sequence key counts (varlen ``seqused_k``) express the same
visibility; "cudnn_gqa_causal" is cuDNN with causal masking and the key heads unfolded.
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

# DiffusionGemma-26B-A4B's sliding layers (../shared/models/...config.json)
HEADS, KV_HEADS, DIM, WINDOW = 16, 8, 256, 1024
GROUPS = HEADS // KV_HEADS
SLOTS = 1024  # the static prefix buffer's sliding slots (window - 1 filled, aligned to 16)


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


def prefix_problem(items: int, width: int, canvas: int, prefix_tokens: int, seed: int = 0) -> dict[str, Any]:
    """Folded queries of a batch (all items' prompt rests, then their canvases) against the
    sliding prefix slots, with each query's lowest visible slot (what fused.OnePass.masks gives)."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    n_queries = items * (width + canvas)
    q = torch.randn((1, KV_HEADS, GROUPS * n_queries, DIM), generator=gen, device="cuda") / DIM ** 0.5
    k, v = (torch.randn((1, KV_HEADS, SLOTS, DIM), generator=gen, device="cuda") for _ in range(2))
    filled = min(SLOTS, WINDOW - 1, prefix_tokens)
    key_pos = torch.full((SLOTS,), 1 << 40, device="cuda")
    key_pos[:filled] = torch.arange(prefix_tokens - filled, prefix_tokens, device="cuda")
    lengths = torch.randint(width // 2, width + 1, (items,), generator=gen, device="cuda")
    steps = torch.arange(width, device="cuda")
    enc_low = (prefix_tokens + steps).repeat(items) - (WINDOW - 1)
    row_low = (prefix_tokens + lengths - (WINDOW - 1))[:, None].expand(-1, canvas).reshape(-1)
    low = torch.cat([enc_low, row_low])  # (n_queries,)
    visible = (key_pos[None, :] < prefix_tokens) & (key_pos[None, :] >= low[:, None])
    return {"q": q.bfloat16(), "k": k.bfloat16(), "v": v.bfloat16(), "visible": visible,
            "low": low, "key_pos": key_pos, "n_queries": n_queries, "prefix_tokens": prefix_tokens,
            "lengths": lengths, "filled": filled}


def flash(q: Any, k: Any, v: Any, cum_q: Any, cum_k: Any, max_q: int, max_k: int, *,
          causal: bool = False, left: int | None = None, right: int | None = None,
          used_k: Any = None) -> tuple[Any, Any]:
    """PyTorch's FlashAttention-2 (varlen when ``cum_q`` is given): q (total_q, H, D), k/v
    (total_k, H_kv, D), grouped-query heads native; its window is bottom-right aligned (query i
    of a sequence sees keys i + Lk - Lq - left ..= i + Lk - Lq + right), ``used_k`` the keys each
    sequence reads from its ``cum_k`` start (so sequences may share keys). Returns (out, lse)."""
    import torch

    out, lse = torch.ops.aten._flash_attention_forward(
        q, k, v, cum_q, cum_k, max_q, max_k, 0.0, causal, False, scale=1.0,
        window_size_left=left, window_size_right=right, seqused_k=used_k)[:2]
    return out, lse


def flash_prefix(problem: dict[str, Any], items: int, width: int, canvas: int) -> tuple[Any, Any]:
    """The prefix read with no mask at all, by FlashAttention-2 varlen: each item's prompt-rest
    queries are a sequence over all filled slots under a window of ``WINDOW - 1 - width`` keys to
    the left (the sliding band, bottom-right aligned), and each canvas row a sequence over the
    filled slots from its own lowest visible one (``seqused_k``: every sequence starts in the same
    shared keys). Returned in the folded layout of the other rows."""
    import torch

    q, k, v, filled = problem["q"], problem["k"], problem["v"], problem["filled"]
    n, dev = problem["n_queries"], q.device
    q_rows = q[0].view(HEADS, n, DIM).permute(1, 0, 2)  # (n, H, D): head j*G+g, a view
    k_rows, v_rows = (x[0].permute(1, 0, 2) for x in (k, v))  # (slots, H_kv, D)
    i32 = torch.int32
    n_enc = items * width
    cum_q = torch.arange(0, n_enc + 1, width, device=dev, dtype=i32)
    starts = torch.zeros(items + 1, device=dev, dtype=i32)
    used = torch.full((items,), filled, device=dev, dtype=i32)
    out_e, lse_e = flash(q_rows[:n_enc], k_rows, v_rows, cum_q, starts, width, SLOTS,
                         left=WINDOW - 1 - width, right=width, used_k=used)
    low = (filled + problem["lengths"] - (WINDOW - 1)).clamp(min=0).to(i32)
    cum_c = torch.arange(0, items * canvas + 1, canvas, device=dev, dtype=i32)
    starts_c = torch.cat([low, low[-1:]])
    out_c, lse_c = flash(q_rows[n_enc:], k_rows, v_rows, cum_c, starts_c, canvas, SLOTS,
                         used_k=filled - low)
    out = torch.cat([out_e, out_c]).permute(1, 0, 2).reshape(1, KV_HEADS, GROUPS * n, DIM)
    lse = torch.cat([lse_e.reshape(HEADS, -1), lse_c.reshape(HEADS, -1)], 1)
    return out, lse.reshape(1, KV_HEADS, GROUPS * n)


def flex_prefix(problem: dict[str, Any], build_inside: bool = False) -> tuple[Any, Any]:
    """FlexAttention over the prefix under a block mask of the same band (queries folded: query
    row r of the folded axis is query r % n_queries of the batch); ``build_inside``: the block
    mask is built in the timed (captured) call, as a read would build it from its lengths."""
    import torch
    from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

    low, key_pos, n = problem["low"], problem["key_pos"], problem["n_queries"]
    high = problem["prefix_tokens"]

    def mask_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        pos = key_pos[kv_idx]
        return (pos < high) & (pos >= low[q_idx % n])

    q, k, v = problem["q"], problem["k"], problem["v"]
    def build() -> Any:
        return create_block_mask(mask_mod, None, None, q.shape[2], k.shape[2], device="cuda",
                                 _compile=True)

    block = build()
    attend: Any = torch.compile(flex_attention, dynamic=False)

    def run() -> tuple[Any, Any]:
        out, aux = attend(q, k, v, block_mask=build() if build_inside else block, scale=1.0,
                          return_aux=AuxRequest(lse=True))
        return out, aux.lse

    return run, block


def flex_compiles(problem: dict[str, Any]) -> dict[str, Any]:
    """The read's own flex path (prefix_attention.flex_mask) compiled three ways: static shapes
    (one kernel per shape), dynamic shapes (one kernel for all), and dynamic with the queries
    padded to a multiple of 128 and the kernel told so (IS_DIVISIBLE: no bounds checks, which a
    dynamic length otherwise forces). Outputs are cut back to the real queries."""
    import torch
    from torch.nn.attention.flex_attention import AuxRequest, flex_attention

    from router.backends.torch.prefix_attention import flex_mask

    q, k, v, visible = problem["q"], problem["k"], problem["v"], problem["visible"][None]
    n = problem["n_queries"]
    step = 128 // GROUPS
    padded_n = -(-n // step) * step
    q_pad = torch.zeros((1, KV_HEADS, GROUPS, padded_n, DIM), dtype=q.dtype, device=q.device)
    q_pad[:, :, :, :n] = q.view(1, KV_HEADS, GROUPS, n, DIM)
    q_pad = q_pad.view(1, KV_HEADS, GROUPS * padded_n, DIM)
    vis_pad = torch.zeros((1, padded_n, visible.shape[2]), dtype=torch.bool, device=q.device)
    vis_pad[:, :n] = visible
    mask, mask_pad = flex_mask(visible, GROUPS), flex_mask(vis_pad, GROUPS)
    aux = AuxRequest(lse=True)
    static: Any = torch.compile(flex_attention, dynamic=False)
    dynamic: Any = torch.compile(flex_attention, dynamic=True)
    divisible = {"IS_DIVISIBLE": True}

    def cut(result: tuple[Any, Any]) -> tuple[Any, Any]:
        out, got = result
        out = out.view(1, KV_HEADS, GROUPS, padded_n, DIM)[:, :, :, :n].reshape(1, KV_HEADS, GROUPS * n, DIM)
        lse = got.lse.view(1, KV_HEADS, GROUPS, padded_n)[..., :n].reshape(1, KV_HEADS, GROUPS * n)
        return out, lse

    return {
        "flex_mask_static": lambda: _lse(static(q, k, v, block_mask=mask, scale=1.0, return_aux=aux)),
        "flex_mask_dynamic": lambda: _lse(dynamic(q, k, v, block_mask=mask, scale=1.0, return_aux=aux)),
        "flex_mask_dynamic_padded": lambda: cut(dynamic(q_pad, k, v, block_mask=mask_pad, scale=1.0,
                                                        return_aux=aux)),
        "flex_mask_dynamic_padded_divisible": lambda: cut(dynamic(
            q_pad, k, v, block_mask=mask_pad, scale=1.0, return_aux=aux, kernel_options=divisible)),
    }


def reference(problem: dict[str, Any]) -> tuple[Any, Any]:
    import torch

    from router.backends.torch.prefix_attention import attend_math, to_bias

    bias = to_bias(problem["visible"][None], GROUPS, torch.float32)
    return attend_math(problem["q"].float(), problem["k"].float(), problem["v"].float(), bias)


def compare(got: tuple[Any, Any], ref: tuple[Any, Any]) -> dict[str, float]:
    out, lse = got
    err = float((out.float() - ref[0]).norm() / ref[0].norm())
    lse_err = float((lse.float().reshape(ref[1].shape) - ref[1]).abs().max()) if lse is not None else -1.0
    return {"rel_err": round(err, 5), "lse_err": round(lse_err, 5)}


def prefix_rows(items: int, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from router.backends.torch.prefix_attention import (
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
    kernels["flash_varlen_band"] = partial(flash_prefix, problem, items, args.width, args.canvas)
    row: dict[str, Any] = {"queries": problem["n_queries"], "keys": n_keys}
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


def chunk_merge(out: Any, lse: Any) -> tuple[Any, Any]:
    """Key chunks' (S, Hk, M, D) outputs and (S, Hk, M) log-sum-exps merged into one part over
    all the keys, (1, Hk, M, D) and (1, Hk, M), in torch ops."""
    import torch

    top = lse.amax(0, keepdim=True)
    weight = torch.exp(lse - top)
    total = weight.sum(0, keepdim=True)
    merged = (out.float() * weight[..., None]).sum(0, keepdim=True) / total[..., None]
    return merged.to(out.dtype), top + torch.log(total)


def split_kv_rows(q: Any, k: Any, v: Any, bias: Any, splits: int) -> dict[str, Any]:
    """The prefix read with its key slots cut into ``splits`` chunks that run as the batch of one
    cuDNN call (split-KV: ``splits`` times the thread blocks, each a ``splits``-th of the keys),
    merged by log-sum-exp. Why: one read's prefix read is 72 thread blocks on 132 SMs, each
    looping over all 1,024 slots. "views": the query expanded (batch stride 0) and the keys and
    the bias as strided views of the unsplit ones; "copies": every input laid chunk-major
    beforehand (the prefix is static and the bias built once a batch); "nomerge": copies, the
    attention alone (its output is not the answer)."""
    import torch

    n_slots = k.shape[2]
    chunk = n_slots // splits

    def chunked(x: Any) -> Any:  # (1, H, N, D) -> (S, H, N/S, D), a view
        return x[0].unflatten(1, (splits, chunk)).transpose(0, 1)

    k_view, v_view = chunked(k), chunked(v)
    bias_view = bias[0].unflatten(-1, (splits, chunk)).permute(2, 0, 1, 3)  # (S, 1, GM, N/S)
    q_view = q.expand(splits, -1, -1, -1)
    q_copy, k_copy, v_copy = (x.contiguous() for x in (q_view, k_view, v_view))
    bias_store = torch.zeros((splits, 1, bias.shape[2], -(-chunk // 16) * 16), dtype=bias.dtype,
                             device=bias.device)
    bias_copy = bias_store[..., :chunk]
    bias_copy.copy_(bias_view)

    def run(qs: Any, ks: Any, vs: Any, b: Any, merged: bool = True) -> tuple[Any, Any]:
        out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(
            qs, ks, vs, b.expand(splits, qs.shape[1], -1, -1), True, 0.0, False, False, scale=1.0)[:2]
        lse = lse.reshape(splits, qs.shape[1], -1)[..., : qs.shape[2]].float()
        return chunk_merge(out, lse) if merged else (out[:1], lse[:1])

    return {f"cudnn_split{splits}_views": lambda: run(q_view, k_view, v_view, bias_view),
            f"cudnn_split{splits}_copies": lambda: run(q_copy, k_copy, v_copy, bias_copy),
            f"cudnn_split{splits}_nomerge": lambda: run(q_copy, k_copy, v_copy, bias_copy, False)}


def own_rows(items: int, args: argparse.Namespace) -> dict[str, Any]:
    """The rows' own-key reads: prompt rests causally over themselves (real tokens only), canvases
    over their prompt rest's real tokens and the whole canvas; cuDNN under the dense bias (today)
    against FlexAttention under block masks (batch = items)."""
    import torch
    from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

    from router.backends.torch.prefix_attention import attend_cudnn, attend_math, to_bias

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
                       "flex_block_mask": lambda q=q, k=k, v=v, block=block: _lse(attend(
                           q, k, v, block_mask=block, scale=1.0, return_aux=AuxRequest(lse=True))),
                       "flex_dynamic": lambda q=q, k=k, v=v, block=block: _lse(attend_dynamic(
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

    from router.backends.torch.prefix_attention import attend_math, to_bias

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


def _lse(result: Any) -> tuple[Any, Any]:
    out, aux = result
    return out, aux.lse


def no_bias_cudnn(q: Any, k: Any, v: Any) -> tuple[Any, Any]:
    import torch

    out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(
        q, k, v, None, True, 0.0, False, False, scale=1.0)[:2]
    return out, lse.reshape(lse.shape[0], lse.shape[1], -1)[..., : q.shape[2]].float()


def no_bias_flash(q: Any, k: Any, v: Any) -> tuple[Any, Any]:
    import torch

    out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False, False,
                                                                    scale=1.0)[:2]
    return out, lse.float()


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
