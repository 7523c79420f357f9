"""Which kernels a one-pass DiffusionGemma read runs: chosen once, when its reader is built, into a
frozen ``KernelChoice``, and turned into the fixed ``LayerOps`` of its ``OnePass`` by ops.py's
table (each op named once with its reference form, its fast form and its own device check, as
vLLM's CustomOp picks its native or CUDA forward once, at construction). Nothing is swapped while
serving: a compiled read that fails at warm-up is served by a second reader built with
``choice.eager()``. (transformers' two-pass read, for models whose encoder and decoder weights
are not tied, is another reader, serve/two_pass.py: it has no kernels to choose.)

What a choice fixes: ``band`` (layer kinds whose shared prefix is read under a position band),
``rows_moe`` (the experts' permutation as row-copy ops, moe.py), ``merge_op`` (the attention
merge as an op), ``triton`` (those ops as Triton kernels), ``compiled`` (compiled.py),
``attention`` (the attention kernel per head dim), ``fused_moe`` (the experts as one fused
Triton MoE, triton_moe.py), ``joint_streams`` (both streams' rows normed and projected to q/k/v
by one call per layer over the tied weights; ``joint_streams_items`` keeps it to reads of at most
that many items, where it pays), ``causal_own`` (the prompt rests' own keys read by a causal
kernel with no bias where that is exact), ``prefix_splits`` (the shared prefix's attention in
that many key chunks run as one call's batch, split_kv.py; ``split_kv_items`` keeps it to reads
of at most that many items, where it pays). ``default_choice`` derives them from the model and
the ops' device checks; none of them is a deployment option (TorchOptions holds those). A
combination that cannot run is refused here with a ConfigError naming the switch (``RULES``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from router.backends.torch.kernels.attention import (
    CUDNN_HOPPER_MAX_DIM,
    KERNEL_BY_NAME,
    pick_attention,
)
from router.backends.torch.kernels.split_kv import SPLIT_KV_CHUNKS, SPLIT_KV_ITEMS
from router.backends.torch.model.ops import OP_BY_SWITCH, build_layer_ops, fused_moe_problem
from router.errors import ConfigError

__all__ = ["KernelChoice", "build_layer_ops", "default_choice", "fused_moe_problem"]

log = logging.getLogger(__name__)

# the reference ("math") runs everywhere; the fused attention kernels on CUDA only
CUDA_ONLY_KERNELS = frozenset(KERNEL_BY_NAME) - {"math"}


@dataclass(frozen=True, slots=True)
class KernelChoice:
    """The kernels of one reader (see the module's docstring). The defaults are the plain eager
    one-pass read; ``default_choice`` gives a device's fast one."""

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
        for name, least in COUNTS:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ConfigError(f"kernel choice: {name} must be an int >= {least}, not {value!r}",
                                  field=name)
        for name, refused, why in RULES:
            if refused(self):
                raise ConfigError(f"kernel choice: {name} {why}", field=name)
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
        return {"band": sorted(self.band), "rows_moe": self.rows_moe,
                "merge_op": self.merge_op, "triton": self.triton, "compiled": self.compiled,
                "attention": dict(self.attention), "fused_moe": self.fused_moe,
                "joint_streams": self.joint_streams,
                "joint_streams_items": self.joint_streams_items, "causal_own": self.causal_own,
                "prefix_splits": self.prefix_splits,
                "split_kv_items": self.split_kv_items}


# the read-level limits: ints of at least this
COUNTS = (("joint_streams_items", 0), ("split_kv_items", 0), ("prefix_splits", 1))
# (switch, refused when, why): the combinations that cannot run
RULES: tuple[tuple[str, Callable[[KernelChoice], bool], str], ...] = (
    ("triton", lambda c: c.triton and not (c.rows_moe or c.merge_op),
     "needs rows_moe or merge_op (its kernels are their ops)"),
    ("split_kv_items", lambda c: bool(c.split_kv_items) and c.prefix_splits == 1,
     "limits prefix_splits, which is 1 (off)"),
    ("joint_streams_items", lambda c: bool(c.joint_streams_items) and not c.joint_streams,
     "limits joint_streams, which is off"),
    ("fused_moe", lambda c: c.fused_moe and c.rows_moe,
     "and rows_moe are two kernels for the same experts: choose one"),
)
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
    from router.backends.torch.model.joint_streams import weights_shared

    if not weights_shared(model, attention=False):
        raise ConfigError("kernel choice: the one-pass read needs tied encoder/decoder weights "
                          "(two_pass.py reads other models)", field="model")
    param = next(model.parameters())
    device, dtype = param.device, param.dtype
    config = model.config.get_text_config()
    joint = weights_shared(model, attention=True)
    # the attention op's own check: per head dim, the first kernel that agrees with the reference
    attention = pick_attention(device, dtype, {int(c.head_dim) for c in config.per_layer_config})
    base = KernelChoice(attention=attention, compiled=compiled, compile_backend=compile_backend,
                        joint_streams=joint)
    causal = passes("causal_own", base, device, dtype)
    if not (fast_kernels if fast_kernels is not None else device.type == "cuda"):
        return replace(base, causal_own=causal)
    triton = passes("triton", base, device, dtype)
    band = {kind for kind, c in zip(config.layer_types, config.per_layer_config, strict=True)
            if int(c.head_dim) > CUDNN_HOPPER_MAX_DIM}
    # the fused MoE checks its own kernels: a failed check of the row ops does not turn it off
    fused = dtype == torch_bf16() and passes("fused_moe", base, device, dtype)
    split_items = SPLIT_KV_ITEMS if split_kv_items is None else split_kv_items
    chunks = split_kv_chunks or SPLIT_KV_CHUNKS
    if split_items and not passes("prefix_splits", replace(base, prefix_splits=chunks), device, dtype):
        split_items = 0
    return replace(base, band=frozenset(band), rows_moe=dtype == torch_bf16() and triton and not fused,
                   fused_moe=fused, merge_op=triton, triton=triton,
                   joint_streams_items=JOINT_STREAMS_ITEMS if joint else 0, causal_own=causal,
                   prefix_splits=chunks if split_items else 1, split_kv_items=split_items)


def passes(switch: str, choice: KernelChoice, device: Any, dtype: Any) -> bool:
    """Whether the op ``switch`` names passes its device check (ops.py) here; logged when not."""
    op = OP_BY_SWITCH[switch]
    problem = op.check(choice, device, dtype)
    if problem:
        log.warning("torch read: %s off, %s: %s", op.name, op.fallback, problem)
    return not problem


def torch_bf16() -> Any:
    import torch

    return torch.bfloat16
