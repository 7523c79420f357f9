"""The deadline of the escalation in progress, carried in a context variable so the slow path
can honour it without every seam passing it along: waiting for a slow-call slot, the call and
its corrective retry all come out of one budget (``slow.timeout_s``), and a wait queue that
cannot make the deadline refuses at once instead of timing out later."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_DEADLINE: ContextVar[float | None] = ContextVar("slotgate_deadline", default=None)


@contextmanager
def deadline_in(seconds: float) -> Iterator[float]:
    """Set the deadline ``seconds`` from now (an earlier one already set wins) for this context
    and the tasks it starts; yields the deadline on the ``time.monotonic`` clock."""
    current = _DEADLINE.get()
    deadline = time.monotonic() + seconds
    if current is not None:
        deadline = min(deadline, current)
    token = _DEADLINE.set(deadline)
    try:
        yield deadline
    finally:
        _DEADLINE.reset(token)


def remaining_s(default: float) -> float:
    """Seconds left before the deadline (never below 0), or ``default`` when none is set."""
    deadline = _DEADLINE.get()
    if deadline is None:
        return default
    return max(0.0, deadline - time.monotonic())
