"""The ASGI gate in front of every route: client API keys (sha256 hashes, constant-time compare,
per-key cache namespace), an optional per-key rate limit, the request body size limit and its
JSON nesting limit (router/http/text_guard.py), all checked before any route parses the body."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Sequence
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from router.errors import InvalidRequest, PayloadTooLarge, SlotgateError, Unauthorized
from router.http.operator.sessions import PREFIX
from router.http.ratelimit import TokenBuckets
from router.http.text_guard import depth_message, too_deep_field

ErrorSender = Callable[[Scope, Send, SlotgateError], Any]  # async (scope, send, exc) -> None
StatusCounter = Callable[[str, int], None]  # (path, status) -> None, for metrics
_OPEN_PATHS = ("/healthz", "/readyz", "/metrics")  # probes and scrapes carry no client key


class AdmissionGuard:
    """Pure ASGI middleware (not BaseHTTPMiddleware) so streamed responses are never buffered."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        api_key_hashes: Sequence[str],
        default_namespace: str,
        max_body_bytes: int,
        send_error: ErrorSender,
        on_status: StatusCounter | None = None,
        rate_limit: TokenBuckets | None = None,
    ) -> None:
        self.app = app
        self.api_key_hashes = [bytes.fromhex(h) for h in api_key_hashes]
        self.default_namespace = default_namespace
        self.max_body_bytes = max_body_bytes
        self.send_error = send_error
        self.on_status = on_status
        self.rate_limit = rate_limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.on_status is not None:
            send = _counting(send, scope["path"], self.on_status)
        try:
            namespace = self._namespace(scope)
            if self.rate_limit is not None and scope["path"] not in _OPEN_PATHS:
                await self.rate_limit.acquire(namespace)
            receive = await self._bounded_body(scope, receive)
        except SlotgateError as exc:
            await self.send_error(scope, send, exc)
            return
        except _ClientGone:
            return
        scope.setdefault("state", {})["namespace"] = namespace
        await self.app(scope, receive, send)

    def _namespace(self, scope: Scope) -> str:
        """The cache namespace of the caller; raises Unauthorized when keys are configured and
        the request carries none of them."""
        path = scope["path"]
        # The operator page checks its own admin key and session (router/http/operator/).
        if (not self.api_key_hashes or path in _OPEN_PATHS or path == PREFIX
                or path.startswith(f"{PREFIX}/")):
            return self.default_namespace
        key = _bearer(scope)
        if key is None:
            raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'",
                               field="authorization")
        digest = hashlib.sha256(key.encode()).digest()
        # Compare against every hash, so the time taken does not say which one (or none) matched.
        matched = [hmac.compare_digest(digest, h) for h in self.api_key_hashes]
        if not any(matched):
            raise Unauthorized("invalid API key", field="authorization")
        return f"key-{digest.hex()[:16]}"

    async def _bounded_body(self, scope: Scope, receive: Receive) -> Receive:
        """Reads the whole body (at most ``max_body_bytes``, JSON nested at most MAX_JSON_DEPTH
        levels) and returns a receive that replays it."""
        limit = self.max_body_bytes
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                raise PayloadTooLarge(
                    f"body: {int(value)} bytes is over the limit of {limit} bytes", field="body")
        if scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            return receive
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"body: over the limit of {limit} bytes", field="body")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        field = too_deep_field(body)
        if field is not None:
            raise InvalidRequest(depth_message(field), field=field)
        replay: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

        async def replaying_receive() -> Message:
            # After the body, the app's next receive waits for the client to disconnect.
            return replay.pop() if replay else await receive()

        return replaying_receive


def _counting(send: Send, path: str, on_status: StatusCounter) -> Send:
    async def counting_send(message: Message) -> None:
        if message["type"] == "http.response.start":
            on_status(path, int(message["status"]))
        await send(message)

    return counting_send


class _ClientGone(Exception):
    """The client disconnected while sending its body: nobody is left to answer."""


def _bearer(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = bytes(value).decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return str(token.strip())
    return None
