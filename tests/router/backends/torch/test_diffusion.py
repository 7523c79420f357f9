"""DiffusionGemma slot read on a tiny random config (CPU): noise only at the slot, the cached
prefix never changes, seeds repeat, probabilities are the softmax of the model's own logits."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from policies.types import DecisionRequest, Option
from router.backends.torch.serve.batch import draw_noise, prepare_batch
from router.backends.torch.serve.diffusion import DiffusionSlotReader
from router.backends.torch.serve.reader import SlotItem
from router.backends.torch.serve.two_pass import TwoPassSlotReader

VOCAB = 512
CANVAS = 16


def tiny_model(*, vocab: int = VOCAB, window: int = 64, seed: int = 0,
               layers: tuple[str, ...] = ("sliding_attention", "full_attention")) -> Any:
    config = transformers.DiffusionGemmaConfig(
        text_config={
            "vocab_size": vocab, "hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": len(layers),
            "layer_types": list(layers), "num_attention_heads": 2,
            "num_key_value_heads": 1, "head_dim": 16, "global_head_dim": 32, "num_global_key_value_heads": 1,
            "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 16, "sliding_window": window,
            "initializer_range": 0.5,  # large weights: reads far from uniform, differences visible
        },
        vision_config={
            "model_type": "gemma4_vision", "hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 1,
            "num_attention_heads": 2, "head_dim": 8, "patch_size": 4, "pooling_kernel_size": 2,
            "position_embedding_size": 16,
        },
        canvas_length=CANVAS,
    )
    torch.manual_seed(seed)
    return transformers.DiffusionGemmaForBlockDiffusion(config).eval()


@pytest.fixture(scope="module")
def model() -> Any:
    return tiny_model()


PREFIX = tuple(range(20, 60))
CANVAS_IDS = tuple([7] * 5 + [9] + [106 % VOCAB] + [0] * (CANVAS - 7))
LABELS = (100, 101, 102, 103)


def item(suffix: tuple[int, ...], *, draws: int = 1, seed: int = 3, labels: tuple[int, ...] = LABELS) -> SlotItem:
    return SlotItem(PREFIX, suffix, CANVAS_IDS, 5, labels, draws, seed)


def test_noise_only_at_the_slot(model: Any) -> None:
    batch = prepare_batch([item((70, 71, 72), draws=4)], prefix_len=len(PREFIX), vocab_size=VOCAB,
                          pad_id=0)
    canvases = batch.canvas.tolist()
    template = list(CANVAS_IDS)
    for row in canvases:
        diff = [i for i, (a, b) in enumerate(zip(row, template)) if a != b]
        assert diff in ([5], [])  # only the slot may differ from the template
    slot_values = [row[5] for row in canvases]
    assert len(set(slot_values)) > 1  # each draw gets its own noise
    assert slot_values == [draw_noise(seed=3, draw=j, vocab_size=VOCAB, count=1)[0] for j in range(4)]


def test_one_pass_tensors_are_the_per_row_layout(model: Any) -> None:
    """prepare_onepass builds its tensors from padded lists (one tensor each); they equal the
    layout written row by row: items of different lengths, draws and label counts, padded to a
    graph bucket's items, rows, width and labels (fillers of length 1, spare rows reading item
    0's slot 0 and one label), cached prefix and not."""
    reader = DiffusionSlotReader(model)
    items = [item((70, 71, 72), draws=2, seed=5), item((80,), labels=(100, 101)),
             item(tuple(range(90, 96)), draws=3, seed=9, labels=(100, 101, 102))]
    for prefix_len, shape in ((len(PREFIX), {"n_items": 4, "n_rows": 8, "width": 9, "n_labels": 6}),
                              (0, {})):
        batch = reader.prepare_onepass(items, prefix_len=prefix_len, **shape)
        seqs = [it.suffix_ids if prefix_len else it.prefix_ids + it.suffix_ids for it in items]
        n_items, n_rows = shape.get("n_items", 3), shape.get("n_rows", 6)
        width = max(shape.get("width", 0), *map(len, seqs))
        n_labels = shape.get("n_labels", 4)
        ids = torch.full((n_items, width), reader.pad_id, dtype=torch.long)
        lengths = torch.ones(n_items, dtype=torch.long)
        for i, seq in enumerate(seqs):
            ids[i, : len(seq)], lengths[i] = torch.tensor(seq), len(seq)
        canvas = torch.full((n_rows, CANVAS), reader.pad_id, dtype=torch.long)
        row_item, slots = torch.zeros(n_rows, dtype=torch.long), torch.zeros(n_rows, dtype=torch.long)
        label_index = torch.zeros((n_rows, n_labels), dtype=torch.long)
        label_valid = torch.zeros((n_rows, n_labels), dtype=torch.bool)
        label_valid[:, 0] = True
        rows = [(i, d) for i, it in enumerate(items) for d in range(it.draws)]
        for r, (i, d) in enumerate(rows):
            it = items[i]
            canvas[r] = torch.tensor(it.canvas_ids)
            canvas[r, it.slot] = draw_noise(seed=it.seed, draw=d, vocab_size=VOCAB, count=1)[0]
            row_item[r], slots[r] = i, it.slot
            label_index[r, : len(it.label_ids)] = torch.tensor(it.label_ids)
            label_valid[r, : len(it.label_ids)] = True
        want = (ids, lengths, canvas, row_item, slots, label_index, label_valid)
        got = (batch.input_ids, batch.lengths, batch.canvas, batch.row_item, batch.slots,
               batch.label_index, batch.label_valid)
        for name, g, w in zip(("ids", "lengths", "canvas", "row_item", "slots", "label_index",
                               "label_valid"), got, want, strict=True):
            assert g.dtype == w.dtype and torch.equal(g, w), name


def test_read_never_mutates_the_cached_prefix(model: Any) -> None:
    reader = DiffusionSlotReader(model)
    cache = reader.prefix_cache(PREFIX)
    before = [(layer.keys.clone(), layer.values.clone(), layer.keys.data_ptr()) for layer in cache.layers]
    lengths = [layer.get_seq_length() for layer in cache.layers]
    reader.read([item((70, 71, 72), draws=2), item((80, 81), seed=4)])
    reader.read([item((90,) * 5)])
    assert reader.prefix_cache(PREFIX) is cache
    for layer, (keys, values, ptr), length in zip(cache.layers, before, lengths):
        assert layer.keys.data_ptr() == ptr
        assert torch.equal(layer.keys, keys) and torch.equal(layer.values, values)
        assert layer.get_seq_length() == length


def test_same_seed_same_answer_other_seed_other_noise(model: Any) -> None:
    reader = DiffusionSlotReader(model)
    first = reader.read([item((70, 71, 72), draws=2, seed=11)])[0]
    again = reader.read([item((70, 71, 72), draws=2, seed=11)])[0]
    other = reader.read([item((70, 71, 72), draws=2, seed=12)])[0]
    np.testing.assert_array_equal(first.proba, again.proba)
    assert not np.allclose(first.draws, other.draws)


def test_proba_is_softmax_of_the_models_own_slot_logits(model: Any) -> None:
    reader = DiffusionSlotReader(model)
    it = item((70, 71, 72), draws=3, seed=5)
    read = reader.read([it])[0]
    for draw in range(3):
        canvas = list(it.canvas_ids)
        canvas[it.slot] = draw_noise(seed=5, draw=draw, vocab_size=VOCAB, count=1)[0]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([PREFIX + it.suffix_ids]),
                           decoder_input_ids=torch.tensor([canvas])).logits
        manual = torch.softmax(logits[0, it.slot, list(LABELS)], dim=-1).numpy()
        np.testing.assert_allclose(read.draws[draw], manual, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(read.proba, read.draws.mean(axis=0), rtol=1e-6)
    assert 0 < read.label_mass < 1 and read.entropy_nats > 0


def test_cached_uncached_batched_and_single_reads_agree(model: Any) -> None:
    items = [item((70, 71, 72), draws=2), item((80, 81), seed=4, labels=(100, 101)),
             item((90,) * 6, seed=5)]
    cached = DiffusionSlotReader(model).read(items)
    uncached = DiffusionSlotReader(model, use_prefix_cache=False).read(items)
    single = [DiffusionSlotReader(model).read([it])[0] for it in items]
    for a, b, c in zip(cached, uncached, single):
        np.testing.assert_allclose(a.proba, b.proba, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(a.proba, c.proba, rtol=1e-4, atol=1e-6)
    assert [len(r.proba) for r in cached] == [4, 2, 4]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from tests.router.backends.torch_models import smollm2_tokenizer

    return smollm2_tokenizer()


def test_backend_reads_exactly_the_options_and_fingerprints_its_settings(tokenizer: Any) -> None:
    from router.backends.torch.backend import TorchBackend
    from router.backends.torch.options import TorchOptions

    model = tiny_model(vocab=len(tokenizer), window=4096)
    reader = DiffusionSlotReader(model)
    kwargs: dict[str, Any] = {"kind": "diffusion", "turn_close_id": 2}

    def make(model_id: str = "tiny", **options: Any) -> TorchBackend:
        return TorchBackend(reader, tokenizer, TorchOptions(**{**kwargs, **options}), model_id=model_id)

    backend = make()
    options = tuple(Option(f"intent_{k}") for k in range(5))
    requests = [DecisionRequest("q", "Which intent?", options, text, samples=2, seed=k)
                for k, text in enumerate(["my card is lost", "refund please, now"])]
    scores = asyncio.run(backend.read(requests))
    assert [s.options for s in scores] == [requests[0].option_names] * 2
    for s in scores:
        assert abs(sum(s.proba) - 1) < 1e-9 and s.raw["draws"] == 2
    prefixes = {backend.item(r).prefix_ids for r in requests}
    assert len(prefixes) == 1  # one static prefix for both states: one cached encoder pass
    assert backend.item(requests[0]).canvas_ids[backend.item(requests[0]).slot + 1] == 2
    base = backend.fingerprint
    assert make().fingerprint == base
    for change in ({"samples": 4}, {"canvas_length": 32}, {"model_id": "other"},
                   {"preamble": "Pick one."}):
        assert make(**change).fingerprint != base


def test_fused_pass_matches_the_two_pass_read(model: Any) -> None:
    for cached in (True, False):
        fused = DiffusionSlotReader(model, use_prefix_cache=cached)
        assert fused.onepass is not None  # the tiny model ties encoder and decoder weights
        two_pass = TwoPassSlotReader(model, use_prefix_cache=cached)
        for items in ([item((70, 71, 72))], [item((70, 71, 72), draws=3), item((80, 81, 82), seed=4)]):
            for a, b in zip(fused.read(items), two_pass.read(items)):
                np.testing.assert_allclose(a.draws, b.draws, rtol=1e-4, atol=1e-6)
