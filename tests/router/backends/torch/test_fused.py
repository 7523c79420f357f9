"""The one-pass read with shared-prefix attention (onepass.py, attention.py), its bucketed
static-buffer runner (graphs.py, uncaptured on the CPU) and its compiled pieces (compiled.py):
each equals transformers' two-pass DynamicCache read of the same items, one at a time."""

from __future__ import annotations

from itertools import product
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from router.backends.torch.kernels.attention import (
    attend_math,
    fold_groups,
    merge,
    to_bias,
    unfold_groups,
)
from router.backends.torch.model.choice import KernelChoice
from router.backends.torch.model.onepass import OnePass
from router.backends.torch.serve.diffusion import DiffusionSlotReader
from router.backends.torch.serve.graphs import GraphShapes
from router.backends.torch.serve.reader import SlotItem
from router.backends.torch.serve.two_pass import TwoPassSlotReader
from router.errors import ConfigError
from tests.router.backends.torch.test_diffusion import CANVAS_IDS, PREFIX, item, tiny_model

ITEMS = [item((70, 71, 72), draws=3), item(tuple(range(80, 91)), seed=4, labels=(100, 101)),
         item((90,), seed=5)]


@pytest.fixture(scope="module", params=[64, 8], ids=["window>prompt", "window<prompt"])
def model(request: Any) -> Any:
    # A window of 8 under a 40-token prefix exercises the sliding layers' limits in both parts.
    return tiny_model(window=request.param)


def assert_same_reads(got: list[Any], want: list[Any]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.draws, b.draws, rtol=1e-4, atol=1e-6)
        assert a.entropy_nats == pytest.approx(b.entropy_nats, rel=1e-4)
        assert a.label_mass == pytest.approx(b.label_mass, rel=1e-4)


@pytest.mark.parametrize("cached", [True, False])
def test_one_pass_batch_equals_two_pass_reads_one_at_a_time(model: Any, cached: bool) -> None:
    one = DiffusionSlotReader(model, use_prefix_cache=cached)
    assert one.onepass is not None
    two = TwoPassSlotReader(model, use_prefix_cache=cached)
    # different prompt lengths: the batch is right-padded, the two-pass reads are not
    assert_same_reads(one.read(ITEMS), [two.read([it])[0] for it in ITEMS])


@pytest.mark.parametrize("band", [(), ("full_attention",)], ids=["bias", "band"])
def test_the_trimmed_last_layer_reads_what_the_two_pass_read_reads(band: tuple[str, ...]) -> None:
    """The one pass computes only the slot's query in the last layer (OnePass.last_layer); its
    read is transformers' whole last layer's, over three layers, cached or not."""
    # (transformers makes a DiffusionGemma's last layer full attention, whatever the config says)
    model = tiny_model(window=8, layers=("sliding_attention", "sliding_attention", "full_attention"))
    want = [TwoPassSlotReader(model).read([it])[0] for it in ITEMS]
    for cached in (True, False):
        reader = DiffusionSlotReader(model, choice=KernelChoice(band=frozenset(band)),
                                     use_prefix_cache=cached)
        assert_same_reads(reader.read(ITEMS), want)


def test_joint_streams_read_what_the_streams_apart_read_under_their_own_layer_scalars() -> None:
    # layer_scalar is a buffer (not tied): here each stream's differs, so the joint rows must
    # scale the encoder's and the decoder's apart
    model = tiny_model(window=8,
                       layers=("sliding_attention", "sliding_attention", "full_attention"))
    layers = zip(model.model.encoder.language_model.layers, model.model.decoder.layers, strict=True)
    for index, (enc, dec) in enumerate(layers):
        enc.layer_scalar.fill_(0.5 + 0.25 * index)
        dec.layer_scalar.fill_(1.5 - 0.25 * index)
    want = [TwoPassSlotReader(model).read([it])[0] for it in ITEMS]
    for cached, joint in product((True, False), (True, False)):
        choice = KernelChoice(band=frozenset({"full_attention"}), joint_streams=joint)
        reader = DiffusionSlotReader(model, choice=choice, use_prefix_cache=cached)
        assert reader.onepass is not None and reader.onepass.joint_streams is joint
        assert_same_reads(reader.read(ITEMS), want)


def test_one_projection_over_both_streams_equals_one_per_stream() -> None:
    from router.backends.torch.model.joint_streams import joined
    from router.backends.torch.model.layer_ops import qkv_half

    model = tiny_model(window=8)
    onepass = OnePass(model)
    gen = torch.Generator().manual_seed(6)
    enc_h, dec_h = torch.randn(3, 5, 32, generator=gen), torch.randn(4, 6, 32, generator=gen)
    enc_pos = torch.arange(5).expand(3, 5)
    dec_pos = torch.randint(5, 20, (4, 1), generator=gen) + torch.arange(6)
    kinds = onepass.kinds()
    enc_pe = {kind: onepass.encoder.rotary_emb(enc_h, enc_pos, kind) for kind in kinds}
    dec_pe = {kind: onepass.decoder.rotary_emb(dec_h, dec_pos, kind) for kind in kinds}
    rows, pe = joined((enc_h, dec_h), enc_pe, dec_pe)
    assert torch.equal(rows, torch.cat([enc_h.reshape(15, 32), dec_h.reshape(24, 32)]))
    with torch.inference_mode():
        pairs = zip(kinds, onepass.encoder.layers, onepass.decoder.layers, strict=True)
        for index, (kind, enc, dec) in enumerate(pairs):
            got = onepass.qkv_joint(index, rows, pe[kind], (3, 5), (4, 6))
            want = (qkv_half(enc.self_attn, enc.input_layernorm(enc_h), *enc_pe[kind]),
                    qkv_half(dec.self_attn, dec.input_layernorm(dec_h), *dec_pe[kind]))
            for got_part, want_part in zip(got, want, strict=True):
                for a, b in zip(got_part, want_part, strict=True):
                    assert a.shape == b.shape
                    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def with_attention_biases(model: Any) -> Any:
    """``model`` with a (tied) bias on every q/k/v/o projection, as ``attention_bias`` makes."""
    gen = torch.Generator().manual_seed(8)
    layers = zip(model.model.encoder.language_model.layers, model.model.decoder.layers, strict=True)
    for enc, dec in layers:
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            proj = getattr(enc.self_attn, name)
            if proj is None:
                continue
            bias = torch.nn.Parameter(torch.randn(proj.out_features, generator=gen) * 0.5)
            proj.bias = bias
            getattr(dec.self_attn, name).bias = bias
    return model


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_merged_qkv_product_equals_the_three_projections(bias: bool) -> None:
    from router.backends.torch.model.joint_streams import merged_qkv_weights, qkv_merged
    from router.backends.torch.model.layer_ops import qkv_half

    model = tiny_model(window=8)
    if bias:
        with_attention_biases(model)
    onepass = OnePass(model)
    gen = torch.Generator().manual_seed(7)
    hidden, pos = torch.randn(3, 5, 32, generator=gen), torch.arange(5).expand(3, 5)
    with torch.inference_mode():
        for index, (kind, layer) in enumerate(zip(onepass.kinds(), onepass.encoder.layers,
                                                  strict=True)):
            attn, cos_sin = layer.self_attn, onepass.encoder.rotary_emb(hidden, pos, kind)
            weight, merged_bias = onepass.qkv_weights[index]
            assert (merged_bias is not None) is bias
            n_proj = 3 if attn.v_proj is not None else 2  # full attention: no v_proj
            assert weight.shape[0] == attn.q_proj.out_features + (n_proj - 1) * attn.k_proj.out_features
            got = qkv_merged(attn, weight, merged_bias, hidden, *cos_sin)
            want = qkv_half(attn, hidden, *cos_sin)
            for a, b in zip(got, want, strict=True):
                assert a.shape == b.shape
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
            again = merged_qkv_weights(attn)
            assert torch.equal(again[0], weight)
    assert set(onepass.kinds()) == {"sliding_attention", "full_attention"}  # both layer kinds


def test_merged_qkv_weights_are_a_copy_and_a_swap_of_k_and_v_is_seen() -> None:
    from router.backends.torch.model.layer_ops import qkv_half

    model = tiny_model(window=8)
    before = {name: (p.data_ptr(), p.detach().clone()) for name, p in model.named_parameters()}
    onepass = OnePass(model)
    want = [TwoPassSlotReader(model).read([it])[0] for it in ITEMS]
    reader = DiffusionSlotReader(model, choice=KernelChoice())
    assert reader.onepass is not None and reader.onepass.joint_streams
    assert_same_reads(reader.read(ITEMS), want)
    for name, param in model.named_parameters():  # the model's own weights: untouched
        ptr, value = before[name]
        assert param.data_ptr() == ptr and torch.equal(param.detach(), value), name
    ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    assert OnePass(model, qkv_weights=onepass.qkv_weights).qkv_weights is onepass.qkv_weights
    assert OnePass(model, joint_streams=False).qkv_weights == ()
    # the larger reads' second OnePass (the prefix read whole past split_kv_items) reads the same
    # merged copy (diffusion.py)
    shapes = GraphShapes(batches=(1, 4), draws=(3,), widths=(16,), prefix_tokens=64, labels=6,
                         capture=False)
    split = DiffusionSlotReader(model, choice=KernelChoice(prefix_splits=2, split_kv_items=1),
                                graphs=shapes)
    assert split.onepass is not None and split.onepass_for(4) is not split.onepass
    assert split.onepass_for(4).qkv_weights is split.onepass.qkv_weights
    for weight, _ in onepass.qkv_weights:
        assert weight.untyped_storage().data_ptr() not in ptrs
    # mutation check: k and v rows of the sliding layer's merged copy swapped, the product sees it
    layer = onepass.encoder.layers[0]
    attn, (weight, _) = layer.self_attn, onepass.qkv_weights[0]
    assert attn.v_proj is not None
    n_q, n_k = attn.q_proj.out_features, attn.k_proj.out_features
    gen = torch.Generator().manual_seed(9)
    rows = torch.randn(7, 32, generator=gen)
    cos_sin = onepass.encoder.rotary_emb(rows[None], torch.arange(7)[None], "sliding_attention")
    pe = tuple(t.flatten(0, 1).unsqueeze(1) for t in cos_sin)
    with torch.inference_mode():
        want_kv = qkv_half(attn, layer.input_layernorm(rows[None]), *cos_sin)
        k_rows = weight[n_q:n_q + n_k].clone()
        weight[n_q:n_q + n_k] = weight[n_q + n_k:]
        weight[n_q + n_k:] = k_rows
        try:
            (_, k, v), _ = onepass.qkv_joint(0, rows, pe, (1, 7), (0, 1))
            assert not torch.allclose(k, want_kv[1], rtol=1e-3, atol=1e-3)
            assert not torch.allclose(v, want_kv[2], rtol=1e-3, atol=1e-3)
        finally:
            weight[n_q + n_k:] = weight[n_q:n_q + n_k].clone()
            weight[n_q:n_q + n_k] = k_rows
        (_, k, v), _ = onepass.qkv_joint(0, rows, pe, (1, 7), (0, 1))
        torch.testing.assert_close(k, want_kv[1], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(v, want_kv[2], rtol=1e-5, atol=1e-6)


def test_joint_streams_with_attention_biases_read_what_the_two_pass_read_reads() -> None:
    model = with_attention_biases(tiny_model(window=8, layers=("sliding_attention",
                                                               "sliding_attention",
                                                               "full_attention")))
    want = [TwoPassSlotReader(model).read([it])[0] for it in ITEMS]
    for cached, joint in product((True, False), (True, False)):
        choice = KernelChoice(joint_streams=joint)
        reader = DiffusionSlotReader(model, choice=choice, use_prefix_cache=cached)
        assert reader.onepass is not None and reader.onepass.joint_streams is joint
        assert_same_reads(reader.read(ITEMS), want)


def test_joint_streams_needs_tied_attention_weights() -> None:
    model = tiny_model(window=8)
    attn = model.model.decoder.layers[0].self_attn  # untied: the decoder's own q_proj
    attn.q_proj.weight = torch.nn.Parameter(attn.q_proj.weight.detach() * 1.5)
    with pytest.raises(ConfigError, match="joint_streams") as info:
        DiffusionSlotReader(model, choice=KernelChoice())
    assert info.value.field == "joint_streams"
    reader = DiffusionSlotReader(model)  # the default choice reads the streams apart
    assert not reader.choice.joint_streams
    want = [TwoPassSlotReader(model).read([it])[0] for it in ITEMS]
    assert_same_reads(reader.read(ITEMS), want)


def test_merged_two_part_attention_equals_one_softmax_over_all_keys() -> None:
    gen = torch.Generator().manual_seed(0)
    batch, heads, kv_heads, m, n_a, n_b, dim = 3, 4, 2, 5, 7, 6, 8
    q = torch.randn((batch, heads, m, dim), generator=gen)
    keys = torch.randn((batch, kv_heads, n_a + n_b, dim), generator=gen)
    values = torch.randn((batch, kv_heads, n_a + n_b, dim), generator=gen)
    visible = torch.rand((batch, m, n_a + n_b), generator=gen) > 0.4
    visible[0, 0, :n_a] = False  # a query that sees nothing in part a
    visible[:, :, n_a] = True  # every query sees something
    groups = heads // kv_heads
    rep = keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1)
    want = torch.nn.functional.scaled_dot_product_attention(
        q, *rep, attn_mask=visible[:, None], scale=1.0)
    parts = []
    for sl in (slice(0, n_a), slice(n_a, None)):
        out, lse = attend_math(fold_groups(q, kv_heads), keys[:, :, sl], values[:, :, sl],
                               to_bias(visible[..., sl], groups, q.dtype))
        parts.append((unfold_groups(out, heads), unfold_groups(lse, heads)))
    got = merge(parts[0][0], parts[0][1], parts[1][0], parts[1][1])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_merged_three_part_attention_equals_one_softmax_over_all_keys() -> None:
    """merge3 (OnePass.canvas_own's two parts with the prefix's), plain and in the output
    projection's layout (merge_grouped3, and the merge_groups3 op), against one softmax; a query
    that sees nothing of one part weighs that part 0."""
    from router.backends.torch.kernels.attention import group_view, merge3, merge_grouped3
    from router.backends.torch.kernels.row_ops import merge_groups3

    gen = torch.Generator().manual_seed(1)
    batch, heads, kv_heads, m, dim, sizes = 2, 4, 2, 5, 8, (6, 4, 7)
    n = sum(sizes)
    q = torch.randn((batch, heads, m, dim), generator=gen)
    keys, values = (torch.randn((batch, kv_heads, n, dim), generator=gen) for _ in range(2))
    visible = torch.rand((batch, m, n), generator=gen) > 0.4
    visible[0, 0, : sizes[0]] = False  # a query that sees nothing in the first part
    visible[:, :, -1] = True  # every query sees something
    groups = heads // kv_heads
    rep = keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1)
    want = torch.nn.functional.scaled_dot_product_attention(q, *rep, attn_mask=visible[:, None],
                                                            scale=1.0)
    folded, unfolded, start = [], [], 0
    for size in sizes:
        part = slice(start, start + size)
        out, lse = attend_math(fold_groups(q, kv_heads), keys[:, :, part], values[:, :, part],
                               to_bias(visible[..., part], groups, q.dtype))
        folded += [group_view(out, groups), group_view(lse, groups)]
        unfolded += [unfold_groups(out, heads), unfold_groups(lse, heads)]
        start += size
    torch.testing.assert_close(merge3(*unfolded), want, rtol=1e-5, atol=1e-5)
    laid_out = want.transpose(1, 2).flatten(2)  # (B, M, H*D): query head j*G+g
    torch.testing.assert_close(merge_grouped3(*folded), laid_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(merge_groups3(*folded), laid_out, rtol=1e-5, atol=1e-5)


def graph_set(reader: DiffusionSlotReader, **shapes: Any) -> DiffusionSlotReader:
    """``reader`` rebuilt with uncaptured graph buckets (the CPU's stand-in for CUDA graphs)."""
    kwargs: dict[str, Any] = {"batches": (1, 4), "draws": (1, 3), "widths": (4, 16),
                              "prefix_tokens": 64, "labels": 6, "capture": False, **shapes}
    bucketed = DiffusionSlotReader(reader.model, choice=reader.choice, graphs=GraphShapes(**kwargs))
    assert bucketed.graphs is not None
    bucketed.graphs.warm_up(tuple(range(200, 212)), CANVAS_IDS, 5)
    return bucketed


def test_bucket_padded_static_reads_equal_the_eager_read(model: Any) -> None:
    eager = DiffusionSlotReader(model)
    want = eager.read(ITEMS)
    bucketed = graph_set(DiffusionSlotReader(model))
    assert bucketed.graphs is not None
    assert bucketed.graphs.bucket(ITEMS, 11) == (4, 12, 16)  # 5 rows: 4 items x 3 draws
    seen: list[Any] = []
    run = bucketed.graphs.run

    def recorded(*args: Any) -> Any:
        seen.append(run(*args))
        return seen[-1]

    bucketed.graphs.run = recorded  # type: ignore[method-assign,assignment]
    assert_same_reads(bucketed.read(ITEMS), want)
    # another prefix is loaded into the static buffer, then the first one again
    other = [SlotItem(tuple(range(300, 325)), it.suffix_ids, it.canvas_ids, it.slot, it.label_ids,
                      it.draws, it.seed) for it in ITEMS]
    assert_same_reads(bucketed.read(other), eager.read(other))
    assert_same_reads(bucketed.read(ITEMS[:1]), want[:1])
    assert len(seen) == 3 and all(out is not None for out in seen)


def test_reads_no_bucket_holds_run_eagerly(model: Any) -> None:
    reader = graph_set(DiffusionSlotReader(model), widths=(2,), prefix_tokens=16)
    assert reader.graphs is not None
    long_prefix = ITEMS  # 40 prefix tokens > 16: does not fit the static buffer
    assert reader.graphs.run(long_prefix, PREFIX, reader.prefix_cache(PREFIX)) is None
    assert reader.graphs.bucket(ITEMS, 11) is None  # 11 tokens > the widest bucket
    assert_same_reads(reader.read(ITEMS), DiffusionSlotReader(model).read(ITEMS))


def test_ffn_step_and_rows_kv_equal_their_parts() -> None:
    from router.backends.torch.model.joint_streams import ffn_joint
    from router.backends.torch.model.layer_ops import ffn_step, rows_kv

    gen = torch.Generator().manual_seed(3)
    enc_attn, enc_h = torch.randn(2, 5, 4, generator=gen), torch.randn(2, 5, 4, generator=gen)
    dec_attn, dec_h = torch.randn(3, 6, 4, generator=gen), torch.randn(3, 6, 4, generator=gen)

    def ffn(layer: Any, attn: Any, residual: Any) -> Any:
        return attn * 2 + residual * layer

    enc_out, dec_out = ffn_step(ffn, 0.5, (enc_attn, dec_attn), (enc_h, dec_h),
                                (torch.tensor([3.0]), torch.tensor([5.0])))
    torch.testing.assert_close(enc_out, (enc_attn * 2 + enc_h * 0.5) * 3, rtol=0, atol=0)
    torch.testing.assert_close(dec_out, (dec_attn * 2 + dec_h * 0.5) * 5, rtol=0, atol=0)
    joint_h = torch.cat([enc_h.reshape(10, 4), dec_h.reshape(18, 4)])
    joint_attn = torch.cat([enc_attn.reshape(10, 4), dec_attn.reshape(18, 4)])
    joint = ffn_joint(ffn, 0.5, joint_attn, joint_h, (torch.tensor([3.0]), torch.tensor([5.0])), 10)
    assert torch.equal(joint, torch.cat([enc_out.reshape(10, 4), dec_out.reshape(18, 4)]))
    k_e, v_e = torch.randn(2, 1, 5, 4, generator=gen), torch.randn(2, 1, 5, 4, generator=gen)
    k_d, v_d = torch.randn(3, 1, 6, 4, generator=gen), torch.randn(3, 1, 6, 4, generator=gen)
    rows = torch.tensor([0, 0, 1])
    k, v = rows_kv(k_e, v_e, k_d, v_d, rows)
    assert k.shape == (3, 1, 11, 4)
    for r, owner in enumerate(rows.tolist()):
        assert torch.equal(k[r, :, :5], k_e[owner]) and torch.equal(k[r, :, 5:], k_d[r])
        assert torch.equal(v[r, :, :5], v_e[owner]) and torch.equal(v[r, :, 5:], v_d[r])


def test_band_attention_equals_the_dense_bias_attention() -> None:
    from router.backends.torch.kernels.attention import Band, attend_band

    gen = torch.Generator().manual_seed(1)
    kv_heads, groups, m, n, dim = 2, 3, 7, 9, 8
    q = torch.randn((1, kv_heads, groups * m, dim), generator=gen)
    k, v = (torch.randn((1, kv_heads, n, dim), generator=gen) for _ in range(2))
    key_pos = torch.tensor([3, 4, 5, 6, 7, 8, 9, 1 << 40, 1 << 40])  # two empty slots
    low = torch.tensor([0, 4, 5, 6, 20, 9, 2])  # query 4 sees nothing
    high = torch.tensor(10)
    for bound in (low, None):
        visible = key_pos[None, :] < high
        if bound is not None:
            visible = visible & (key_pos[None, :] >= bound[:, None])
        visible = visible.expand(m, n)
        want_out, want_lse = attend_math(q, k, v, to_bias(visible[None], groups, q.dtype))
        band = Band(key_pos, bound.repeat(groups) if bound is not None else None, high)
        got_out, got_lse = attend_band(q, k, v, band)
        torch.testing.assert_close(got_out, want_out, rtol=1e-5, atol=1e-5)
        seen = visible.any(-1).repeat(groups)  # a query that sees nothing: lse only "tiny"
        torch.testing.assert_close(got_lse[0][:, seen], want_lse[0][:, seen])
        assert bool((got_lse[0][:, ~seen] < -1e29).all())


def test_row_copy_experts_equal_transformers_experts() -> None:
    from router.backends.torch.kernels.moe import experts_forward

    model = tiny_model(window=64)
    experts = model.model.encoder.language_model.layers[0].experts
    gen = torch.Generator().manual_seed(2)
    hidden = torch.randn((11, experts.hidden_dim), generator=gen)
    index = torch.stack([torch.randperm(experts.num_experts, generator=gen)[:2] for _ in range(11)])
    weights = torch.rand((11, 2), generator=gen)
    with torch.inference_mode():
        torch.testing.assert_close(experts_forward(experts, hidden, index, weights),
                                   experts(hidden, index, weights), rtol=1e-5, atol=1e-5)


def test_kernel_order_tries_cudnn_last_above_its_hopper_head_dims() -> None:
    from router.backends.torch.kernels.attention import KERNELS, kernel_order

    assert [name for name, _ in kernel_order(256, KERNELS)] == ["cudnn", "efficient"]
    assert [name for name, _ in kernel_order(512, KERNELS)] == ["efficient", "cudnn"]


def test_triton_is_refused_off_cuda_and_its_ops_are_chosen_not_swapped() -> None:
    from router.backends.torch.kernels import row_ops

    assert row_ops.triton_problem(torch.device("cpu"))  # refused, and why is kept (and logged)
    assert row_ops.row_ops(False) is row_ops.TORCH_OPS and row_ops.row_ops(True) is row_ops.TRITON_OPS
    rows = torch.arange(12.0).view(6, 2)
    assert torch.equal(row_ops.moe_gather(rows, torch.tensor([5, 0, 3]), 2), rows[[2, 0, 1]])
    assert not hasattr(row_ops, "_TRITON")  # no run-time dispatch table


def test_a_rebuilt_twin_shares_the_merged_qkv_copies_and_reads_the_same() -> None:
    """The eager fall-back twin (``rebuilt``) reads through the first reader's merged q/k/v
    copies (one copy a model, not one a reader), unless its choice projects the streams apart."""
    model = tiny_model(window=8)
    reader = DiffusionSlotReader(model, choice=KernelChoice())
    twin = reader.rebuilt(reader.choice.eager(), graphs=False)
    assert reader.onepass is not None and twin.onepass is not None
    assert twin.onepass.qkv_weights is reader.onepass.qkv_weights
    apart = reader.rebuilt(KernelChoice(joint_streams=False), graphs=False)
    assert apart.onepass is not None and apart.onepass.qkv_weights == ()
    assert_same_reads(twin.read(ITEMS), reader.read(ITEMS))


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("items", [1, 3])
def test_head_major_lays_each_stream_end_to_end_whatever_its_layout(items: int, layout: str) -> None:
    """fused.head_major: queries (B, H, M, D) of two streams as (H, sum B*M, D), stream after
    stream, item after item, the same values whether a stream's head-major form is a view (one
    item, contiguous) or needs its copy into place (a transposed (B, M, H, D) projection)."""
    from router.backends.torch.model.onepass import head_major

    gen = torch.Generator().manual_seed(3)
    heads, dim = 4, 8

    def stream(rows: int) -> Any:
        if layout == "transposed":  # as a projection (B, M, H*D) viewed per head
            return torch.randn((items, rows, heads, dim), generator=gen).transpose(1, 2)
        return torch.randn((items, heads, rows, dim), generator=gen)

    queries = (stream(5), stream(2))
    got = head_major(queries)
    # head h's rows: stream 0's items in order, then stream 1's
    want = torch.cat([torch.stack([torch.cat([q[b, h] for b in range(items)]) for h in range(heads)])
                      for q in queries], dim=1)
    assert got.shape == (heads, items * 7, dim)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
