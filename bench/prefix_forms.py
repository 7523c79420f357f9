"""The forms of one sliding layer's shared-prefix read that bench.attention_kernels times against
cuDNN under the dense bias the reader builds: FlashAttention-2 with its own window and varlen key
counts, FlexAttention under block masks (static and dynamic shapes), split-KV key chunks, and two
bounds with no mask. The problem (a batch's folded queries over the prefix slots) is built here."""

from __future__ import annotations

from typing import Any

# DiffusionGemma-26B-A4B's sliding layers (../shared/models/...config.json)
HEADS, KV_HEADS, DIM, WINDOW = 16, 8, 256, 1024
GROUPS = HEADS // KV_HEADS
SLOTS = 1024  # the static prefix buffer's sliding slots (window - 1 filled, aligned to 16)


def prefix_problem(items: int, width: int, canvas: int, prefix_tokens: int, seed: int = 0,
                   device: str = "cuda") -> dict[str, Any]:
    """Folded queries of a batch (all items' prompt rests, then their canvases) against the
    sliding prefix slots, with each query's lowest visible slot (what onepass.OnePass.masks gives)."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    n_queries = items * (width + canvas)
    q = torch.randn((1, KV_HEADS, GROUPS * n_queries, DIM), generator=gen, device=device) / DIM ** 0.5
    k, v = (torch.randn((1, KV_HEADS, SLOTS, DIM), generator=gen, device=device) for _ in range(2))
    filled = min(SLOTS, WINDOW - 1, prefix_tokens)
    key_pos = torch.full((SLOTS,), 1 << 40, device=device)
    key_pos[:filled] = torch.arange(prefix_tokens - filled, prefix_tokens, device=device)
    lengths = torch.randint(width // 2, width + 1, (items,), generator=gen, device=device)
    steps = torch.arange(width, device=device)
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
    """The read's own flex path (attention.flex_mask) compiled three ways: static shapes
    (one kernel per shape), dynamic shapes (one kernel for all), and dynamic with the queries
    padded to a multiple of 128 and the kernel told so (IS_DIVISIBLE: no bounds checks, which a
    dynamic length otherwise forces). Outputs are cut back to the real queries."""
    import torch
    from torch.nn.attention.flex_attention import AuxRequest, flex_attention

    from bench.candidates.flex_attention import flex_mask

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
        "flex_mask_static": lambda: out_and_lse(static(q, k, v, block_mask=mask, scale=1.0, return_aux=aux)),
        "flex_mask_dynamic": lambda: out_and_lse(dynamic(q, k, v, block_mask=mask, scale=1.0, return_aux=aux)),
        "flex_mask_dynamic_padded": lambda: cut(dynamic(q_pad, k, v, block_mask=mask_pad, scale=1.0,
                                                        return_aux=aux)),
        "flex_mask_dynamic_padded_divisible": lambda: cut(dynamic(
            q_pad, k, v, block_mask=mask_pad, scale=1.0, return_aux=aux, kernel_options=divisible)),
    }


def split_kv_rows(q: Any, k: Any, v: Any, bias: Any, splits: int) -> dict[str, Any]:
    """The prefix read with its key slots cut into ``splits`` chunks that run as the batch of one
    cuDNN call (the read's ``split_kv.attend_split``), merged by log-sum-exp in torch ops
    (``split_kv.merge_chunks``; the read merges with a Triton kernel). "views": the read's own
    form (the query expanded, the keys and the bias strided in place); "copies": every input laid
    chunk-major beforehand; "nomerge": copies, the attention alone (its output is not the answer)."""
    import torch

    from router.backends.torch.kernels.attention import attend_cudnn
    from router.backends.torch.kernels.split_kv import (
        attend_split,
        chunked,
        chunked_bias,
        merge_chunks,
    )

    chunk = k.shape[2] // splits
    q_copy = q.expand(splits, -1, -1, -1).contiguous()
    k_copy, v_copy = chunked(k, splits).contiguous(), chunked(v, splits).contiguous()
    bias_store = torch.zeros((splits, 1, bias.shape[2], -(-chunk // 16) * 16), dtype=bias.dtype,
                             device=bias.device)
    bias_copy = bias_store[..., :chunk]
    bias_copy.copy_(chunked_bias(bias, splits))

    def copies(merged: bool = True) -> tuple[Any, Any]:
        out, lse = attend_cudnn(q_copy, k_copy, v_copy, bias_copy)
        return merge_chunks(out, lse) if merged else (out[:1], lse[:1])

    return {f"cudnn_split{splits}_views": lambda: attend_split(q, k, v, bias, attend=attend_cudnn,
                                                               splits=splits),
            f"cudnn_split{splits}_copies": copies,
            f"cudnn_split{splits}_nomerge": lambda: copies(merged=False)}


def out_and_lse(result: Any) -> tuple[Any, Any]:
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


def stair_prefix(problem: dict[str, Any], items: int, width: int, *, plain: Any, causal: Any,
                 biased: Any) -> dict[str, Any]:
    """The prefix read of a full window in three parts, none under a bias over every slot (the
    dense bias costs cuDNN 2.6x: 0.66 against 0.25 ms at 32 reads). A full window's slot s holds
    position P - 1023 + s, so prompt-rest query r (position P + r) sees slots s >= r and canvas
    row i sees slots s >= its prompt rest's length: slots [width, 1023) are seen by every query.
    Parts: (1) "bulk", every query over those slots, no mask; (2) the "staircase" slots [0,
    width) for the prompt rests, query r seeing s >= r, which with the queries and the keys both
    reversed is the top-left causal mask (t <= r'), cuDNN's maskless causal kernel, the items as
    its batch; (3) the same slots for the canvases, under a small bias. Merged by log-sum-exp.
    ``plain``/``causal``/``biased``: attention kernels (no mask; causal, (B, H, M, D) in, folded
    out; under a bias). Returns the whole read two ways (the bulk over the 1023 - width filled
    slots, an odd count, or over [width, 1024) with a bias broadcast over the queries hiding the
    empty slot) and each part alone (the staircase also with its keys copied for each item),
    every one in the folded layout of the other rows."""
    import torch

    from router.backends.torch.kernels.attention import merge, to_bias

    q, k, v, filled = problem["q"], problem["k"], problem["v"], problem["filled"]
    if filled != WINDOW - 1 or width % 16:
        raise ValueError("the staircase form needs a full window and a width in 16s")
    n, n_enc = problem["n_queries"], items * width
    grouped = q.view(1, KV_HEADS, GROUPS, n, DIM)
    steps = torch.arange(width, device=q.device)
    lengths = problem["lengths"]
    canvas = (n - n_enc) // items
    stair_canvas = to_bias((steps[None, :] >= lengths[:, None]).repeat_interleave(canvas, 0)[None],
                           GROUPS, q.dtype)
    key_row = torch.zeros((1, 1, 1, SLOTS - width), dtype=q.dtype, device=q.device)
    key_row[..., filled - width:] = -1.0e30  # the empty slot
    key_bias = key_row.expand(1, 1, GROUPS * n, SLOTS - width)

    # the staircase's keys reversed (the read would keep them so from its prefix load), shared
    # by the items with stride 0 or copied for each (in case the kernel refuses the stride)
    stair_kv = tuple(x[:, :, :width].flip(2) for x in (k, v))
    stair_copied = tuple(x.expand(items, -1, -1, -1).contiguous() for x in stair_kv)

    def staircase(copied: bool = False) -> tuple[Any, Any]:
        # prompt rests (items, H, M, D), head j*G + g, rows reversed
        q_rest = grouped[0, :, :, :n_enc].reshape(KV_HEADS * GROUPS, items, width, DIM)
        q_rest = q_rest.transpose(0, 1).flip(2)
        k_rev, v_rev = stair_copied if copied else (x.expand(items, -1, -1, -1) for x in stair_kv)
        out_r, lse_r = causal(q_rest, k_rev, v_rev)  # (items, KV, G*M, D), rows reversed
        out_r = out_r.view(items, KV_HEADS, GROUPS, width, DIM).flip(3).permute(1, 2, 0, 3, 4)
        lse_r = lse_r.view(items, KV_HEADS, GROUPS, width).flip(3).permute(1, 2, 0, 3)
        q_can = grouped[:, :, :, n_enc:].reshape(1, KV_HEADS, GROUPS * (n - n_enc), DIM)
        out_c, lse_c = biased(q_can, k[:, :, :width], v[:, :, :width], stair_canvas)
        out = torch.cat([out_r.reshape(KV_HEADS, GROUPS, n_enc, DIM),
                         out_c.view(KV_HEADS, GROUPS, n - n_enc, DIM)], 2)
        lse = torch.cat([lse_r.reshape(KV_HEADS, GROUPS, n_enc),
                         lse_c.view(KV_HEADS, GROUPS, n - n_enc)], 2)
        return out.view(1, KV_HEADS, GROUPS * n, DIM), lse.view(1, KV_HEADS, GROUPS * n)

    def bulk(key_biased: bool) -> tuple[Any, Any]:
        if key_biased:
            return biased(q, k[:, :, width:], v[:, :, width:], key_bias)  # type: ignore[no-any-return]
        return plain(q, k[:, :, width:filled], v[:, :, width:filled])  # type: ignore[no-any-return]

    def whole(key_biased: bool) -> tuple[Any, Any]:
        (out_b, lse_b), (out_s, lse_s) = bulk(key_biased), staircase()
        return merge(out_b, lse_b, out_s, lse_s), torch.logaddexp(lse_b, lse_s)

    return {"stair_cudnn": lambda: whole(False), "stair_cudnn_key_bias": lambda: whole(True),
            "stair_part_bulk": lambda: bulk(False), "stair_part_bulk_key_bias": lambda: bulk(True),
            "stair_part_staircase": staircase,
            "stair_part_staircase_keys_copied": lambda: staircase(copied=True)}
