"""Saved states with fields changed, for the tests that feed damaged checkpoints back."""

from __future__ import annotations

import copy
from typing import Any


def changed(state: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of ``state`` with ``changes`` applied (a dotted name reaches inside:
    ``"drift.wealth"``)."""
    out = copy.deepcopy(state)
    for path, value in changes.items():
        *parents, name = path.split(".")
        target = out
        for parent in parents:
            target = target[parent]
        target[name] = value
    return out
