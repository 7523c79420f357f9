"""Names that moved, kept importable from their old module for one release: each access warns
with ``DeprecationWarning`` naming the new place (``policies.guaranteed``, ``policies.cascade``)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def moved(old: str, names: Mapping[str, tuple[str, str]]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``old`` that serves each of ``names`` (old name ->
    (module, new name)) from its new place, warning."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        module, new = names[name]
        warnings.warn(f"{old}.{name} is deprecated: use {module}.{new}", DeprecationWarning,
                      stacklevel=2)
        return getattr(import_module(module), new)

    return __getattr__
