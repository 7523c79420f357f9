"""Which kernels a DiffusionGemma read runs: chosen once, when its reader is built, into a frozen
``KernelChoice``, and turned into the fixed ``LayerOps`` of its ``OnePass`` (as vLLM's CustomOp
picks its native or CUDA forward once, at construction). Nothing is swapped while serving: a
compiled read that fails at warm-up is served by a second reader built with ``choice.eager()``.

What a choice fixes: ``fused_pass`` (one pass over the shared weights, onepass.py; off:
transformers' two-pass read, for models whose encoder and decoder weights are not tied),
``band`` (layer kinds whose shared prefix is read under a position band), ``rows_moe`` (the
experts' permutation as row-copy ops, moe.py), ``merge_op`` (the attention merge as an op),
``triton`` (those ops as Triton kernels), ``compiled`` (compiled.py), ``attention`` (the
attention kernel per head dim), ``fused_moe`` (the experts as one fused Triton MoE,
triton_moe.py), ``joint_streams`` (both streams' rows normed and projected to q/k/v by one call
per layer over the tied weights; ``joint_streams_items`` keeps it to reads of at most that many
items, where it pays), ``causal_own`` (the prompt rests' own keys read by a causal kernel with no
bias where that is exact), ``prefix_splits`` (the shared prefix's attention in
that many key chunks run as one call's batch, split_kv.py; ``split_kv_items`` keeps it to reads
of at most that many items, where it pays). ``default_choice`` derives them from the model and
the device's start-up checks; none of them is a deployment option (TorchOptions holds those).
A combination that cannot run is refused here with a ConfigError naming the switch.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from router.backends.torch.kernels.attention import (
    CUDNN_HOPPER_MAX_DIM,
    KERNEL_BY_NAME,
    attend_by_dim,
    causal_by_dim,
    causal_problem,
    no_causal_dims,
    pick_attention,
)
from router.backends.torch.kernels.split_kv import (
    SPLIT_KV_CHUNKS,
    SPLIT_KV_ITEMS,
    split_attend,
    split_problem,
)
from router.backends.torch.model.layer_ops import EAGER, LayerOps, ffn_half_fused, ffn_half_rows
from router.errors import ConfigError

log = logging.getLogger(__name__)

# the reference ("math") runs everywhere; the fused attention kernels on CUDA only
CUDA_ONLY_KERNELS = frozenset(KERNEL_BY_NAME) - {"math"}


@dataclass(frozen=True, slots=True)
class KernelChoice:
    """The kernels of one reader (see the module's docstring). The defaults are the plain eager
    one-pass read; ``default_choice`` gives a device's fast one."""

    fused_pass: bool = True
    band: frozenset[str] = frozenset()
    rows_moe: bool = False
    merge_op: bool = False
    triton: bool = False
    compiled: bool = False
    compile_backend: str = "inductor"  # torch.compile's backend ("aot_eager": the CPU tests)
    attention: tuple[tuple[int, str], ...] = ()  # (head dim, kernel name); others: "math"
    fused_moe: bool = False
    joint_streams: bool = True
    # reads of MORE than this many items project the two streams apart (0: every read joint):
    # joined, a single read is faster but a batch of 32 slower (bench.gpu_variants), so
    # default_choice joins only the small reads
    joint_streams_items: int = 0
    # the prompt rests' own-key attention as causal attention with no bias, where the head dim's
    # kernel has a causal form (cuDNN, math) and the window does not bind within a prompt rest
    # (exact: a real query's causal keys are all real; OnePass.causal_own)
    causal_own: bool = True
    # the shared prefix's attention (under a bias) in this many key chunks, the batch of one call,
    # merged by log-sum-exp (split_kv.py; 1: whole). Why: a single read's prefix read leaves most
    # of a GPU's SMs idle, each thread block looping over every key slot
    prefix_splits: int = 1
    # reads of MORE than this many items read the prefix whole (0: every read as prefix_splits)
    split_kv_items: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "band", frozenset(self.band))
        if not self.fused_pass:  # transformers' two-pass read has none of the one pass's kernels
            for name in ("band", "rows_moe", "merge_op", "triton", "compiled", "attention",
                         "fused_moe", "joint_streams", "joint_streams_items", "causal_own",
                         "split_kv_items"):
                if getattr(self, name) not in (False, 0, frozenset(), ()):
                    raise ConfigError(f"kernel choice: {name} needs fused_pass (the one-pass read)",
                                      field=name)
        if self.triton and not (self.rows_moe or self.merge_op):
            raise ConfigError("kernel choice: triton needs rows_moe or merge_op (its kernels are "
                              "their ops)", field="triton")
        for name, least in (("joint_streams_items", 0), ("split_kv_items", 0), ("prefix_splits", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ConfigError(f"kernel choice: {name} must be an int >= {least}, not {value!r}",
                                  field=name)
        if self.prefix_splits > 1 and not self.fused_pass:
            raise ConfigError("kernel choice: prefix_splits needs fused_pass (the one-pass read)",
                              field="prefix_splits")
        if self.split_kv_items and self.prefix_splits == 1:
            raise ConfigError("kernel choice: split_kv_items limits prefix_splits, which is 1 (off)",
                              field="split_kv_items")
        if self.joint_streams_items and not self.joint_streams:
            raise ConfigError("kernel choice: joint_streams_items limits joint_streams, which is off",
                              field="joint_streams_items")
        if self.fused_moe and self.rows_moe:
            raise ConfigError("kernel choice: fused_moe and rows_moe are two kernels for the same "
                              "experts: choose one", field="fused_moe")
        unknown = {name for _, name in self.attention} - set(KERNEL_BY_NAME)
        if unknown:
            raise ConfigError(f"kernel choice: unknown attention kernels {sorted(unknown)}",
                              field="attention")

    def check(self, *, layer_kinds: set[str], device: Any) -> None:
        """ConfigError when this choice cannot run on ``device`` over a model of ``layer_kinds``."""
        if not self.band <= layer_kinds:
            raise ConfigError(f"kernel choice: band names layer kinds {sorted(self.band - layer_kinds)} "
                              f"the model lacks (it has {sorted(layer_kinds)})", field="band")
        if device.type != "cuda":
            for name in ("triton", "fused_moe"):
                if getattr(self, name):
                    raise ConfigError(f"kernel choice: {name} needs a CUDA device", field=name)
            if {name for _, name in self.attention} & CUDA_ONLY_KERNELS:
                raise ConfigError("kernel choice: attention kernels other than math need a CUDA "
                                  "device", field="attention")

    def for_read(self, n_items: int) -> KernelChoice:
        """The choice a read of ``n_items`` items runs: the streams apart past
        ``joint_streams_items``, the prefix whole past ``split_kv_items``. The read-level limits
        themselves are cleared, so reads that run alike get equal choices and share one OnePass
        (``DiffusionSlotReader.onepass_for``)."""
        apart = bool(self.joint_streams_items) and n_items > self.joint_streams_items
        whole = bool(self.split_kv_items) and n_items > self.split_kv_items
        return replace(self, joint_streams_items=0, split_kv_items=0,
                       joint_streams=self.joint_streams and not apart,
                       prefix_splits=1 if whole else self.prefix_splits)

    def read_thresholds(self) -> tuple[int, ...]:
        """Item counts at which an eager read's choice (``for_read``) changes: 1 and one past
        each read-level limit, so a reader builds a OnePass for every eager read it can get."""
        return tuple(sorted({1} | {limit + 1 for limit in (self.joint_streams_items,
                                                           self.split_kv_items) if limit}))

    def eager(self) -> KernelChoice:
        """The same kernels, uncompiled (the fall-back when compiling or capturing fails)."""
        return replace(self, compiled=False)

    def summary(self) -> dict[str, Any]:
        return {"fused_pass": self.fused_pass, "band": sorted(self.band), "rows_moe": self.rows_moe,
                "merge_op": self.merge_op, "triton": self.triton, "compiled": self.compiled,
                "attention": dict(self.attention), "fused_moe": self.fused_moe,
                "joint_streams": self.joint_streams,
                "joint_streams_items": self.joint_streams_items, "causal_own": self.causal_own,
                "prefix_splits": self.prefix_splits,
                "split_kv_items": self.split_kv_items}


TWO_PASS = KernelChoice(fused_pass=False, joint_streams=False, causal_own=False)
# default_choice's joint_streams_items on CUDA: graph replays (bench.gpu_variants --graph-batches)
# put the joint streams ahead up to 4 items and behind from 8
JOINT_STREAMS_ITEMS = 4


def default_choice(model: Any, *, fast_kernels: bool | None = None, compiled: bool = False,
                   compile_backend: str = "inductor", split_kv_items: int | None = None,
                   split_kv_chunks: int | None = None) -> KernelChoice:
    """A device's choice for ``model``: with ``fast_kernels`` (default: on CUDA) the band read for
    the head dims over cuDNN's Hopper kernels (the global layers; elsewhere cuDNN's flash kernel
    is faster), the experts in bfloat16 as the fused Triton MoE (when it agrees with the row-copy
    experts here; else those: row copies around grouped GEMMs) and the merge op, as Triton kernels
    when they work here; the attention kernel per head dim that agrees with the reference;
    ``compiled`` with the feed-forward half's concatenations fused in; ``joint_streams`` where the attention weights are tied too (on CUDA only in graph buckets of
    up to JOINT_STREAMS_ITEMS items); ``causal_own`` where the kernels' causal forms agree with
    the reference here (``attention.causal_problem``); on CUDA the prefix read in
    ``split_kv_chunks`` key chunks (default SPLIT_KV_CHUNKS) for reads of up to ``split_kv_items``
    items (default SPLIT_KV_ITEMS; 0: off) where the kernels read chunks right
    (``split_kv.split_problem``)."""
    from router.backends.torch.kernels.row_ops import triton_problem
    from router.backends.torch.model.joint_streams import weights_shared

    if not weights_shared(model, attention=False):  # one pass needs tied encoder/decoder weights
        return TWO_PASS
    param = next(model.parameters())
    device, dtype = param.device, param.dtype
    config = model.config.get_text_config()
    dims = {int(c.head_dim) for c in config.per_layer_config}
    joint = weights_shared(model, attention=True)
    attention = pick_attention(device, dtype, dims)
    problem = causal_problem(attention, device, dtype)
    if problem:
        log.warning("torch read: the prompt rests keep their dense causal bias: %s", problem)
    causal = not problem
    if not (fast_kernels if fast_kernels is not None else device.type == "cuda"):
        return KernelChoice(attention=attention, compiled=compiled, compile_backend=compile_backend,
                            joint_streams=joint, causal_own=causal)
    import torch

    triton = not triton_problem(device)
    band = {kind for kind, c in zip(config.layer_types, config.per_layer_config, strict=True)
            if int(c.head_dim) > CUDNN_HOPPER_MAX_DIM}
    bf16 = dtype == torch.bfloat16
    # the fused MoE checks its own kernels: a failed check of the row ops does not turn it off
    fused = bf16 and not fused_moe_problem(device)
    split_items = SPLIT_KV_ITEMS if split_kv_items is None else split_kv_items
    chunks = split_kv_chunks or SPLIT_KV_CHUNKS
    problem = split_problem(attention, chunks, device, dtype) if split_items else ""
    if problem:
        log.warning("torch read: the prefix read stays whole: %s", problem)
        split_items = 0
    return KernelChoice(band=frozenset(band), rows_moe=bf16 and triton and not fused, fused_moe=fused,
                        merge_op=triton, triton=triton, compiled=compiled,
                        compile_backend=compile_backend, attention=attention, joint_streams=joint,
                        joint_streams_items=JOINT_STREAMS_ITEMS if joint else 0, causal_own=causal,
                        prefix_splits=chunks if split_items else 1,
                        split_kv_items=split_items)


def build_layer_ops(choice: KernelChoice) -> LayerOps:
    """The ``LayerOps`` of ``choice`` (the two-pass choice has none: its read is transformers')."""
    from router.backends.torch.kernels.row_ops import row_ops

    ops = row_ops(choice.triton)
    layer_ops = replace(EAGER, attend=attend_by_dim(choice.attention))
    if choice.causal_own:
        layer_ops = replace(layer_ops, attend_causal=causal_by_dim(choice.attention),
                            no_causal_dims=no_causal_dims(choice.attention))
    if choice.rows_moe:
        layer_ops = replace(layer_ops, ffn=partial(ffn_half_rows, ops=ops))
    if choice.fused_moe:
        layer_ops = replace(layer_ops, ffn=ffn_half_fused)
    if choice.merge_op:
        layer_ops = replace(layer_ops, merge=ops.merge, merge3=ops.merge3)
    if choice.prefix_splits > 1:
        layer_ops = replace(layer_ops, attend_prefix=split_attend(
            layer_ops.attend, choice.prefix_splits, ops.merge_chunks))
    if not choice.compiled:
        return layer_ops
    from router.backends.torch.model.compiled import compile_layer_ops

    return compile_layer_ops(layer_ops, backend=choice.compile_backend, merge_op=choice.merge_op)


@functools.cache
def fused_moe_problem(device: Any) -> str:
    """Why the fused Triton MoE (triton_moe.py) cannot serve on ``device`` ("" when it can): no
    Triton here (``row_ops.triton_missing``), or the fused experts disagreeing with
    ``moe.experts_forward`` over the torch row ops on random bf16 experts (uneven groups, one
    expert unused); or its router kernel (triton_router.py) disagreeing with the torch router's tail
    (``triton_router.router_disagreement``): the family serves both or neither. Independent of
    the row ops' check (``row_ops.triton_problem``): one family's failed check turns only that family
    off. Checked once per device, logged."""
    from router.backends.torch.kernels.row_ops import triton_missing

    problem = triton_missing(device)
    if not problem:
        try:
            problem = _fused_moe_disagreement(device)
        except Exception as exc:  # noqa: BLE001 (a failed build or launch: the row-copy experts serve)
            problem = f"{type(exc).__name__}: {exc}"
    if problem:
        log.warning("torch read: fused MoE not used, the row-copy experts serve: %s", problem)
    return problem


def _fused_moe_disagreement(device: Any) -> str:
    from types import SimpleNamespace

    import torch

    from router.backends.torch.kernels.moe import experts_forward
    from router.backends.torch.kernels.row_ops import TORCH_OPS
    from router.backends.torch.kernels.triton_moe import fused_experts
    from router.backends.torch.kernels.triton_router import router_disagreement

    gen = torch.Generator(device=device).manual_seed(0)
    n_experts, hidden_dim, inter_dim, tokens, top_k = 8, 256, 128, 40, 2

    def rand(*shape: int) -> torch.Tensor:
        values = torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16)
        return values.mul_(shape[-1] ** -0.5)

    experts = SimpleNamespace(num_experts=n_experts, gate_up_proj=rand(n_experts, 2 * inter_dim, hidden_dim),
                              down_proj=rand(n_experts, hidden_dim, inter_dim),
                              act_fn=lambda x: torch.nn.functional.gelu(x, approximate="tanh"))
    hidden = torch.randn((tokens, hidden_dim), generator=gen, device=device, dtype=torch.bfloat16)
    index = torch.randint(0, n_experts - 1, (tokens, top_k), generator=gen, device=device)  # one idle
    weights = torch.rand((tokens, top_k), generator=gen, device=device)
    got = fused_experts(hidden, experts.gate_up_proj, experts.down_proj, index, weights).float()
    want = experts_forward(experts, hidden, index, weights, TORCH_OPS).float()
    error = float((got - want).norm() / want.norm())
    if not error < 2e-2:
        return f"fused MoE differs from the row-copy experts (relative error {error:.3g})"
    return router_disagreement(device)
