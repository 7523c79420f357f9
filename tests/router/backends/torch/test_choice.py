"""The kernel choice (choice.py): every combination of switches that can ship reads what
transformers' two-pass read reads (CPU, the tiny DiffusionGemma; Triton and the CUDA attention
kernels are CUDA-only and refused here), the others are refused at construction naming the switch,
and a built reader is immutable."""

from __future__ import annotations

from dataclasses import fields, replace
from itertools import product
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from router.backends.torch.choice import TWO_PASS, KernelChoice, build_pieces, default_choice
from router.backends.torch.diffusion import DiffusionSlotReader
from router.backends.torch.graphs import GraphShapes
from router.backends.torch.reader import SlotItem
from router.errors import ConfigError
from tests.router.backends.torch.test_diffusion import PREFIX, tiny_model
from tests.router.backends.torch.test_fused import ITEMS, assert_same_reads

KINDS = ("sliding_attention", "full_attention")
BANDS = [frozenset(b) for b in ((), ("full_attention",), ("sliding_attention",), KINDS)]
# FlexAttention at both of the tiny model's head dims (eager on the CPU: block masks included)
FLEX = ((16, "flex"), (32, "flex"))
COMPILES = [(False, False, False), (True, False, False), (True, True, False), (True, False, True),
            (True, True, True)]  # (compiled, fuse_cats, compile_rows_kv)
SWITCHES = {"fused_pass": (True, False), "band": BANDS, "rows_moe": (False, True),
            "merge_op": (False, True), "triton": (False, True), "compiled": (False, True),
            "fuse_cats": (False, True), "compile_rows_kv": (False, True), "trim_last": (True, False),
            "fused_moe": (False, True), "fp8": ("off", "experts"),  # these two: CUDA only
            "attention": ((), FLEX), "joint_streams": (True, False), "causal_own": (True, False),
            "rows_in_place": (True, False)}
# the own-key switches run here together (both on: the default; both off: the copies and biases
# of before); their mixed settings run in test_causal_own.py over the switches that shape that
# attention (joint streams, prefix cache, window, buckets)
PAIRED = ("causal_own", "rows_in_place")
SHAPES = GraphShapes(batches=(4,), draws=(3,), widths=(16,), prefix_tokens=64, labels=6, capture=False)
LONG = SlotItem(PREFIX, tuple(range(100, 120)), ITEMS[0].canvas_ids, ITEMS[0].slot,
                ITEMS[0].label_ids, 2, 9)  # 20 tokens: no bucket holds it, read eagerly


def shippable() -> list[KernelChoice]:
    """Every choice the CPU accepts: the two-pass read, and each one-pass combination."""
    out = [TWO_PASS]
    for band, rows, merge, (compiled, cats, rows_kv), trim, attention, joint, causal in product(
            BANDS, (False, True), (False, True), COMPILES, (True, False), ((), FLEX),
            (True, False), (True, False)):
        out.append(KernelChoice(band=band, rows_moe=rows, merge_op=merge, compiled=compiled,
                                fuse_cats=cats, compile_rows_kv=rows_kv, trim_last=trim,
                                compile_backend="aot_eager", attention=attention,
                                joint_streams=joint, causal_own=causal, rows_in_place=causal))
    return out


CHOICES = shippable()


def choice_id(choice: KernelChoice) -> str:
    if not choice.fused_pass:
        return "two_pass"
    band = "+".join(sorted(k.split("_")[0] for k in choice.band)) or "dense"
    on = [name for name in ("rows_moe", "merge_op", "compiled", "fuse_cats", "compile_rows_kv")
          if getattr(choice, name)] + ([] if choice.trim_last else ["untrimmed"])
    on += ["flex"] if choice.attention == FLEX else []
    on += [] if choice.joint_streams else ["apart"]
    on += [] if choice.causal_own else ["copied_biased_own"]
    return "-".join([f"band={band}", *on])


@pytest.fixture(scope="module")
def model() -> Any:
    # A window of 8 under a 40-token prefix: the sliding layers' limits bind in every part.
    return tiny_model(window=8)


def two_pass_reads(model: Any) -> list[Any]:
    """transformers' two-pass read of ITEMS and LONG, one at a time: the reference."""
    two = DiffusionSlotReader(model, choice=TWO_PASS)
    return [two.read([it])[0] for it in [*ITEMS, LONG]]


@pytest.fixture(scope="module")
def want(model: Any) -> list[Any]:
    return two_pass_reads(model)


def test_every_combination_is_shippable_or_refused_naming_a_switch() -> None:
    names = list(SWITCHES)
    matrix = {replace(c, compile_backend="aot_eager") for c in CHOICES}
    accepted = mixed = 0
    for values in product(*SWITCHES.values()):
        switches = dict(zip(names, values, strict=True))
        try:
            choice = KernelChoice(compile_backend="aot_eager", **switches)  # type: ignore[arg-type]
            choice.check(layer_kinds=set(KINDS), device=torch.device("cpu"))
        except ConfigError as exc:
            assert exc.field in names and exc.field in str(exc)
            continue
        accepted += 1
        # accepted here: so it is in the equality matrix below (PAIRED: as its pair's first)
        paired = replace(choice, **dict.fromkeys(PAIRED[1:], getattr(choice, PAIRED[0])))
        assert paired in matrix, choice
        mixed += paired != choice
    assert accepted - mixed == len(CHOICES) == len(matrix)


@pytest.mark.parametrize("choice", CHOICES, ids=choice_id)
def test_each_shippable_choice_reads_what_the_two_pass_read_reads(model: Any, want: list[Any],
                                                                   choice: KernelChoice) -> None:
    if not choice.fused_pass:
        # transformers' read is exact unpadded only (its sliding cache keeps a padded row's pads
        # in the window): it is the reference, read one item at a time
        reader = DiffusionSlotReader(model, choice=choice)
        assert_same_reads([reader.read([it])[0] for it in [*ITEMS, LONG]], want)
        return
    reader = DiffusionSlotReader(model, choice=choice, graphs=SHAPES)
    assert reader.graphs is not None
    reader.graphs.warm_up(PREFIX, ITEMS[0].canvas_ids, ITEMS[0].slot)
    assert reader.graphs.bucket(ITEMS, 11) == (4, 12, 16)
    assert_same_reads(reader.read(ITEMS), want[: len(ITEMS)])  # bucketed (padded buffers)
    assert_same_reads(reader.read([LONG]), want[len(ITEMS):])  # no bucket: the eager read


def test_refusals_name_the_switch(model: Any) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"fused_pass": False, "compiled": True}, "compiled"),
        ({"fused_pass": False, "band": frozenset({"full_attention"})}, "band"),
        ({"fused_pass": False}, "trim_last"),
        ({"fused_pass": False, "trim_last": False}, "joint_streams"),
        ({"fuse_cats": True}, "fuse_cats"), ({"compile_rows_kv": True}, "compile_rows_kv"),
        ({"triton": True}, "triton"), ({"attention": ((16, "flash"),)}, "attention"),
        ({"fp8": "int4"}, "fp8"), ({"fused_moe": True, "rows_moe": True}, "fused_moe")]
    for switches, field in cases:
        with pytest.raises(ConfigError, match=field) as info:
            KernelChoice(**switches)
        assert info.value.field == field
    for choice, field in ((KernelChoice(band=frozenset({"chunked_attention"})), "band"),
                          (KernelChoice(rows_moe=True, triton=True), "triton"),
                          (KernelChoice(attention=((16, "cudnn"),)), "attention"),
                          (KernelChoice(fused_moe=True), "fused_moe"),
                          (KernelChoice(fp8="experts"), "fp8")):
        with pytest.raises(ConfigError, match=field):
            DiffusionSlotReader(model, choice=choice)
    with pytest.raises(ConfigError, match="capture"):
        DiffusionSlotReader(model, graphs=replace(SHAPES, capture=True))
    with pytest.raises(ConfigError, match="one-pass"):
        DiffusionSlotReader(model, choice=TWO_PASS, graphs=SHAPES)


def test_a_reader_and_its_one_pass_are_immutable_and_choose_once(model: Any) -> None:
    reader = DiffusionSlotReader(model)
    assert reader.choice == default_choice(model) == KernelChoice(attention=((16, "math"), (32, "math")))
    assert reader.onepass is not None
    for target, name in ((reader, "graphs"), (reader, "choice"), (reader, "use_prefix_cache"),
                         (reader.onepass, "pieces"), (reader.onepass, "band")):
        with pytest.raises(AttributeError, match="immutable"):
            setattr(target, name, None)
    eager = replace(CHOICES[-1], compiled=False, fuse_cats=False, compile_rows_kv=False)
    assert CHOICES[-1].eager() == eager
    pieces = build_pieces(CHOICES[-1])
    assert pieces.ffn_step is not None and pieces.rows_kv is not build_pieces(eager).rows_kv
    assert {f.name for f in fields(KernelChoice)} >= set(SWITCHES)


@pytest.mark.parametrize(("rows_problem", "moe_problem"), [("attention merge differs", ""),
                                                           ("", "fused MoE differs")])
def test_one_kernel_familys_failed_check_turns_only_that_family_off(
        monkeypatch: pytest.MonkeyPatch, rows_problem: str, moe_problem: str) -> None:
    """The row ops (ops.triton_problem) and the fused MoE (choice.fused_moe_problem) are checked
    apart: a failed row-op check leaves the fused MoE on, and the other way round. (Device call 5
    of issue 21's fourth session: one wrong check turned every Triton kernel off, the fused MoE
    included: 164.5 instead of ~215 reads/s.)"""
    from router.backends.torch import choice as choice_module
    from router.backends.torch import ops

    monkeypatch.setattr(ops, "triton_problem", lambda device: rows_problem)
    monkeypatch.setattr(choice_module, "fused_moe_problem", lambda device, fp8=False: moe_problem)
    model = tiny_model(window=8).to(torch.bfloat16)
    fast = choice_module.default_choice(model, fast_kernels=True)
    assert fast.fused_moe is (not moe_problem)
    assert fast.triton is fast.merge_op is (not rows_problem)
    assert fast.rows_moe is (not rows_problem and bool(moe_problem))  # row copies only with Triton
