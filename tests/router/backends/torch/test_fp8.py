"""FP8 copies and products (fp8.py) on the CPU, where the products are the kernels' emulation:
quantization error bounds, the grouped product against float64 references, the FP8 experts
against the bf16 ones on the tiny model, and the model left untouched."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from router.backends.torch.fp8 import (
    E4M3_MAX,
    Fp8Model,
    dequantize,
    experts_forward_fp8,
    fp8_problem,
    grouped_mm_fp8,
    quantize_rows,
)
from router.backends.torch.moe import experts_forward
from tests.router.backends.torch.test_diffusion import tiny_model

MANTISSA = 2.0**-4  # e4m3 rounding, relative, in its normal range
SUBNORMAL = 2.0**-10  # absolute, in units of the scale, below it (half the 2^-9 spacing)
BF16_ROUND = 2.0**-8  # rounding the float32 sum to bf16, relative


@pytest.fixture(scope="module")
def model() -> Any:
    return tiny_model()


def quantization_error_bound(values: Any, scale: Any) -> Any:
    return MANTISSA * values.abs() + SUBNORMAL * scale[..., None]


def product_bound(a: Any, a_scale: Any, w: Any, w_scale: Any) -> Any:
    """|a'.w' - a.w| per output for a (M, K), w (N, K) each quantized within its bound."""
    da, dw = quantization_error_bound(a, a_scale).double(), quantization_error_bound(w, w_scale).double()
    a, w = a.double().abs(), w.double().abs()
    return da @ w.T + a @ dw.T + da @ dw.T


def test_quantize_rows_keeps_each_element_within_e4m3_rounding_of_its_row_scale() -> None:
    gen = torch.Generator().manual_seed(0)
    magnitudes = 10.0 ** torch.linspace(-4, 4, 8)  # rows 10^8 apart: a shared scale would flush some
    weight = (torch.randn((3, 8, 64), generator=gen) * magnitudes[:, None]).bfloat16()
    q = quantize_rows(weight)
    assert q.weight.dtype == torch.float8_e4m3fn and q.weight.shape == weight.shape
    assert q.scale.dtype == torch.float32 and q.scale.shape == (3, 8)
    assert torch.equal(q.weight.float().abs().amax(-1), torch.full((3, 8), E4M3_MAX))  # full range
    error = (dequantize(q) - weight.float()).abs()
    assert (error <= quantization_error_bound(weight.float(), q.scale) * (1 + 1e-6)).all()
    assert error.max() > 0  # it did round


def test_zero_rows_quantize_to_zeros_and_multiply_to_zeros() -> None:
    weight = torch.randn((2, 4, 32)).bfloat16()
    weight[1, 2] = 0
    q = quantize_rows(weight)
    assert q.scale[1, 2] == 1 and not q.weight.float().isnan().any()
    assert torch.equal(dequantize(q)[1, 2], torch.zeros(32))
    rows = torch.randn((6, 32)).bfloat16()
    rows[3] = 0
    out = grouped_mm_fp8(rows, *q, torch.tensor([2, 6], dtype=torch.int32))
    assert torch.equal(out[3], torch.zeros(4, dtype=out.dtype))
    assert not out.isnan().any()


@pytest.mark.parametrize("ends", [[0, 7, 7, 20, 20], [20, 20, 20, 20, 20], [4, 8, 12, 16, 20]],
                         ids=["empty first, middle and last", "one expert", "even"])
def test_grouped_mm_fp8_is_each_experts_product_of_the_quantized_operands(ends: list[int]) -> None:
    gen = torch.Generator().manual_seed(1)
    experts, n, k = 5, 24, 48
    rows = torch.randn((20, k), generator=gen).bfloat16()
    weight = torch.randn((experts, n, k), generator=gen).bfloat16()
    q = quantize_rows(weight)
    offsets = torch.tensor(ends, dtype=torch.int32)
    got = grouped_mm_fp8(rows, *q, offsets)
    assert got.shape == (20, n) and got.dtype == torch.bfloat16
    rows_q = dequantize(quantize_rows(rows)).double()
    row_scale = quantize_rows(rows).scale
    start = 0
    for expert, end in enumerate(ends):
        part = slice(start, end)
        quantized = rows_q[part] @ dequantize(q)[expert].double().T  # what the kernel multiplies
        torch.testing.assert_close(got[part].double(), quantized, rtol=BF16_ROUND, atol=0)
        exact = rows[part].double() @ weight[expert].double().T  # what bf16 would
        bound = product_bound(rows[part].float(), row_scale[part], weight[expert].float(), q.scale[expert])
        assert ((got[part].double() - exact).abs() <= bound + BF16_ROUND * got[part].double().abs()).all()
        start = end


def routed(model: Any, index: int, tokens: int = 12) -> tuple[Any, Any, Any, Any]:
    layer = model.model.decoder.layers[index]
    hidden = torch.randn((tokens, model.config.get_text_config().hidden_size),
                         generator=torch.Generator().manual_seed(index))
    _, weights, top_k = layer.router(hidden)
    return layer, hidden, top_k, weights


# e4m3 rows and weights (2^-4 per element each) through two products and an activation: the
# tiny model's relative error (Frobenius) measured 0.044-0.063 (float32 and bf16); 0.1 leaves
# room, another layer's copies are off by 1.35-1.41
EXPERTS_RTOL = 0.1


@pytest.mark.parametrize("index", [0, 1])
def test_fp8_experts_forward_is_the_bf16_one_within_the_stated_bound(model: Any, index: int) -> None:
    fp8 = Fp8Model(model)
    layer, hidden, top_k, weights = routed(model, index)
    with torch.no_grad():
        want = experts_forward(layer.experts, hidden, top_k, weights)
        got = experts_forward_fp8(layer.experts, fp8.layers[index], hidden, top_k, weights)
    assert got.shape == want.shape and got.dtype == want.dtype
    error = float((got - want).norm() / want.norm())
    assert 0 < error <= EXPERTS_RTOL


def test_a_compiled_experts_forward_takes_each_layers_copies(model: Any) -> None:
    """One compiled function over both layers, their copies passed in (fp8.py's keying): each
    layer's result is its own eager one."""
    fp8 = Fp8Model(model)
    compiled = torch.compile(experts_forward_fp8, backend="aot_eager", dynamic=True)
    with torch.no_grad():
        for index in (0, 1):
            layer, hidden, top_k, weights = routed(model, index)
            torch.testing.assert_close(
                compiled(layer.experts, fp8.layers[index], hidden, top_k, weights),
                experts_forward_fp8(layer.experts, fp8.layers[index], hidden, top_k, weights))


def test_copies_take_one_byte_a_weight_and_four_a_scale(model: Any) -> None:
    fp8 = Fp8Model(model)
    weights = scales = 0
    for layer in model.model.decoder.layers:
        matrices = [layer.experts.gate_up_proj, layer.experts.down_proj]
        weights += sum(m.numel() for m in matrices)
        scales += sum(m.numel() // m.shape[-1] for m in matrices)
    assert fp8.nbytes() == weights + 4 * scales


def test_building_and_using_the_copies_leaves_the_model_untouched() -> None:
    model = tiny_model()
    before = {name: (p.data_ptr(), p.detach().clone()) for name, p in model.named_parameters()}
    buffers = {name for name, _ in model.named_buffers()}
    fp8 = Fp8Model(model)
    layer, hidden, top_k, weights = routed(model, 0)
    with torch.no_grad():
        experts_forward_fp8(layer.experts, fp8.layers[0], hidden, top_k, weights)
    after = dict(model.named_parameters())
    assert after.keys() == before.keys() and {name for name, _ in model.named_buffers()} == buffers
    for name, (ptr, value) in before.items():
        assert after[name].data_ptr() == ptr and after[name].dtype == value.dtype
        assert torch.equal(after[name], value)


def test_untied_stream_weights_are_refused_naming_the_weight() -> None:
    model = tiny_model()
    dec = model.model.decoder.layers[1].experts
    dec.down_proj = torch.nn.Parameter(dec.down_proj.detach().clone())
    with pytest.raises(ValueError, match="experts.down_proj of layer 1"):
        Fp8Model(model)


def test_fp8_problem_on_the_cpu_says_it_needs_cuda() -> None:
    problem = fp8_problem(torch.device("cpu"))
    assert "CUDA" in problem and "cpu" in problem
