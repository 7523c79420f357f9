"""The FlexAttention candidate (bench/candidates/flex_attention.py: flex_mask, attend_flex): the
block lists flex_mask builds from a visibility mask are those torch's own create_block_mask
builds from the same visibility as a mask_mod, and attention under it is the reference's, so
bench.prefix_forms times a form that computes the read's attention."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.nn.attention.flex_attention import create_block_mask

from bench.candidates.flex_attention import attend_flex, flex_mask
from router.backends.torch.kernels.attention import MASKED, attend_math, to_bias


def visibility(batch: int, queries: int, keys: int, seed: int) -> Any:
    """Random visibility with a fully visible key stretch, an unseen one and ragged edges."""
    gen = torch.Generator().manual_seed(seed)
    visible = torch.rand((batch, queries, keys), generator=gen) > 0.5
    visible[:, :, 128:256] = True  # whole blocks visible (full) ...
    visible[:, : queries // 2, 256:] = False  # ... and whole blocks unseen (skipped)
    return visible


def block_lists(counts: Any, indices: Any) -> list[list[list[int]]]:
    """Per (batch, query block): the sorted key blocks a BlockMask lists."""
    return [[sorted(indices[b, 0, q, : int(counts[b, 0, q])].tolist()) for q in range(counts.shape[2])]
            for b in range(counts.shape[0])]


@pytest.mark.parametrize(("batch", "groups", "queries", "keys"),
                         [(2, 2, 150, 300), (1, 4, 96, 384), (3, 1, 256, 256), (1, 2, 64, 1000)])
def test_flex_mask_lists_the_blocks_create_block_mask_lists(batch: int, groups: int, queries: int,
                                                            keys: int) -> None:
    visible = visibility(batch, queries, keys, seed=queries + keys)
    got = flex_mask(visible, groups)

    def mask_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return visible[b, q_idx % queries, kv_idx]

    want = create_block_mask(mask_mod, batch, None, groups * queries, keys, device="cpu")
    assert block_lists(got.kv_num_blocks, got.kv_indices) == block_lists(want.kv_num_blocks, want.kv_indices)
    assert (block_lists(got.full_kv_num_blocks, got.full_kv_indices)
            == block_lists(want.full_kv_num_blocks, want.full_kv_indices))
    assert int(got.full_kv_num_blocks.sum()) > 0  # the case has full blocks, not only partial ones
    assert got.seq_lengths == (groups * queries, keys)


def test_attention_under_flex_mask_is_the_reference() -> None:
    batch, groups, queries, keys, dim = 2, 2, 150, 300, 16
    visible = visibility(batch, queries, keys, seed=7)
    visible[0, 3] = False  # a query that sees nothing: lse MASKED (not -inf), output 0
    gen = torch.Generator().manual_seed(8)
    q = torch.randn((batch, 1, groups * queries, dim), generator=gen)
    k, v = (torch.randn((batch, 1, keys, dim), generator=gen) for _ in range(2))
    out, lse = attend_flex(q, k, v, flex_mask(visible, groups))
    want_out, want_lse = attend_math(q, k, v, to_bias(visible, groups, torch.float32))
    seen = lse > MASKED / 2
    assert not bool(seen[0, 0, 3]) and not bool(seen[0, 0, queries + 3])  # both groups of that query
    assert float(lse[~seen].max()) == pytest.approx(MASKED) and float(out[0, 0, 3].abs().max()) == 0.0
    # (the bias reference spreads an unseeing query uniformly; both weigh 0 in the merge)
    torch.testing.assert_close(out[seen], want_out[seen], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse[seen], want_lse[seen], atol=1e-5, rtol=1e-5)
