"""Deprecated: the one-tier policy is ``policies.policy.Policy``, which serves one to n tiers.
``GuaranteedPolicy`` and the option models stay importable from here for one release, each
access warning with ``DeprecationWarning``."""

from __future__ import annotations

import warnings
from typing import Any

_MOVED = {
    "GuaranteedPolicy": ("policies.policy", "Policy"),
    "TuneOptions": ("policies.options", "PolicyOptions"),
    "GuaranteeOptions": ("policies.options", "PolicyOptions"),
    "answer_confidence": ("policies.fitting", "answer_confidence"),
    "split_rows": ("policies.fitting", "split_rows"),
}


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, new = _MOVED[name]
    warnings.warn(f"policies.guaranteed.{name} is deprecated: use {module}.{new}",
                  DeprecationWarning, stacklevel=2)
    from importlib import import_module

    return getattr(import_module(module), new)
