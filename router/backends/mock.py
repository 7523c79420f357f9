"""A fast backend that asks a handler callable: for tests and demos, no network, no model."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from policies.types import DecisionRequest, OptionScores
from router.backends.base import FastBackend
from router.errors import BackendMalformed

Handler = Callable[[DecisionRequest], "Sequence[float] | Awaitable[Sequence[float]]"]


class MockBackend(FastBackend):
    """Calls ``handler(request)`` for each request; it returns one probability per option
    (sync or async). Exceptions from the handler propagate as they are, so tests can raise
    ``BackendError`` subclasses to simulate failures."""

    name = "mock"

    def __init__(self, handler: Handler, *, label: str = "mock") -> None:
        self._handler = handler
        self._label = label

    def identity(self) -> Mapping[str, Any]:
        return {"backend": self.name, "label": self._label}

    async def read(self, requests: Sequence[DecisionRequest]) -> list[OptionScores]:
        out = []
        for request in requests:
            result = self._handler(request)
            if inspect.isawaitable(result):
                result = await result
            proba = tuple(float(p) for p in result)
            try:
                out.append(OptionScores(request.option_names, proba))
            except ValueError as exc:
                raise BackendMalformed(f"mock handler returned a bad read: {exc}") from exc
        return out
