"""triton_router's kernel on the CPU, under Triton's interpreter: the same experts and weights as
the torch router's tail (transformers' ops) on distinct scores, ``route`` as the router module
itself, the op's fake, the fused feed-forward half routed through it, and the start-up check
that turns the fused MoE family off when the kernel is wrong."""

from __future__ import annotations

import copy
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from tests.router.backends.torch.interpreted import interpreted_imports

# triton_router imported interpreted (interpreted.py); test_triton_moe's fixture (imported: autouse
# here too) keeps the interpreter set while the tests run and mends the interpreter's bfloat16
# dots the fused MoE's check needs.
with interpreted_imports():
    pytest.importorskip("triton")
    from router.backends.torch.kernels import triton_router
    from router.backends.torch.kernels.triton_router import route, route_top_k, route_top_k_torch
    from router.backends.torch.model import layer_ops
    from router.backends.torch.model.ops import _fused_moe_disagreement
    from tests.router.backends.torch.test_diffusion import tiny_model
    from tests.router.backends.torch.test_triton_moe import _interpreter  # noqa: F401

if type(triton_router._route_kernel).__name__ != "InterpretedFunction":
    pytest.skip("Triton's kernels were imported compiled earlier in this process (CUDA): these "
                "tests run them interpreted on the CPU", allow_module_level=True)


def distinct_scores(n_tokens: int, n_experts: int, dtype: Any, seed: int = 0) -> Any:
    """(T, E) scores, each row a shuffled grid 1/16 apart, shifted, plus noise under 1/64: every
    row's values distinct and in the same order in float32 and bfloat16 (|x| < 8, where a bf16
    step is at most 1/32), so no tie leaves the index to a tie-break."""
    gen = torch.Generator().manual_seed(seed)
    grid = torch.arange(-(n_experts // 2), n_experts - n_experts // 2) / 16
    order = torch.rand((n_tokens, n_experts), generator=gen).argsort(dim=1)
    shift = torch.randint(-3, 4, (n_tokens, 1), generator=gen)
    noise = torch.rand((n_tokens, n_experts), generator=gen) / 64
    return (grid[order] + shift + noise).to(dtype)


def expert_scale(n_experts: int, seed: int = 1) -> Any:
    return torch.rand(n_experts, generator=torch.Generator().manual_seed(seed)) + 0.5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize(("n_experts", "top_k"), [(128, 8), (12, 3)])
@pytest.mark.parametrize("n_tokens", [1, 7, 300])
def test_kernel_equals_the_torch_router(n_tokens: int, n_experts: int, top_k: int, dtype: Any) -> None:
    # Both read the scores as float32 and run the same float32 ops; only the sums' order differs.
    scores = distinct_scores(n_tokens, n_experts, dtype)
    scale = expert_scale(n_experts).to(dtype)
    weights, index = route_top_k(scores, scale, top_k)
    want_weights, want_index = route_top_k_torch(scores, scale, top_k)
    assert weights.dtype == want_weights.dtype == torch.float32 and index.dtype == torch.int64
    assert torch.equal(index, want_index)
    torch.testing.assert_close(weights, want_weights, rtol=0, atol=1e-6)


def assert_routes_as_torch(scores: Any, scale: Any, top_k: int) -> None:
    """The kernel's (weights, index) against the torch tail's: the same experts, weights within 1e-6."""
    weights, index = route_top_k(scores, scale, top_k)
    want_weights, want_index = route_top_k_torch(scores, scale, top_k)
    assert torch.equal(index, want_index)
    torch.testing.assert_close(weights, want_weights, rtol=0, atol=1e-6)


@pytest.mark.parametrize("shift", [-1000.0, 1000.0])
def test_scores_far_from_zero_route_as_near_it(shift: float) -> None:
    # The softmax takes each row's own max: far below zero, a max taken over the padding columns
    # too (12 experts padded to 16) would leave every exp at 0.
    assert_routes_as_torch(distinct_scores(7, 12, torch.float32) + shift, expert_scale(12), 3)


def test_scores_are_read_through_their_strides() -> None:
    wide = distinct_scores(9, 24, torch.float32, seed=2)
    assert_routes_as_torch(wide[:, ::2], expert_scale(12), 3)  # every other column: stride 2


def test_equal_scores_go_to_the_lower_expert_first() -> None:
    # Equal probabilities give equal weights; the kernel takes the lower expert first (torch.topk
    # leaves the order of ties to its implementation: only the weights are compared with it).
    scores = torch.zeros(2, 12)
    scores[1, [9, 2]] = 1.0
    scale = expert_scale(12)
    weights, index = route_top_k(scores, scale, 4)
    assert index.tolist() == [[0, 1, 2, 3], [2, 9, 0, 1]]
    torch.testing.assert_close(weights[0], scale[:4] / 4, rtol=0, atol=1e-6)
    want_weights, _ = route_top_k_torch(scores, torch.ones(12), 4)
    torch.testing.assert_close(route_top_k(scores, torch.ones(12), 4)[0], want_weights)


def test_wrong_inputs_are_refused_by_name() -> None:
    scores, scale = distinct_scores(3, 12, torch.float32), expert_scale(12)
    refused = {"scores is torch.int64": (scores.long(), scale, 3),
               r"scores is torch.float32 \(36,\)": (scores.flatten(), scale, 3),
               r"per_expert_scale is torch.float32 \(11,\)": (scores, scale[:11], 3),
               "per_expert_scale is torch.float64": (scores, scale.double(), 3),
               "top_k is 13": (scores, scale, 13), "top_k is 0": (scores, scale, 0)}
    for message, args in refused.items():
        with pytest.raises(ValueError, match=message):
            route_top_k(*args)
    weights, index = route_top_k(scores[:0], scale, 3)
    assert weights.shape == index.shape == (0, 3)


def router_module(dtype: Any) -> Any:
    """A tiny DiffusionGemma's router (4 experts, top 2) with its scales made random (ones would
    hide a scale taken from the wrong expert), in ``dtype``."""
    router = copy.deepcopy(tiny_model().model.decoder.layers[0].router)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        router.scale.copy_(torch.randn(router.scale.shape, generator=gen) * 0.5 + 1)
        router.per_expert_scale.copy_(torch.rand(router.per_expert_scale.shape, generator=gen) + 0.5)
    return router.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_route_is_the_router_modules_outputs_2_and_3(dtype: Any) -> None:
    router = router_module(dtype)
    flat = torch.randn((37, router.hidden_size), generator=torch.Generator().manual_seed(4)).to(dtype)
    with torch.inference_mode():
        proba, want_weights, want_index = router(flat)
        weights, index = route(router, flat)
    # the test's own premise: no two experts of a row tie (a tie leaves the index to a tie-break)
    assert all(len(set(row)) == len(row) for row in proba.tolist())
    assert weights.dtype == want_weights.dtype and index.dtype == want_index.dtype
    assert torch.equal(index, want_index)
    torch.testing.assert_close(weights, want_weights, rtol=0, atol=1e-6)


def test_the_op_is_route_top_k_and_its_fake_has_the_output_shapes() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    scores, scale = distinct_scores(7, 12, torch.bfloat16), expert_scale(12).bfloat16()
    got = torch.ops.slotgate.route_top_k(scores, scale, 3)
    want = route_top_k(scores, scale, 3)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    with FakeTensorMode() as mode:
        weights, index = torch.ops.slotgate.route_top_k(mode.from_tensor(scores),
                                                        mode.from_tensor(scale), 3)
    assert weights.shape == index.shape == (7, 3)
    assert weights.dtype == torch.float32 and index.dtype == torch.int64


def test_route_compiles_whole_with_the_op_opaque() -> None:
    router = router_module(torch.float32)
    flat = torch.randn((5, router.hidden_size), generator=torch.Generator().manual_seed(5))
    compiled = torch.compile(route, backend="aot_eager", fullgraph=True)
    with torch.inference_mode():
        got, want = compiled(router, flat), route(router, flat)
    assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])


def test_the_fused_feed_forward_half_routes_through_the_kernel(monkeypatch: Any) -> None:
    # ffn_half_fused (fused MoE and router kernel) against the eager ffn_half (the router module,
    # transformers' experts) on a tiny layer: float32 throughout, only summation orders differ.
    layer = tiny_model().model.decoder.layers[0]
    calls: list[int] = []

    def counted(router: Any, flat: Any) -> Any:
        calls.append(flat.shape[0])
        return route(router, flat)

    monkeypatch.setattr(triton_router, "route", counted)
    gen = torch.Generator().manual_seed(6)
    attn_out, residual = (torch.randn((2, 9, layer.hidden_size), generator=gen) for _ in range(2))
    with torch.inference_mode():
        got = layer_ops.ffn_half_fused(layer, attn_out, residual)
        want = layer_ops.ffn_half(layer, attn_out, residual)
    assert calls == [18]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_start_up_check_passes_the_kernel_and_names_a_broken_one(monkeypatch: Any) -> None:
    """ops.fused_moe_problem's check, run here on the CPU: "" with the real kernels; a router
    kernel that picks other experts, or gives other weights, turns the fused MoE family off with
    a problem that names it."""
    cpu = torch.device("cpu")
    assert _fused_moe_disagreement(cpu) == ""
    real = triton_router.route_top_k

    def wrong_index(*args: Any) -> Any:
        weights, index = real(*args)
        return weights, index.flip(-1)

    def wrong_weights(*args: Any) -> Any:
        weights, index = real(*args)
        return weights * (1 + 1e-4), index

    for broken, says in ((wrong_index, "picks other experts"), (wrong_weights, "weights differ")):
        monkeypatch.setattr(triton_router, "route_top_k", broken)
        problem = _fused_moe_disagreement(cpu)
        assert problem.startswith("router kernel (route_top_k)") and says in problem
