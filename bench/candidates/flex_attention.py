"""A candidate attention kernel for the prefix read, not in the shipped read: FlexAttention under a
block mask built from the read's own visibility (``flex_mask``), with the log-sum-exp
(``attend_flex``). Alone it beat cuDNN under the dense bias at head dim 256
(bench/attention_kernels.py's flex rows), but the whole read with it at the sliding layers was
slower than with cuDNN (bench.gpu_variants --variants flex shipped, code db69cb2), so it left the
read. bench/prefix_forms.py times it; it
imports shipped code, never the reverse."""

from __future__ import annotations

import functools
from typing import Any

from router.backends.torch.kernels.attention import MASKED

# FlexAttention's block size (its default); a flex mask's blocks are these squares
FLEX_BLOCK = 128


def flex_mask(visible: Any, groups: int) -> Any:
    """A FlexAttention ``BlockMask`` of a visibility mask (B, M, N) over ``fold_groups``' queries
    (folded query r is query r % M): the blocks with any visible key and, of those, the fully
    visible ones (which the kernel reads with no mask at all), with ``visible`` itself as the
    mask_mod of the partial ones. Why by hand and not ``create_block_mask``: that one evaluates a
    mask_mod over the whole grid with vmap (or compiles it, once per shape: dozens of graph
    buckets); here the visibility the read already builds is reduced per block in a few tensor ops,
    all on the device with no host sync, so a captured read builds its masks in the graph."""
    import torch
    from torch.nn.attention.flex_attention import BlockMask

    b, m, n = visible.shape
    rows = groups * m
    n_qb, n_kb = -(-rows // FLEX_BLOCK), -(-n // FLEX_BLOCK)
    padded = torch.zeros((b, n_qb * FLEX_BLOCK, n_kb * FLEX_BLOCK), dtype=torch.bool, device=visible.device)
    padded[:, :rows, :n] = visible[:, None].expand(b, groups, m, n).reshape(b, rows, n)
    blocks = padded.view(b, n_qb, FLEX_BLOCK, n_kb, FLEX_BLOCK)
    seen = blocks.any(dim=4).any(dim=2)  # (B, n_qb, n_kb)
    full = blocks.all(dim=4).all(dim=2)  # padding is False: a ragged block is never full
    partial = seen & ~full

    def listed(flags: Any) -> tuple[Any, Any]:
        order = torch.argsort((~flags).to(torch.int8), dim=-1, stable=True)
        return flags.sum(-1).to(torch.int32)[:, None], order.to(torch.int32)[:, None]

    def mask_mod(batch: Any, head: Any, q_idx: Any, kv_idx: Any) -> Any:
        return padded[batch, q_idx, kv_idx]

    (count, index), (full_count, full_index) = listed(partial), listed(full)
    try:
        return BlockMask.from_kv_blocks(count, index, full_count, full_index, BLOCK_SIZE=FLEX_BLOCK,
                                        mask_mod=mask_mod, seq_lengths=(rows, n), compute_q_blocks=False)
    except TypeError:  # a torch without compute_q_blocks (the transposed lists only serve backward)
        return BlockMask.from_kv_blocks(count, index, full_count, full_index, BLOCK_SIZE=FLEX_BLOCK,
                                        mask_mod=mask_mod, seq_lengths=(rows, n))


@functools.cache
def _compiled_flex() -> Any:
    """flex_attention compiled (a second shape compiles a dynamic kernel that serves them all)."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


def attend_flex(q: Any, k: Any, v: Any, mask: Any) -> tuple[Any, Any]:
    """FlexAttention under a ``flex_mask`` (compiled into one Triton kernel on CUDA; on the CPU
    its eager form, which materializes the scores: the tests' reference path), with the
    log-sum-exp. A query that sees no key gets lse MASKED (flex gives -inf), as the bias kernels
    give it, so the merge weighs it 0 and never divides 0 by 0. Why: under a dense bias cuDNN
    runs 2.6x slower than with none (bench/attention_kernels.py); the block mask skips unseen
    blocks and reads fully visible ones unmasked."""
    import warnings

    import torch
    from torch.nn.attention.flex_attention import AuxRequest, flex_attention

    if q.is_cuda:
        out, aux = _compiled_flex()(q, k, v, block_mask=mask, scale=1.0,
                                           return_aux=AuxRequest(lse=True))
    else:
        with warnings.catch_warnings():  # eager on purpose: the CPU's reference form
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            out, aux = flex_attention(q, k, v, block_mask=mask, scale=1.0, return_aux=AuxRequest(lse=True))
    return out, torch.clamp_min(aux.lse.float(), MASKED)
