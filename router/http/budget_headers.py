"""The caller's escalation budget on every response to a decision route: ``X-Slotgate-Budget-
Limit``, ``-Remaining`` (units left in the window, after this request's slow calls) and
``-Reset`` (seconds until the window resets), looked up as the response starts."""

from __future__ import annotations

import math

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from router.store.budgets import KeyBudgets

_DECISION_PATHS = ("/v1/chat/completions", "/v1/systemone")


class BudgetHeaders:
    """Pure ASGI middleware, inside the admission guard (which sets the caller's namespace)."""

    def __init__(self, app: ASGIApp, *, budgets: KeyBudgets, default_namespace: str) -> None:
        self.app = app
        self.budgets = budgets
        self.default_namespace = default_namespace

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in _DECISION_PATHS:
            await self.app(scope, receive, send)
            return
        namespace = scope.get("state", {}).get("namespace") or self.default_namespace

        async def send_with_budget(message: Message) -> None:
            if message["type"] == "http.response.start":
                state = await self.budgets.state(namespace)
                message["headers"] = [*message.get("headers", ()), *(
                    (name.encode(), value.encode()) for name, value in (
                        ("x-slotgate-budget-limit", f"{state.limit:g}"),
                        ("x-slotgate-budget-remaining", f"{state.remaining:g}"),
                        ("x-slotgate-budget-reset", str(math.ceil(state.reset_s)))))]
            await send(message)

        await self.app(scope, receive, send_with_budget)
