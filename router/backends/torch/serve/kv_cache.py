"""KV-cache plumbing shared by the torch readers (diffusion, fused, causal): which keyword a
transformers version takes the cache under, and cache views over shared prefix tensors."""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from typing import Any


def cache_kwarg(function: Callable[..., Any]) -> str:
    """transformers 5.17 names the KV cache ``past_key_values``; later versions ``cache``."""
    return "cache" if "cache" in inspect.signature(function).parameters else "past_key_values"


def fork_cache(cache: Any, batch: int) -> Any:
    """A new cache object over the same prefix tensors, expanded to ``batch`` rows. Encoder
    updates reassign (torch.cat) rather than write in place, so the shared prefix never changes."""
    fork = copy.copy(cache)
    fork.layers = []
    for layer in cache.layers:
        twin = copy.copy(layer)
        if getattr(layer, "is_initialized", False):
            twin.keys = layer.keys.expand(batch, -1, -1, -1)
            twin.values = layer.values.expand(batch, -1, -1, -1)
        fork.layers.append(twin)
    return fork


def select_cache_rows(cache: Any, rows: Any) -> Any:
    """A cache whose row r is ``cache`` row ``rows[r]`` (one per noise draw)."""
    fork = copy.copy(cache)
    fork.layers = []
    for layer in cache.layers:
        twin = copy.copy(layer)
        if getattr(layer, "is_initialized", False):
            twin.keys = layer.keys.index_select(0, rows)
            twin.values = layer.values.index_select(0, rows)
        fork.layers.append(twin)
    return fork
