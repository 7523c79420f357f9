"""The kernel choice (choice.py): the default, each switch alone moved off it and a pairwise
covering set of the rest read what transformers' two-pass read reads (CPU, the tiny DiffusionGemma;
Triton and the CUDA attention kernels are CUDA-only and refused here; the full product runs under
``-m matrix``), the combinations that cannot run are refused at construction naming the switch,
and a built reader is immutable."""

from __future__ import annotations

from dataclasses import fields, replace
from itertools import product
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from router.backends.torch.model.choice import (
    KernelChoice,
    build_layer_ops,
    default_choice,
)
from router.backends.torch.serve.diffusion import DiffusionSlotReader
from router.backends.torch.serve.graphs import GraphShapes
from router.backends.torch.serve.reader import SlotItem
from router.backends.torch.serve.two_pass import TwoPassSlotReader
from router.errors import ConfigError
from tests.router.backends.torch.test_diffusion import PREFIX, tiny_model
from tests.router.backends.torch.test_fused import ITEMS, assert_same_reads

KINDS = ("sliding_attention", "full_attention")
BANDS = [frozenset(b) for b in ((), ("full_attention",), ("sliding_attention",), KINDS)]
SWITCHES = {"band": BANDS, "rows_moe": (False, True),
            "merge_op": (False, True), "triton": (False, True), "compiled": (False, True),
            "fused_moe": (False, True),  # CUDA only
            "attention": ((), ((16, "cudnn"),)),  # CUDA only
            "joint_streams": (True, False), "causal_own": (True, False)}
# What the one-pass read can run on the CPU, default first (test_causal_own.py crosses the
# own-key paths with the switches that shape that attention: joint streams, prefix cache, window)
FACTORS: dict[str, tuple[Any, ...]] = {
    "band": tuple(BANDS), "rows_moe": (False, True), "merge_op": (False, True),
    "compiled": (False, True), "joint_streams": (True, False), "causal_own": (True, False)}
SHAPES = GraphShapes(batches=(4,), draws=(3,), widths=(16,), prefix_tokens=64, labels=6, capture=False)
LONG = SlotItem(PREFIX, tuple(range(100, 120)), ITEMS[0].canvas_ids, ITEMS[0].slot,
                ITEMS[0].label_ids, 2, 9)  # 20 tokens: no bucket holds it, read eagerly


def one_pass(**values: Any) -> KernelChoice:
    """The one-pass choice of these FACTORS values."""
    return KernelChoice(compile_backend="aot_eager", **values)


DEFAULT = {name: values[0] for name, values in FACTORS.items()}


def each_alone() -> list[KernelChoice]:
    """The default, and each switch alone moved off it to each of its other values."""
    out = [one_pass(**DEFAULT)]
    for name, values in FACTORS.items():
        out += [one_pass(**{**DEFAULT, name: value}) for value in values[1:]]
    return out


def pairwise() -> list[KernelChoice]:
    """A covering set: every value of every switch meets every value of every other switch in
    at least one choice (greedy over the full product; deterministic)."""
    names = list(FACTORS)
    rows = [dict(zip(names, values, strict=True)) for values in product(*FACTORS.values())]

    def pairs(row: dict[str, Any]) -> set[tuple[str, Any, str, Any]]:
        return {(a, row[a], b, row[b]) for i, a in enumerate(names) for b in names[i + 1:]}

    uncovered = set().union(*(pairs(row) for row in rows))
    chosen = []
    while uncovered:
        best = max(rows, key=lambda row: len(pairs(row) & uncovered))
        chosen.append(one_pass(**best))
        uncovered -= pairs(best)
    return chosen


def full_matrix() -> list[KernelChoice]:
    """Every one-pass combination the CPU accepts (the ``matrix`` marker's set)."""
    return [one_pass(**dict(zip(FACTORS, values, strict=True))) for values in product(*FACTORS.values())]


CHOICES = list(dict.fromkeys(each_alone() + pairwise()))


def choice_id(choice: KernelChoice) -> str:
    band = "+".join(sorted(k.split("_")[0] for k in choice.band)) or "dense"
    on = [name for name in ("rows_moe", "merge_op", "compiled") if getattr(choice, name)]
    on += [] if choice.joint_streams else ["apart"]
    on += [] if choice.causal_own else ["biased_own"]
    return "-".join([f"band={band}", *on])


@pytest.fixture(scope="module")
def model() -> Any:
    # A window of 8 under a 40-token prefix: the sliding layers' limits bind in every part.
    return tiny_model(window=8)


def two_pass_reads(model: Any) -> list[Any]:
    """transformers' two-pass read of ITEMS and LONG, one at a time: the reference."""
    two = TwoPassSlotReader(model)
    return [two.read([it])[0] for it in [*ITEMS, LONG]]


@pytest.fixture(scope="module")
def want(model: Any) -> list[Any]:
    return two_pass_reads(model)


def test_every_combination_is_shippable_or_refused_naming_a_switch() -> None:
    names = list(SWITCHES)
    matrix = set(full_matrix())
    accepted = 0
    for values in product(*SWITCHES.values()):
        switches = dict(zip(names, values, strict=True))
        try:
            choice = KernelChoice(compile_backend="aot_eager", **switches)  # type: ignore[arg-type]
            choice.check(layer_kinds=set(KINDS), device=torch.device("cpu"))
        except ConfigError as exc:
            assert exc.field in names and exc.field in str(exc)
            continue
        accepted += 1
        assert choice in matrix, choice  # accepted here: so it is in the full matrix
    assert accepted == len(matrix)


def test_the_covering_set_meets_every_pair_of_switch_values() -> None:
    names = list(FACTORS)
    chosen = pairwise()
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            met = {(getattr(c, a), getattr(c, b)) for c in chosen}
            assert met == set(product(FACTORS[a], FACTORS[b])), (a, b)
    assert len(CHOICES) < len(full_matrix()) / 4


def read_as_two_pass(model: Any, want: list[Any], choice: KernelChoice) -> None:
    """``choice``'s reads of ITEMS (through a padded graph bucket) and LONG (eager) are the
    two-pass read's (transformers' read, two_pass.py, is exact unpadded only: its sliding
    cache keeps a padded row's pads in the window; so it is the reference, read one item at a
    time, ``want``)."""
    reader = DiffusionSlotReader(model, choice=choice, graphs=SHAPES)
    assert reader.graphs is not None
    reader.graphs.warm_up(PREFIX, ITEMS[0].canvas_ids, ITEMS[0].slot)
    assert reader.graphs.bucket(ITEMS, 11) == (4, 12, 16)
    assert_same_reads(reader.read(ITEMS), want[: len(ITEMS)])  # bucketed (padded buffers)
    assert_same_reads(reader.read([LONG]), want[len(ITEMS):])  # no bucket: the eager read


@pytest.mark.parametrize("choice", CHOICES, ids=choice_id)
def test_each_shippable_choice_reads_what_the_two_pass_read_reads(model: Any, want: list[Any],
                                                                   choice: KernelChoice) -> None:
    read_as_two_pass(model, want, choice)


@pytest.mark.matrix
@pytest.mark.parametrize("choice", [c for c in full_matrix() if c not in CHOICES], ids=choice_id)
def test_every_other_combination_reads_what_the_two_pass_read_reads(model: Any, want: list[Any],
                                                                    choice: KernelChoice) -> None:
    """The rest of the full product (``-m matrix``; ``make test`` leaves it out)."""
    read_as_two_pass(model, want, choice)


def test_refusals_name_the_switch(model: Any) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"triton": True}, "triton"), ({"attention": ((16, "flash"),)}, "attention"),
        ({"fused_moe": True, "rows_moe": True}, "fused_moe"),
        ({"joint_streams_items": -1}, "joint_streams_items"),
        ({"joint_streams": False, "joint_streams_items": 4}, "joint_streams_items")]
    for switches, field in cases:
        with pytest.raises(ConfigError, match=field) as info:
            KernelChoice(**switches)
        assert info.value.field == field
    for choice, field in ((KernelChoice(band=frozenset({"chunked_attention"})), "band"),
                          (KernelChoice(rows_moe=True, triton=True), "triton"),
                          (KernelChoice(attention=((16, "cudnn"),)), "attention"),
                          (KernelChoice(fused_moe=True), "fused_moe")):
        with pytest.raises(ConfigError, match=field):
            DiffusionSlotReader(model, choice=choice)
    with pytest.raises(ConfigError, match="capture"):
        DiffusionSlotReader(model, graphs=replace(SHAPES, capture=True))
    untied = tiny_model(window=8)
    mlp = untied.model.decoder.layers[0].mlp  # the decoder's own feed-forward weight: untied
    mlp.gate_proj.weight = torch.nn.Parameter(mlp.gate_proj.weight.detach() * 1.5)
    for build in (lambda: DiffusionSlotReader(untied), lambda: default_choice(untied)):
        with pytest.raises(ConfigError, match="two_pass") as info:
            build()
        assert info.value.field == "model"


def test_a_reader_and_its_one_pass_are_immutable_and_choose_once(model: Any) -> None:
    reader = DiffusionSlotReader(model)
    assert reader.choice == default_choice(model) == KernelChoice(attention=((16, "math"), (32, "math")))
    assert reader.onepass is not None
    for target, name in ((reader, "graphs"), (reader, "choice"), (reader, "use_prefix_cache"),
                         (reader.onepass, "ops"), (reader.onepass, "band")):
        with pytest.raises(AttributeError, match="immutable"):
            setattr(target, name, None)
    compiled = one_pass(**{**DEFAULT, "compiled": True})
    eager = replace(compiled, compiled=False)
    assert compiled.eager() == eager
    assert build_layer_ops(compiled).ffn_step is not build_layer_ops(eager).ffn_step
    assert {f.name for f in fields(KernelChoice)} >= set(SWITCHES)


@pytest.mark.parametrize(("rows_problem", "moe_problem"), [("attention merge differs", ""),
                                                           ("", "fused MoE differs")])
def test_one_kernel_familys_failed_check_turns_only_that_family_off(
        monkeypatch: pytest.MonkeyPatch, rows_problem: str, moe_problem: str) -> None:
    """The row ops (row_ops.triton_problem) and the fused MoE (ops.fused_moe_problem) are checked
    apart: a failed row-op check leaves the fused MoE on, and the other way round (one wrong
    check must not turn every Triton kernel off, the fused MoE included)."""
    from router.backends.torch.kernels import row_ops
    from router.backends.torch.model import choice as choice_module
    from router.backends.torch.model import ops

    monkeypatch.setattr(row_ops, "triton_problem", lambda device: rows_problem)
    monkeypatch.setattr(ops, "fused_moe_problem", lambda device: moe_problem)
    model = tiny_model(window=8).to(torch.bfloat16)
    fast = choice_module.default_choice(model, fast_kernels=True)
    assert fast.fused_moe is (not moe_problem)
    assert fast.triton is fast.merge_op is (not rows_problem)
    assert fast.rows_moe is (not rows_problem and bool(moe_problem))  # row copies only with Triton
