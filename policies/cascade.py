"""Deprecated: a cascade is a ``policies.policy.Policy`` of several tiers. ``CascadePolicy``,
``CascadeOptions``, ``Tier`` and ``TierCost`` stay importable from here for one release, each
access warning with ``DeprecationWarning``."""

from __future__ import annotations

import warnings
from typing import Any

_MOVED = {
    "CascadePolicy": ("policies.policy", "Policy"),
    "CascadeOptions": ("policies.options", "PolicyOptions"),
    "Tier": ("policies.policy", "Tier"),
    "TierCost": ("policies.policy", "TierCost"),
}


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, new = _MOVED[name]
    warnings.warn(f"policies.cascade.{name} is deprecated: use {module}.{new}",
                  DeprecationWarning, stacklevel=2)
    from importlib import import_module

    return getattr(import_module(module), new)
