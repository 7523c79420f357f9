"""Custom ops of the one-pass read: each a torch reference (every device, the CPU tests) and, for
CUDA, a twin op that runs its Triton kernel (triton_rows.py). Which of the two a reader calls is
chosen once, at its construction (choice.py: ``KernelChoice.triton``), never switched at run time.

Why ops of their own: the compiler treats them as opaque calls, so it neither fuses them into
slower kernels (the MoE row copies) nor needs copies to reach their inputs' layouts (the merge
reads strided views). Each reference op's torch body is the arithmetic its kernel must reproduce.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from router.backends.torch.kernels.split_kv import merge_chunks

log = logging.getLogger(__name__)


@torch.library.custom_op("slotgate::moe_gather", mutates_args=())
def moe_gather(rows: torch.Tensor, order: torch.Tensor, top_k: int) -> torch.Tensor:
    """(S, H): row i is ``rows[order[i] // top_k]`` (the token of sorted pair i)."""
    return rows.index_select(0, order // top_k)


@moe_gather.register_fake
def _(rows: torch.Tensor, order: torch.Tensor, top_k: int) -> torch.Tensor:
    return rows.new_empty((order.shape[0], rows.shape[1]))


@torch.library.custom_op("slotgate::moe_combine", mutates_args=())
def moe_combine(out_rows: torch.Tensor, place: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """(T, H): token t's ``sum_k weights[t, k] * out_rows[place[t, k]]``, summed in float32 and
    rounded once to ``out_rows``' dtype (``place``: where pair (t, k) sits in sorted order)."""
    picked = out_rows.index_select(0, place.reshape(-1)).view(*place.shape, -1)
    return (picked.float() * weights.float()[..., None]).sum(dim=1).to(out_rows.dtype)


@moe_combine.register_fake
def _(out_rows: torch.Tensor, place: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    return out_rows.new_empty((place.shape[0], out_rows.shape[1]))


@torch.library.custom_op("slotgate::merge_groups", mutates_args=())
def merge_groups(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
                 lse_b: torch.Tensor) -> torch.Tensor:
    """Two attention parts of the same queries merged by their log-sum-exps (attention.py's
    ``merge``), from grouped views (B, Hk, G, M, D) / (B, Hk, G, M) (``group_view``) to the output
    projection's layout (B, M, Hk*G*D), query head j*G+g. Float32 arithmetic, rounded once."""
    from router.backends.torch.kernels.attention import merge_grouped

    return merge_grouped(out_a, lse_a, out_b, lse_b)  # type: ignore[no-any-return]


@merge_groups.register_fake
def _(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor) -> torch.Tensor:
    b, h_kv, g, m, d = out_a.shape
    return out_a.new_empty((b, m, h_kv * g * d))


@torch.library.custom_op("slotgate::merge_groups3", mutates_args=())
def merge_groups3(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor,
                  out_c: torch.Tensor, lse_c: torch.Tensor) -> torch.Tensor:
    """``merge_groups`` of three parts (attention.py's ``merge_grouped3``)."""
    from router.backends.torch.kernels.attention import merge_grouped3

    return merge_grouped3(out_a, lse_a, out_b, lse_b, out_c, lse_c)  # type: ignore[no-any-return]


def _merged_like(out_a: torch.Tensor, *_: torch.Tensor) -> torch.Tensor:
    b, h_kv, g, m, d = out_a.shape
    return out_a.new_empty((b, m, h_kv * g * d))


merge_groups3.register_fake(_merged_like)


# The Triton twins: the same schemas and fakes; only a reader whose choice says ``triton`` (made
# on CUDA after ``triton_problem`` found none) ever calls them.
@torch.library.custom_op("slotgate::moe_gather_triton", mutates_args=())
def moe_gather_triton(rows: torch.Tensor, order: torch.Tensor, top_k: int) -> torch.Tensor:
    from router.backends.torch.kernels import triton_rows

    return triton_rows.gather_rows(rows, order, top_k)  # type: ignore[no-any-return]


moe_gather_triton.register_fake(lambda rows, order, top_k: rows.new_empty((order.shape[0], rows.shape[1])))


@torch.library.custom_op("slotgate::moe_combine_triton", mutates_args=())
def moe_combine_triton(out_rows: torch.Tensor, place: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    from router.backends.torch.kernels import triton_rows

    return triton_rows.combine_rows(out_rows, place, weights)  # type: ignore[no-any-return]


moe_combine_triton.register_fake(
    lambda out_rows, place, weights: out_rows.new_empty((place.shape[0], out_rows.shape[1])))


@torch.library.custom_op("slotgate::merge_groups_triton", mutates_args=())
def merge_groups_triton(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
                        lse_b: torch.Tensor) -> torch.Tensor:
    """``merge_groups`` as one Triton kernel where it applies (unit last strides, D a power of two);
    the torch arithmetic elsewhere."""
    from router.backends.torch.kernels import triton_rows
    from router.backends.torch.kernels.attention import merge_grouped

    dim = out_a.shape[-1]
    if out_a.stride(-1) == out_b.stride(-1) == 1 and dim & (dim - 1) == 0:
        return triton_rows.merge_groups(out_a, lse_a, out_b, lse_b)  # type: ignore[no-any-return]
    return merge_grouped(out_a, lse_a, out_b, lse_b)  # type: ignore[no-any-return]


merge_groups_triton.register_fake(
    lambda out_a, lse_a, out_b, lse_b: out_a.new_empty(
        (out_a.shape[0], out_a.shape[3], out_a.shape[1] * out_a.shape[2] * out_a.shape[4])))


@torch.library.custom_op("slotgate::merge_groups3_triton", mutates_args=())
def merge_groups3_triton(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
                         lse_b: torch.Tensor, out_c: torch.Tensor, lse_c: torch.Tensor) -> torch.Tensor:
    """``merge_groups3`` as one Triton kernel where it applies (as ``merge_groups_triton``)."""
    from router.backends.torch.kernels import triton_rows
    from router.backends.torch.kernels.attention import merge_grouped3

    dim = out_a.shape[-1]
    if out_a.stride(-1) == out_b.stride(-1) == out_c.stride(-1) == 1 and dim & (dim - 1) == 0:
        return triton_rows.merge_groups(  # type: ignore[no-any-return]
            out_a, lse_a, out_b, lse_b, out_c, lse_c)
    return merge_grouped3(out_a, lse_a, out_b, lse_b, out_c, lse_c)  # type: ignore[no-any-return]


merge_groups3_triton.register_fake(_merged_like)


def merge_chunks_triton(out: torch.Tensor, lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """split_kv.merge_chunks as one Triton kernel where it applies (unit last stride, D a power of
    two); the torch arithmetic elsewhere. Not a custom op: attention runs uncompiled (its kernels
    are graph-captured as they are), so nothing traces it."""
    from router.backends.torch.kernels import triton_rows

    dim = out.shape[-1]
    if out.stride(-1) == 1 and dim & (dim - 1) == 0:
        return triton_rows.merge_chunks(out, lse)
    return merge_chunks(out, lse)


@dataclass(frozen=True, slots=True)
class RowOps:
    """The row ops one reader calls: the torch references or their Triton twins."""

    gather: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]
    combine: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    merge: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    merge3: Callable[..., torch.Tensor]  # three (out, lse) parts -> the output projection's layout
    # key chunks' (out, lse) -> one part over all the keys (split_kv)
    merge_chunks: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


TORCH_OPS = RowOps(moe_gather, moe_combine, merge_groups, merge_groups3, merge_chunks)
TRITON_OPS = RowOps(moe_gather_triton, moe_combine_triton, merge_groups_triton, merge_groups3_triton,
                    merge_chunks_triton)


def row_ops(triton: bool) -> RowOps:
    return TRITON_OPS if triton else TORCH_OPS


def triton_missing(device: torch.device) -> str:
    """Why no Triton kernel can run on ``device`` at all ("" when one can): not CUDA, or Triton
    not importable. Each kernel family then checks its own agreement (``triton_problem`` the row
    ops; choice.fused_moe_problem the fused MoE), so one family's failed check never turns the
    others off."""
    if device.type != "cuda":
        return f"Triton kernels need CUDA, not {device.type}"
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        return f"Triton is not importable: {exc}"
    return ""


@functools.cache
def triton_problem(device: torch.device) -> str:
    """Why the Triton kernels cannot serve on ``device`` ("" when they can): not CUDA, Triton
    missing or failing, or a kernel disagreeing with its torch reference on random inputs. Checked
    once per device (a pure check, memoised); the log says why when refused."""
    if triton_missing(device):
        return triton_missing(device)
    try:
        from router.backends.torch.kernels import triton_rows as kernels

        problem = _disagreement(kernels, device)
    # a missing Triton, a failed build or launch: the torch ops serve, and the log says why
    except Exception as exc:  # noqa: BLE001
        problem = f"{type(exc).__name__}: {exc}"
    if problem:
        log.warning("torch read: Triton kernels not used, their ops run as torch ops: %s", problem)
    return problem


def _disagreement(kernels: Any, device: torch.device) -> str:
    gen = torch.Generator(device=device).manual_seed(0)
    rows = torch.randn((40, 2100), generator=gen, device=device, dtype=torch.bfloat16)
    order = torch.randperm(80, generator=gen, device=device)
    weights = torch.rand((40, 2), generator=gen, device=device)
    if not torch.equal(kernels.gather_rows(rows, order, 2), moe_gather(rows, order, 2)):
        return "MoE gather differs"
    place = order.view(40, 2) % 40
    if not torch.allclose(kernels.combine_rows(rows, place, weights).float(),
                          moe_combine(rows, place, weights).float(), rtol=1e-2, atol=1e-2):
        return "MoE combine differs"
    # strided inputs, as the merge gets them: (B, Hk, G, M, D) views of transposed storage
    out_a, out_b = (torch.randn((3, 5, 2, 2, 256), generator=gen, device=device, dtype=torch.bfloat16)
                    .permute(0, 2, 3, 1, 4) for _ in range(2))
    lse_a, lse_b = (torch.randn((5, 3, 2, 2), generator=gen, device=device).permute(1, 2, 3, 0)
                    for _ in range(2))
    want = merge_groups(out_a, lse_a, out_b, lse_b)
    got = kernels.merge_groups(out_a, lse_a, out_b, lse_b)
    if not torch.allclose(got.float(), want.float(), rtol=1e-2, atol=1e-2):
        return "attention merge differs"
    # a third part shaped as the other two (B, Hk, G, M, D), laid out otherwise (contiguous), and
    # heavier (its log-sum-exps larger), so a dropped or misweighted part shows
    out_c = torch.randn(out_a.shape, generator=gen, device=device, dtype=torch.bfloat16)
    lse_c = torch.randn(lse_a.shape, generator=gen, device=device) + 1.0
    want = merge_groups3(out_a, lse_a, out_b, lse_b, out_c, lse_c)
    got = kernels.merge_groups(out_a, lse_a, out_b, lse_b, out_c, lse_c)
    if not torch.allclose(got.float(), want.float(), rtol=1e-2, atol=1e-2):
        return "three-part attention merge differs"
    # key chunks (S, Hk, M, D) of strided storage, one chunk's log-sum-exps far below the others'
    # (a chunk its queries do not see), so a dropped chunk or a wrong weight shows
    chunks = torch.randn((5, 4, 3, 256), generator=gen, device=device, dtype=torch.bfloat16).permute(1, 2, 0, 3)
    chunk_lse = torch.randn((5, 4, 3), generator=gen, device=device).permute(1, 2, 0)
    chunk_lse[0, :, :2] = -1.0e30
    want_out, want_lse = merge_chunks(chunks, chunk_lse)
    got_out, got_lse = kernels.merge_chunks(chunks, chunk_lse)
    if not (torch.allclose(got_out.float(), want_out.float(), rtol=1e-2, atol=1e-2)
            and torch.allclose(got_lse, want_lse, rtol=1e-4, atol=1e-4)):
        return "key-chunk attention merge differs"
    return ""

