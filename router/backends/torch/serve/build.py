"""What a torch backend is built from: a LOCAL model folder loaded (``load_model``, its content id
``folder_hash``) and the reader its options name over that model (``make_reader``)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from router.backends.torch.options import TorchOptions
from router.backends.torch.serve.graphs import GraphShapes
from router.backends.torch.serve.reader import SlotReader
from router.errors import ConfigError

MAX_LABELS = 128  # the most labels a read's alphabet holds (so a graph bucket's label slots)


def make_reader(options: TorchOptions, model: Any, tokenizer: Any) -> SlotReader:
    """The reader ``options.kind`` names over ``model``. A diffusion reader of a tied model is the
    one-pass read with its device's kernels (choice.py), compiled (``options.compiled``; default:
    on CUDA) with CUDA graphs of ``GraphShapes.from_options(options)``; of an untied one,
    transformers' two-pass read (two_pass.py)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    if options.kind == "diffusion":
        from router.backends.torch.model.choice import default_choice
        from router.backends.torch.model.joint_streams import weights_shared
        from router.backends.torch.serve.diffusion import DiffusionSlotReader
        from router.backends.torch.serve.two_pass import TwoPassSlotReader

        if not weights_shared(model, attention=False):  # the one pass needs them tied
            return TwoPassSlotReader(model, use_prefix_cache=options.prefix_cache, pad_id=pad,
                                     prefix_cache_entries=options.prefix_cache_entries)
        on_cuda = next(model.parameters()).device.type == "cuda"
        compiled = options.compiled if options.compiled is not None else on_cuda
        choice = default_choice(model, compiled=compiled, split_kv_items=options.split_kv_items,
                                split_kv_chunks=options.split_kv_chunks)
        graphs = GraphShapes.from_options(options, capture=on_cuda, labels=MAX_LABELS) if compiled else None
        return DiffusionSlotReader(model, choice=choice, graphs=graphs,
                                   use_prefix_cache=options.prefix_cache, pad_id=pad,
                                   prefix_cache_entries=options.prefix_cache_entries)
    if options.kind == "causal":
        from router.backends.torch.serve.causal import CausalSlotReader

        return CausalSlotReader(model, pad_id=pad, use_prefix_cache=options.prefix_cache,
                                prefix_cache_entries=options.prefix_cache_entries)
    from router.backends.torch.serve.masked import MaskedSlotReader

    return MaskedSlotReader(model, mask_id=tokenizer.mask_token_id, pad_id=pad)


def load_model(kind: str, path: Path | str, *, device: str = "cpu", dtype: str = "float32",
               gguf_file: str | None = None) -> tuple[Any, Any, str]:
    """(model, tokenizer, model id) from a LOCAL folder; ConfigError when it cannot load."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer

    folder = Path(path)
    if not folder.is_dir():
        raise ConfigError(f"torch backend: model folder {folder} does not exist")
    extra: dict[str, Any] = {"local_files_only": True}
    if gguf_file:
        extra["gguf_file"] = gguf_file
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), **extra)
        model_cls: Any = AutoModelForCausalLM if kind == "causal" else AutoModelForMaskedLM
        if kind == "diffusion":
            from transformers import DiffusionGemmaForBlockDiffusion

            model_cls = DiffusionGemmaForBlockDiffusion
        model: Any = model_cls.from_pretrained(str(folder), dtype=getattr(torch, dtype), **extra)
    except (OSError, ValueError, ImportError, AttributeError) as exc:
        raise ConfigError(f"torch backend: cannot load a {kind} model from {folder}: {exc}") from exc
    return model.to(device).eval(), tokenizer, f"{folder.resolve()}#{folder_hash(folder)}"


def folder_hash(folder: Path) -> str:
    """A cheap content id of a model folder: its config files' bytes and its other files' sizes."""
    digest = hashlib.sha256()
    for file in sorted(p for p in folder.iterdir() if p.is_file()):
        digest.update(file.name.encode())
        if file.suffix == ".json":
            digest.update(file.read_bytes())
        else:
            digest.update(str(file.stat().st_size).encode())
    return digest.hexdigest()[:16]
