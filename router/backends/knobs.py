"""The read knobs a System One caller can set (``DecisionRequest.extension``): the wire parser
builds them, the System One backend forwards them upstream; every other part carries them unread."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from policies.types import DecisionRequest, ReadExtension


@dataclass(frozen=True, slots=True)
class SystemOneKnobs(ReadExtension):
    """``samples_auto``: the caller asked for samples "auto" (the server reads once, more when it
    is unsure; a backend that cannot reads ``DecisionRequest.samples`` draws). ``engine``: the
    engine knobs it set (steps, think, chunk_rows, chunk_prompt, auto_max, auto_threshold,
    sequential, and the per-question ``alone``), as (name, value) pairs in the order given."""

    samples_auto: bool = False
    engine: tuple[tuple[str, Any], ...] = ()

    def identity(self) -> dict[str, Any]:
        """A thought budget changes the question: the read answers after a thought."""
        think = dict(self.engine).get("think")
        return {"think": think} if think else {}


NO_KNOBS = SystemOneKnobs()


def systemone_knobs(request: DecisionRequest) -> SystemOneKnobs:
    """The request's System One knobs; none set when it carries none (or another family's)."""
    knobs = request.extension
    return knobs if isinstance(knobs, SystemOneKnobs) else NO_KNOBS
