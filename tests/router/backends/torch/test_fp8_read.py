"""The one-pass read with FP8 weight copies (fp8.py wired through fused.py): on the CPU the FP8
products run as their emulation, so the wiring is checked here; the CUDA kernels themselves are
checked against that emulation when a reader starts on a GPU (``fp8_problem``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from router.backends.torch.choice import KernelChoice, build_pieces
from router.backends.torch.diffusion import DiffusionSlotReader
from router.backends.torch.fp8 import Fp8Model
from router.backends.torch.fused import OnePass
from tests.router.backends.torch.test_diffusion import PREFIX, tiny_model
from tests.router.backends.torch.test_fused import ITEMS


@pytest.fixture(scope="module")
def model() -> Any:
    return tiny_model(window=8)


def read(model: Any, choice: KernelChoice, fp8: Fp8Model | None) -> Any:
    """(label proba, entropy, mass) of ITEMS by a one pass of ``choice`` with ``fp8`` copies."""
    reader = DiffusionSlotReader(model)  # its prefix cache and tensors; the pass is built here
    onepass = OnePass(model, build_pieces(choice), choice.band, choice.trim_last, fp8)
    with torch.inference_mode():
        kv = onepass.prefix_kv(reader.prefix_cache(PREFIX), len(PREFIX))
        return onepass(kv, reader.prepare_onepass(ITEMS, prefix_len=len(PREFIX)))


def test_fp8_copies_serve_the_read_within_their_rounding(model: Any) -> None:
    bf16 = read(model, KernelChoice(), None)[0].numpy()
    for choice in (KernelChoice(), KernelChoice(rows_moe=True)):
        got = read(model, choice, Fp8Model(model))[0].numpy()
        # e4m3 keeps 3 mantissa bits: the reads move, by far less than a label's probability
        diff = np.abs(got - bf16).max()
        assert 1e-4 < diff < 0.05, diff


def test_the_fp8_read_is_the_same_eager_compiled_trimmed_or_not(model: Any) -> None:
    copies = Fp8Model(model)
    want = read(model, KernelChoice(), copies)[0]
    for choice in (KernelChoice(trim_last=False), KernelChoice(rows_moe=True, merge_op=True),
                   KernelChoice(band=frozenset({"full_attention"}), compiled=True, fuse_cats=True,
                                compile_backend="aot_eager")):
        torch.testing.assert_close(read(model, choice, copies)[0], want, rtol=1e-5, atol=1e-6)


def test_a_reader_asked_for_fp8_where_it_cannot_run_refuses_naming_it(model: Any) -> None:
    from router.errors import ConfigError

    with pytest.raises(ConfigError, match="fp8 cannot serve here: FP8 kernels need CUDA") as info:
        DiffusionSlotReader(model, choice=KernelChoice(fp8="experts"))
    assert info.value.field == "fp8"


def test_the_fp8_option_is_checked_when_settings_load() -> None:
    from pydantic import ValidationError

    from router.backends.torch.options import TorchOptions

    assert TorchOptions(kind="diffusion").fp8 == "off"
    assert TorchOptions(kind="diffusion", fp8="experts").fp8 == "experts"
    with pytest.raises(ValidationError, match="fp8"):
        TorchOptions(kind="diffusion", fp8="all")  # dense FP8 was measured slower and removed
