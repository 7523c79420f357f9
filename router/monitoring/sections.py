"""Reading back a watch's saved evidence section by section: damage inside a section is
reported under its name (``drift.n``, ``weighted.whole.wealth``), and counts out of step with
what could have fed them are refused."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from calibration.state import DamagedState, field


def section(name: str, resume: Callable[[Any], None], state: dict[str, Any]) -> None:
    """``resume(state[name])``, its damage reported under ``name.``."""
    saved = field(state, name)
    try:
        resume(saved)
    except DamagedState as exc:
        raise DamagedState(f"{name}.{exc}") from exc


def at_most(name: str, value: int, most: int) -> None:
    """Refuse a count past ``most``, what could have fed it."""
    if value > most:
        raise DamagedState(f"{name} must be at most {most} (what it could have counted), "
                           f"got {value}")
