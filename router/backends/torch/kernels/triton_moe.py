"""A DiffusionGemma layer's experts as two fused Triton GEMMs (CUDA; on the CPU under Triton's
interpreter, for the tests), the peer of moe.experts_forward's gather + two grouped GEMMs.

The (token, expert) pairs are sorted by expert and each expert's group padded to a whole number of
row blocks (``align_pairs_triton``: three small kernels with atomic counters, no host sync, so a
CUDA graph can hold it; ``align_pairs``, torch ops, is its reference). The first
kernel reads its rows straight from ``hidden`` through the sorted pairs (no gathered copy), runs the
gate and up GEMMs of one column block side by side and stores ``gelu_tanh(gate) * up`` once; the
second runs the down GEMM and stores each row at its pair's own place; the weighted sum over the
top-k is triton_rows.combine_rows (float32, in k order, rounded once, as transformers sums).
Launch shapes come from ``pick_config`` (shapes only, never a timing run: autotuning at the first
call would break graph capture and make results depend on a race). Measured against the row-copy
path at the real sizes by bench/moe_kernels.py (bench/results/moe_kernels.json).
"""

from __future__ import annotations

from dataclasses import asdict, astuple, dataclass
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from router.backends.torch.kernels.moe import expert_counts


@dataclass(frozen=True, slots=True)
class Tile:
    """One GEMM kernel's launch shape: columns and reduction per block, the row blocks walked
    together over one column band (``group_m``: neighbours reuse the band's weights in L2), and
    Triton's warps and pipelining depth."""

    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int

    def __str__(self) -> str:
        return "/".join(str(v) for v in astuple(self))


@dataclass(frozen=True, slots=True)
class MoeConfig:
    """Rows per block (both kernels': the alignment pads each expert's rows to it) and each
    kernel's tile (the gate/up kernel holds two accumulators: its columns cost twice the
    registers)."""

    block_m: int
    gate_up: Tile
    down: Tile

    def __str__(self) -> str:
        return f"m{self.block_m} gate_up {self.gate_up} down {self.down}"


# Chosen at the real sizes by bench/moe_kernels.py (each kernel's tiles timed alone).
# ~16 pairs an expert (one read, memory bound): row blocks of 32 (one block for most experts, so
# each expert's weights are streamed once) and narrow column blocks, so every multiprocessor streams
# its own slice of the weights.
SMALL_M = MoeConfig(32, gate_up=Tile(64, 128, 1, 4, 3), down=Tile(128, 64, 1, 4, 4))
# ~64 pairs an expert (not measured at that size: LARGE_M's 64-row runner-up tiles).
MID_M = MoeConfig(64, gate_up=Tile(64, 64, 8, 4, 4), down=Tile(128, 64, 8, 4, 4))
# ~500 pairs an expert (a batch of reads, compute bound): tensor-core sized tiles, grouped so that
# row blocks of one expert share its weight tiles in L2.
LARGE_M = MoeConfig(128, gate_up=Tile(128, 64, 8, 8, 4), down=Tile(256, 64, 8, 8, 3))


def pick_config(n_pairs: int, n_experts: int) -> MoeConfig:
    """The launch shapes for ``n_pairs`` (token, expert) pairs over ``n_experts`` experts: by the
    mean pairs an expert gets, a static number (the same shapes always get the same config)."""
    per_expert = n_pairs / max(n_experts, 1)
    if per_expert <= 32:
        return SMALL_M
    if per_expert <= 128:
        return MID_M
    return LARGE_M


class Alignment(NamedTuple):
    """Sorted pairs, each expert's run padded to whole row blocks of ``block_m``.

    ``sorted_pairs`` (n_blocks * block_m,): flat pair indices (token * top_k + j), grouped by
    expert in pair order; padding holds the sentinel ``n_pairs``. ``block_expert`` (n_blocks,):
    the expert of each row block, ``n_experts`` for the blocks past the real ones (the kernels
    skip them).
    """

    sorted_pairs: torch.Tensor
    block_expert: torch.Tensor


def align_pairs(top_k_index: torch.Tensor, n_experts: int, block_m: int) -> Alignment:
    """``top_k_index`` (T, k) as an ``Alignment``, of static size (room for every expert's worst
    padding: T*k + E*(block_m-1) rows, rounded up to whole blocks), by torch ops that never wait
    for the device. Few ops, each a launch (~3 us in a graph, most of this function's time)."""
    flat = top_k_index.reshape(-1)
    n_pairs, device = flat.shape[0], flat.device
    # one-byte keys sort in one radix pass; stable: an expert's pairs stay in pair order
    expert_of, order = torch.sort(flat.to(torch.uint8) if n_experts <= 256 else flat, stable=True)
    counts = expert_counts(flat, n_experts).long()
    pad = (-counts) % block_m
    # sorted pair i moves down by the padding of the experts before its own
    dest = (torch.cumsum(pad, 0) - pad)[expert_of.long()] + torch.arange(n_pairs, device=device)
    n_blocks = triton.cdiv(n_pairs + n_experts * (block_m - 1), block_m)
    sorted_pairs = torch.full((n_blocks * block_m,), n_pairs, dtype=torch.int64, device=device)
    sorted_pairs.scatter_(0, dest, order)
    block_start = torch.arange(0, n_blocks * block_m, block_m, device=device)
    # past the last expert's run, searchsorted answers n_experts itself: the skip mark
    block_expert = torch.searchsorted(torch.cumsum(counts + pad, 0), block_start, right=True,
                                      out_int32=True)
    return Alignment(sorted_pairs, block_expert)


# Pairs a program of the count and place kernels handles: one a thread (4 warps), so each
# thread's atomic increment is its only one (chaining several a thread gained nothing:
# bench/moe_kernels.py's align_pairs_triton rows).
ALIGN_PAIRS_A_PROGRAM = 128
# Row blocks the offsets kernel labels at once; rows it marks as padding at once.
ALIGN_BLOCKS_AT_ONCE = 64
ALIGN_ROWS_AT_ONCE = 1024


def align_pairs_triton(top_k_index: torch.Tensor, n_experts: int, block_m: int, *,
                       pairs_a_program: int = ALIGN_PAIRS_A_PROGRAM) -> Alignment:
    """``align_pairs`` in three small Triton kernels (four launches with the counts' zeroing,
    where the torch ops take about fifteen): count the pairs of each expert (atomic increments), turn the counts into each
    expert's first row, label every row block and mark the padding rows (one program), place each
    pair at its expert's next row (atomic increments). The same sizes, padding and block labels;
    within an expert the pairs land in the order of their atomic increments, not pair order,
    which changes no result: each row of a GEMM tile is computed alone (same k order whatever its
    neighbours) and stored at its pair's own place. ``pairs_a_program``: a power of two (the
    bench times others)."""
    flat = top_k_index.reshape(-1)
    n_pairs, device = flat.shape[0], flat.device
    n_blocks = triton.cdiv(n_pairs + n_experts * (block_m - 1), block_m)
    # every row is written: a pair's by the place kernel, the padding's by the offsets kernel
    sorted_pairs = torch.empty((n_blocks * block_m,), dtype=torch.int64, device=device)
    counts = torch.zeros(n_experts, dtype=torch.int32, device=device)
    cursor = torch.empty(n_experts, dtype=torch.int32, device=device)
    block_expert = torch.empty(n_blocks, dtype=torch.int32, device=device)
    grid = (triton.cdiv(n_pairs, pairs_a_program),)
    _count_kernel[grid](flat, counts, n_pairs, block=pairs_a_program)
    _offsets_kernel[(1,)](counts, cursor, block_expert, sorted_pairs, n_experts, n_blocks, n_pairs,
                          block_m=block_m, experts_p2=triton.next_power_of_2(n_experts),
                          blocks_at_once=ALIGN_BLOCKS_AT_ONCE, rows_at_once=ALIGN_ROWS_AT_ONCE,
                          num_warps=8)
    _place_kernel[grid](flat, cursor, sorted_pairs, n_pairs, block=pairs_a_program)
    return Alignment(sorted_pairs, block_expert)


@triton.jit  # type: ignore[untyped-decorator]  # (Triton ships no type hints)
def _count_kernel(flat, counts, n_pairs, block: tl.constexpr):  # type: ignore[no-untyped-def]
    pairs = tl.program_id(0) * block + tl.arange(0, block)
    real = pairs < n_pairs
    tl.atomic_add(counts + tl.load(flat + pairs, mask=real, other=0), 1, mask=real)


@triton.jit  # type: ignore[untyped-decorator]
def _offsets_kernel(counts, cursor, block_expert, sorted_pairs, n_experts,  # type: ignore[no-untyped-def]
                    n_blocks, n_pairs, block_m: tl.constexpr, experts_p2: tl.constexpr,
                    blocks_at_once: tl.constexpr, rows_at_once: tl.constexpr):
    experts = tl.arange(0, experts_p2)
    real = experts < n_experts
    count = tl.load(counts + experts, mask=real, other=0)
    padded = (count + block_m - 1) // block_m * block_m
    ends = tl.cumsum(padded, axis=0)
    starts = ends - padded
    tl.store(cursor + experts, starts, mask=real)  # each expert's first row
    # the padding rows (the sentinel n_pairs): each expert's after its pairs, and all past the last
    pad = (starts + count)[:, None] + tl.arange(0, block_m)[None, :]
    sentinel = tl.zeros([experts_p2, block_m], dtype=tl.int64) + n_pairs
    tl.store(sorted_pairs + pad, sentinel, mask=real[:, None] & (pad < ends[:, None]))
    used = tl.sum(padded, axis=0)
    for first in range(0, n_blocks * block_m, rows_at_once):
        rows = first + tl.arange(0, rows_at_once)
        tl.store(sorted_pairs + rows, tl.zeros([rows_at_once], dtype=tl.int64) + n_pairs,
                 mask=(rows >= used) & (rows < n_blocks * block_m))
    ends = tl.where(real, ends, 1 << 30)  # no expert past the real ones
    for first in range(0, n_blocks, blocks_at_once):
        blocks = first + tl.arange(0, blocks_at_once)
        # the expert whose rows hold the block's first row; n_experts past the last run
        label = tl.sum((ends[None, :] <= (blocks * block_m)[:, None]).to(tl.int32), axis=1)
        tl.store(block_expert + blocks, label, mask=blocks < n_blocks)


@triton.jit  # type: ignore[untyped-decorator]
def _place_kernel(flat, cursor, sorted_pairs, n_pairs, block: tl.constexpr):  # type: ignore[no-untyped-def]
    pairs = tl.program_id(0) * block + tl.arange(0, block)
    real = pairs < n_pairs
    row = tl.atomic_add(cursor + tl.load(flat + pairs, mask=real, other=0), 1, mask=real)
    tl.store(sorted_pairs + row, pairs.to(tl.int64), mask=real)


@triton.jit  # type: ignore[untyped-decorator]  # (Triton ships no type hints)
def _tile(pid, n_blocks_m, n_blocks_n, group_m: tl.constexpr):  # type: ignore[no-untyped-def]
    """(row block, column block) of program ``pid``: ``group_m`` row blocks walk each column band
    together, so a band's weight tile is read from memory once per group, not once per block."""
    per_group = group_m * n_blocks_n
    first_m = (pid // per_group) * group_m
    size_m = tl.minimum(n_blocks_m - first_m, group_m)
    return first_m + (pid % per_group) % size_m, (pid % per_group) // size_m


@triton.jit  # type: ignore[untyped-decorator]
def _gate_up_kernel(  # type: ignore[no-untyped-def]  # (Triton reads the annotations: none)
        hidden, weight, sorted_pairs, block_expert, inter, n_pairs, n_blocks_m, n_experts,
        hidden_dim, inter_dim, w_e, w_n, w_k, top_k: tl.constexpr, precision: tl.constexpr,
        even_k: tl.constexpr, block_m: tl.constexpr, block_n: tl.constexpr, block_k: tl.constexpr,
        group_m: tl.constexpr):
    pid_m, pid_n = _tile(tl.program_id(0), n_blocks_m, tl.cdiv(inter_dim, block_n), group_m)
    expert = tl.load(block_expert + pid_m).to(tl.int64)
    if expert >= n_experts:  # a block past the real ones
        return
    rows = pid_m * block_m + tl.arange(0, block_m)
    pairs = tl.load(sorted_pairs + rows)
    real = pairs < n_pairs
    tokens = pairs // top_k
    cols = pid_n * block_n + tl.arange(0, block_n)
    ks = tl.arange(0, block_k)
    a_at = hidden + tokens[:, None] * hidden_dim + ks[None, :]
    # columns past the last wrap around (loads need no mask; their results are never stored)
    gate_at = weight + expert * w_e + (cols % inter_dim)[None, :] * w_n + ks[:, None] * w_k
    up_at = gate_at + inter_dim * w_n  # the up rows follow the gate rows (chunk(2) of one GEMM)
    gate = tl.zeros((block_m, block_n), dtype=tl.float32)
    up = tl.zeros((block_m, block_n), dtype=tl.float32)
    for start in range(0, hidden_dim, block_k):
        if even_k:  # no reduction mask: full-width vector loads
            a = tl.load(a_at, mask=real[:, None], other=0.0)
            w_gate, w_up = tl.load(gate_at), tl.load(up_at)
        else:
            k_in = ks < hidden_dim - start
            a = tl.load(a_at, mask=real[:, None] & k_in[None, :], other=0.0)
            w_gate = tl.load(gate_at, mask=k_in[:, None], other=0.0)
            w_up = tl.load(up_at, mask=k_in[:, None], other=0.0)
        gate = tl.dot(a, w_gate, gate, input_precision=precision)
        up = tl.dot(a, w_up, up, input_precision=precision)
        a_at += block_k
        gate_at += block_k * w_k
        up_at += block_k * w_k
    # gelu's tanh form: 0.5 x (1 + tanh(y)) = x * sigmoid(2y), y = sqrt(2/pi) (x + 0.044715 x^3)
    act = gate * tl.sigmoid(1.5957691216057308 * (gate + 0.044715 * gate * gate * gate))
    out_at = inter + rows[:, None].to(tl.int64) * inter_dim + cols[None, :]
    tl.store(out_at, (act * up).to(inter.dtype.element_ty), mask=(cols < inter_dim)[None, :])


@triton.jit  # type: ignore[untyped-decorator]
def _down_kernel(  # type: ignore[no-untyped-def]
        inter, weight, sorted_pairs, block_expert, out, n_pairs, n_blocks_m, n_experts,
        hidden_dim, inter_dim, w_e, w_n, w_k, precision: tl.constexpr, even_k: tl.constexpr,
        block_m: tl.constexpr, block_n: tl.constexpr, block_k: tl.constexpr, group_m: tl.constexpr):
    pid_m, pid_n = _tile(tl.program_id(0), n_blocks_m, tl.cdiv(hidden_dim, block_n), group_m)
    expert = tl.load(block_expert + pid_m).to(tl.int64)
    if expert >= n_experts:
        return
    rows = pid_m * block_m + tl.arange(0, block_m)
    pairs = tl.load(sorted_pairs + rows)
    cols = pid_n * block_n + tl.arange(0, block_n)
    ks = tl.arange(0, block_k)
    a_at = inter + rows[:, None].to(tl.int64) * inter_dim + ks[None, :]
    b_at = weight + expert * w_e + (cols % hidden_dim)[None, :] * w_n + ks[:, None] * w_k
    acc = tl.zeros((block_m, block_n), dtype=tl.float32)
    for start in range(0, inter_dim, block_k):
        if even_k:
            a, b = tl.load(a_at), tl.load(b_at)
        else:
            k_in = ks < inter_dim - start
            a = tl.load(a_at, mask=k_in[None, :], other=0.0)
            b = tl.load(b_at, mask=k_in[:, None], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=precision)
        a_at += block_k
        b_at += block_k * w_k
    # each row goes to its pair's own place (token * top_k + j); padding rows nowhere
    out_at = out + pairs[:, None] * hidden_dim + cols[None, :]
    keep = (pairs < n_pairs)[:, None] & (cols < hidden_dim)[None, :]
    tl.store(out_at, acc.to(out.dtype.element_ty), mask=keep)


class MoeSizes(NamedTuple):
    """A call's sizes: tokens, experts a token, experts, hidden and intermediate widths, pairs."""

    n_tokens: int
    top_k: int
    n_experts: int
    hidden_dim: int
    inter_dim: int
    n_pairs: int


def moe_sizes(down: torch.Tensor, top_k_index: torch.Tensor) -> MoeSizes:
    """The sizes of experts ``down`` (E, H, I) read over routing ``top_k_index`` (T, k)."""
    n_tokens, top_k = top_k_index.shape
    n_experts, hidden_dim, inter_dim = down.shape
    return MoeSizes(n_tokens, top_k, n_experts, hidden_dim, inter_dim, n_tokens * top_k)


def _check_weights(hidden: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> None:
    """Weights in ``hidden``'s dtype."""
    if gate_up.dtype != hidden.dtype or down.dtype != hidden.dtype:
        raise ValueError(f"experts' weights are {gate_up.dtype}/{down.dtype}, hidden {hidden.dtype}: "
                         "they must be of one dtype")


def fused_experts(hidden: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                  top_k_index: torch.Tensor, top_k_weights: torch.Tensor, *,
                  config: MoeConfig | None = None) -> torch.Tensor:
    """What moe.experts_forward returns (T, H) in ``hidden``'s dtype, for gated experts
    ``gate_up`` (E, 2I, H) and ``down`` (E, H, I) of that dtype (no biases, gelu's tanh form):
    for each token, ``sum_j weights[j] * down[e_j] @ (gelu(gate_j) * up_j)``. ``config``: the
    launch shapes (default ``pick_config``'s)."""
    _check_weights(hidden, gate_up, down)
    from router.backends.torch.kernels.triton_rows import combine_rows

    n_tokens, top_k, n_experts, hidden_dim, inter_dim, n_pairs = moe_sizes(down, top_k_index)
    if n_pairs == 0:
        return hidden.new_zeros((n_tokens, hidden_dim))
    config = config or pick_config(n_pairs, n_experts)
    hidden = hidden.contiguous()
    sorted_pairs, block_expert = align_pairs_triton(top_k_index, n_experts, config.block_m)
    n_blocks_m = block_expert.shape[0]
    # float32 inputs multiply in float32 (tensor cores would round them to tf32)
    precision = "ieee" if hidden.dtype == torch.float32 else "tf32"
    inter = hidden.new_empty((sorted_pairs.shape[0], inter_dim))
    grid = (n_blocks_m * triton.cdiv(inter_dim, config.gate_up.block_n),)
    _gate_up_kernel[grid](hidden, gate_up, sorted_pairs, block_expert, inter, n_pairs,
                          n_blocks_m, n_experts, hidden_dim, inter_dim, *gate_up.stride(), top_k, precision,
                          hidden_dim % config.gate_up.block_k == 0, block_m=config.block_m,
                          **asdict(config.gate_up))
    out_rows = hidden.new_empty((n_pairs, hidden_dim))
    grid = (n_blocks_m * triton.cdiv(hidden_dim, config.down.block_n),)
    _down_kernel[grid](inter, down, sorted_pairs, block_expert, out_rows, n_pairs,
                       n_blocks_m, n_experts, hidden_dim, inter_dim, *down.stride(), precision,
                       inter_dim % config.down.block_k == 0, block_m=config.block_m,
                       **asdict(config.down))
    # rows already sit in (token, j) order: the combine's places are the identity
    place = torch.arange(n_pairs, device=hidden.device).view(n_tokens, top_k)
    return combine_rows(out_rows, place, top_k_weights)  # type: ignore[no-any-return]


@torch.library.custom_op("slotgate::fused_moe", mutates_args=())
def fused_moe(hidden: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
              top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
    """``fused_experts`` with ``pick_config``'s shapes, as an op the compiler leaves opaque."""
    return fused_experts(hidden, gate_up, down, top_k_index, top_k_weights)


@fused_moe.register_fake
def _(hidden: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, top_k_index: torch.Tensor,
      top_k_weights: torch.Tensor) -> torch.Tensor:
    return hidden.new_empty((top_k_index.shape[0], down.shape[1]))
