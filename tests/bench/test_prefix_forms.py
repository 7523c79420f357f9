"""The staircase form of the prefix read (bench.prefix_forms.stair_prefix), which the GPU bench
times against cuDNN under the dense bias: on the CPU, with the reference kernels in the places of
cuDNN's, it reads what the reference reads under the whole bias."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from bench.attention_kernels import reference
from bench.prefix_forms import prefix_problem, stair_prefix
from router.backends.torch.kernels.attention import attend_causal_math, attend_math

KERNELS: dict[str, Any] = {"plain": lambda q, k, v: attend_math(q, k, v, None),
                           "causal": attend_causal_math, "biased": attend_math}


@pytest.mark.parametrize(("items", "width", "canvas", "seed"), [(1, 32, 16, 0), (3, 48, 8, 1),
                                                                (2, 16, 16, 2)])
def test_the_staircase_form_reads_what_the_whole_bias_reads(items: int, width: int, canvas: int,
                                                            seed: int) -> None:
    problem = prefix_problem(items, width, canvas, prefix_tokens=1400, seed=seed, device="cpu")
    want_out, want_lse = reference(problem)
    forms = stair_prefix(problem, items, width, **KERNELS)
    for name in ("stair_cudnn", "stair_cudnn_key_bias"):
        out, lse = forms[name]()
        assert out.shape == problem["q"].shape and lse.shape == want_lse.shape
        err = float((out.float() - want_out.float()).norm() / want_out.float().norm())
        assert err < 0.01, (name, err)  # bf16 outputs of float32 arithmetic
        assert torch.allclose(lse, want_lse, atol=1e-3), name
    copied, shared = forms["stair_part_staircase_keys_copied"](), forms["stair_part_staircase"]()
    assert torch.equal(copied[0], shared[0]) and torch.equal(copied[1], shared[1])
    # a part alone is not the answer (the check can fail)
    out, _ = forms["stair_part_bulk"]()
    assert float((out.float() - want_out.float()).norm() / want_out.float().norm()) > 0.05


def test_the_staircase_form_needs_a_full_window_and_a_width_in_16s() -> None:
    short = prefix_problem(1, 32, 16, prefix_tokens=500, device="cpu")
    with pytest.raises(ValueError, match="full window"):
        stair_prefix(short, 1, 32, **KERNELS)
    with pytest.raises(ValueError, match="full window"):
        stair_prefix(prefix_problem(1, 40, 16, prefix_tokens=1400, device="cpu"), 1, 40, **KERNELS)
