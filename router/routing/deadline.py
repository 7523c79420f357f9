"""The deadline of the escalation in progress, carried in a context variable so the slow path
can honour it without every seam passing it along: waiting for a slow-call slot, the call and
its corrective retry all come out of one budget (``slow.timeout_s``), and a wait queue that
cannot make the deadline refuses at once instead of timing out later.

The deadline also carries the queue's refusal when a wait for a slot ran out with it. A wait
normally ends at the deadline with the queue's own 429, but the backstops a little past it (the
slow path's and the escalation's timeouts) can expire in the same turn of a lagging event loop,
and then the outermost one ends the wait. The layers that turn a timeout into a 504 look here
first: a request that never got a slot is refused (429 + Retry-After), not timed out."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from router.errors import TooManyRequests


@dataclass(slots=True)
class Deadline:
    at: float  # on the time.monotonic clock
    refusal: TooManyRequests | None = None  # set once a wait for a slot ran out with the deadline
    outer: Deadline | None = None  # the deadline this one was set inside (an earlier one wins)


_DEADLINE: ContextVar[Deadline | None] = ContextVar("slotgate_deadline", default=None)


@contextmanager
def deadline_in(seconds: float) -> Iterator[Deadline]:
    """Set the deadline ``seconds`` from now (an earlier one already set wins) for this context
    and the tasks it starts (they share the one ``Deadline``: a refusal noted in a task the
    escalation started is seen by the escalation)."""
    outer = _DEADLINE.get()
    at = time.monotonic() + seconds
    if outer is not None:
        at = min(at, outer.at)
    deadline = Deadline(at, outer=outer)
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
    return max(0.0, deadline.at - time.monotonic())


def note_refusal(refusal: TooManyRequests) -> None:
    """Record that the wait for a slot ran out with the deadline (the first refusal is kept),
    on the deadline in force and every deadline it was set inside."""
    deadline = _DEADLINE.get()
    while deadline is not None:
        if deadline.refusal is None:
            deadline.refusal = refusal
        deadline = deadline.outer


def queue_refusal() -> TooManyRequests | None:
    """The queue's refusal noted on the deadline in force, if its wait ran out with it."""
    deadline = _DEADLINE.get()
    return None if deadline is None else deadline.refusal
