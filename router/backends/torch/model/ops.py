"""The ops of a one-pass read, each named ONCE: its reference form (torch, every device: what the
eager ``LayerOps`` holds), its fast form (what replaces it in the ``LayerOps`` slots it fills
when the ``KernelChoice`` switch that names it is on) and its own device check (why its fast form
cannot serve on a device; "" when it can). As vLLM's ``CustomOp`` picks its native or CUDA
forward at construction: ``build_layer_ops`` folds the table over the eager ops once, when a
reader is built; ``default_choice`` asks every check once, at start-up; ``/readyz`` reports the
checks that failed (``device_fallbacks``). Nothing here is consulted while serving.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from router.backends.torch.kernels.attention import attend_by_dim, causal_by_dim, no_causal_dims
from router.backends.torch.kernels.split_kv import split_attend
from router.backends.torch.model.joint_streams import ffn_joint
from router.backends.torch.model.layer_ops import (
    EAGER,
    LayerOps,
    ffn_half_fused,
    ffn_half_rows,
    ffn_step,
)

log = logging.getLogger(__name__)

# A choice.py KernelChoice (not imported: choice.py builds on this table, not the reverse)
KernelChoice = Any

# (choice, the ops built so far) -> the slots the fast form fills
Fast = Callable[[KernelChoice, LayerOps], dict[str, Any]]
# (choice, device, dtype) -> why the fast form cannot serve there ("" when it can)
Check = Callable[[KernelChoice, Any, Any], str]


def no_check(choice: KernelChoice, device: Any, dtype: Any) -> str:
    return ""


@dataclass(frozen=True, slots=True)
class Op:
    """One op: ``name`` (as /readyz says it), ``switch`` (the KernelChoice field that turns its
    fast form on), ``slots`` (the ``LayerOps`` fields it fills: their reference forms are
    ``EAGER``'s), ``build`` (its fast form: those slots' functions), ``check`` (its device check)
    and ``fallback`` (what serves when the check fails, in words)."""

    name: str
    switch: str
    slots: tuple[str, ...]
    build: Fast
    check: Check = no_check
    fallback: str = ""

    def on(self, choice: KernelChoice) -> bool:
        value = getattr(choice, self.switch)
        if isinstance(value, bool) or not isinstance(value, int):
            return bool(value)
        return value > 1  # prefix_splits: 1 chunk is the prefix read whole

    def report(self, problem: str) -> str:
        """What /readyz says when the check found ``problem``."""
        return f"{self.name} off, {self.fallback}: {problem}"


def _row_ops(choice: KernelChoice) -> Any:
    from router.backends.torch.kernels.row_ops import row_ops

    return row_ops(choice.triton)


# The checks look their kernels' checks up when called (tests stand in for them).
def _triton_check(choice: KernelChoice, device: Any, dtype: Any) -> str:
    from router.backends.torch.kernels import row_ops

    return row_ops.triton_problem(device)


def _fused_moe_check(choice: KernelChoice, device: Any, dtype: Any) -> str:
    """The fused MoE's kernels against the row-copy experts (bfloat16 models only: for others
    the fused MoE is not a candidate, so nothing failed)."""
    import torch

    return fused_moe_problem(device) if dtype == torch.bfloat16 else ""


def _causal_check(choice: KernelChoice, device: Any, dtype: Any) -> str:
    from router.backends.torch.kernels import attention

    return attention.causal_problem(choice.attention, device, dtype)


def _split_check(choice: KernelChoice, device: Any, dtype: Any) -> str:
    from router.backends.torch.kernels import split_kv

    return split_kv.split_problem(choice.attention, choice.prefix_splits, device, dtype)


def _compiled(choice: KernelChoice, ops: LayerOps) -> dict[str, Any]:
    from router.backends.torch.model.compiled import compile_layer_ops

    compiled = compile_layer_ops(ops, backend=choice.compile_backend, merge_op=choice.merge_op)
    return {name: getattr(compiled, name) for name in COMPILED_SLOTS}


COMPILED_SLOTS = ("norm", "qkv", "qkv_merged", "ffn", "ffn_step", "ffn_joint", "merge", "merge3",
                  "merge_parts", "band_softmax")

# In build order: each fast form is built over the ops before it (the compiled pieces last, over
# whatever kernels were chosen).
OPS: tuple[Op, ...] = (
    # reference: math (float32 softmax) at every head dim; fast: cuDNN / memory-efficient per dim
    Op("attention kernels", "attention", ("attend",),
       lambda c, ops: {"attend": attend_by_dim(c.attention)}),
    # reference: the prompt rests' own keys under their dense causal bias; fast: a causal kernel
    Op("causal attention for the prompt rests' own keys", "causal_own",
       ("attend_causal", "no_causal_dims"),
       lambda c, ops: {"attend_causal": causal_by_dim(c.attention),
                       "no_causal_dims": no_causal_dims(c.attention)},
       _causal_check, "their dense causal bias serves"),
    # reference: transformers' experts; fast: row copies around grouped GEMMs
    Op("row-copy experts", "rows_moe", ("ffn",),
       lambda c, ops: {"ffn": partial(ffn_half_rows, ops=_row_ops(c))}),
    # reference: transformers' experts; fast: one fused Triton MoE + the Triton router tail
    Op("fused Triton MoE", "fused_moe", ("ffn",), lambda c, ops: {"ffn": ffn_half_fused},
       _fused_moe_check, "the row-copy experts serve"),
    # reference: torch log-sum-exp merges; fast: merge ops (Triton kernels with ``triton``)
    Op("merge op", "merge_op", ("merge", "merge3"),
       lambda c, ops: {"merge": _row_ops(c).merge, "merge3": _row_ops(c).merge3}),
    # the row ops' family (merges, MoE row copies, chunk merge): torch or Triton, checked once
    Op("Triton row kernels", "triton", (), lambda c, ops: {}, _triton_check,
       "the torch row ops serve"),
    # reference: the prefix read whole; fast: in key chunks as one call's batch, merged
    Op("the prefix read in key chunks", "prefix_splits", ("attend_prefix",),
       lambda c, ops: {"attend_prefix": split_attend(ops.attend, c.prefix_splits,
                                                     _row_ops(c).merge_chunks)},
       _split_check, "it is read whole"),
    # reference: eager torch; fast: torch.compile of norms, q/k/v, merges, feed-forward halves
    # (last: over whatever kernels were chosen above; a failure shows at warm-up)
    Op("compiled pieces", "compiled", COMPILED_SLOTS, _compiled),
)
OP_BY_SWITCH = {op.switch: op for op in OPS}


def build_layer_ops(choice: KernelChoice) -> LayerOps:
    """The ``LayerOps`` of ``choice``: the reference forms (``EAGER``) with each switched-on op's
    fast form folded in, in ``OPS`` order."""
    ops = EAGER
    for op in OPS:
        if op.on(choice):
            ops = replace(ops, **op.build(choice, ops))
    if not choice.compiled:  # the eager feed-forward steps over the experts chosen above
        ops = replace(ops, ffn_step=partial(ffn_step, ops.ffn), ffn_joint=partial(ffn_joint, ops.ffn))
    return ops


def device_fallbacks(choice: KernelChoice, device: Any, dtype: Any, wanted: tuple[str, ...]) -> list[str]:
    """For each op of ``wanted`` (switch names) that ``choice`` leaves off: why its fast form
    does not serve on ``device`` (its check, memoised where it runs kernels), or nothing when
    its check passes (it is off by design there)."""
    out = []
    for switch in wanted:
        op = OP_BY_SWITCH[switch]
        if op.on(choice):
            continue
        problem = op.check(choice, device, dtype)
        if problem:
            out.append(op.report(problem))
    return out


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
