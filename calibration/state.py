"""Reading back the evidence a monitor saved (``state()`` -> JSON -> ``resume``): each value is
checked for its type and range before it is taken, and a bad one is refused naming its field, so
a damaged or hand-edited checkpoint is never resumed into a state that cannot be saved again."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


class DamagedState(ValueError):
    """A saved state that no run could have written; the message names the field."""


# JSON numbers are doubles: a count above 2^53 was never written by a monitor.
MAX_COUNT = 2**53


def field(state: Any, name: str) -> Any:
    """``state[name]``, with a DamagedState naming the field when it is missing."""
    if not isinstance(state, Mapping):
        raise DamagedState(f"{name}: expected in a JSON object, got {type(state).__name__}")
    if name not in state:
        raise DamagedState(f"{name}: missing")
    return state[name]


def number(state: Any, name: str, *, low: float = -math.inf, high: float = math.inf) -> float:
    """A finite number in [low, high] (no string, no boolean, no NaN or infinity)."""
    return number_value(field(state, name), name, low=low, high=high)


def number_value(value: Any, name: str, *, low: float = -math.inf,
                 high: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DamagedState(f"{name} must be a number, got {value!r}")
    result = float(value)
    if not math.isfinite(result) or not low <= result <= high:
        raise DamagedState(f"{name} must be a finite number in [{low:g}, {high:g}], got {value!r}")
    return result


def count(state: Any, name: str, *, low: int = 0, high: int = MAX_COUNT) -> int:
    """A whole number in [low, high]."""
    value = field(state, name)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise DamagedState(f"{name} must be a whole number in [{low}, {high}], got {value!r}")
    return value


def optional_count(state: Any, name: str, *, low: int = 0, high: int = MAX_COUNT) -> int | None:
    """None, or a whole number in [low, high]."""
    return None if field(state, name) is None else count(state, name, low=low, high=high)


def numbers(state: Any, name: str, *, length: int, low: float = -math.inf) -> list[float]:
    """A list of ``length`` finite numbers, each at least ``low``."""
    values = field(state, name)
    if not isinstance(values, list) or len(values) != length:
        raise DamagedState(f"{name} must be a list of {length} numbers, got {values!r}")
    return [number_value(v, name, low=low) for v in values]
