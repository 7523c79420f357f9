"""AdmissionGuard on its own, as the pure ASGI middleware it is: API keys (401 naming
``authorization``; each key its own cache namespace; probes open), the body limit (413 by
Content-Length and while streaming, before the app runs), the per-key rate limit (429), the
status counter, and a client that leaves mid-body getting no answer at all."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from starlette.types import Message, Receive, Scope, Send

from router.errors import SlotgateError
from router.http.admission import AdmissionGuard
from router.http.ratelimit import TokenBuckets

KEY = "client-key-0123456789"
HASHES = [hashlib.sha256(KEY.encode()).hexdigest()]


class App:
    """The app behind the guard: records what reached it (namespace, body) and answers 200."""

    def __init__(self) -> None:
        self.seen: list[tuple[str | None, bytes]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.seen.append((scope.get("state", {}).get("namespace"), body))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def send_error(scope: Scope, send: Send, exc: SlotgateError) -> None:
    await send({"type": "http.response.start", "status": exc.status_code, "headers": []})
    await send({"type": "http.response.body", "body": f"{exc.field}: {exc.message}".encode()})


def guard(app: App, **options: Any) -> tuple[AdmissionGuard, list[tuple[str, int]]]:
    statuses: list[tuple[str, int]] = []
    settings: dict[str, Any] = {"api_key_hashes": HASHES, "default_namespace": "default",
                                "max_body_bytes": 100, **options}
    return AdmissionGuard(app, send_error=send_error,
                          on_status=lambda path, status: statuses.append((path, status)),
                          **settings), statuses


async def call(middleware: AdmissionGuard, *, path: str = "/v1/chat/completions",
               method: str = "POST", key: str | None = KEY, chunks: list[bytes] | None = None,
               content_length: int | None = None, disconnect: bool = False) -> list[Message]:
    headers = []
    if key is not None:
        headers.append((b"authorization", f"Bearer {key}".encode()))
    if content_length is not None:
        headers.append((b"content-length", str(content_length).encode()))
    parts = list(chunks if chunks is not None else [b"{}"])
    incoming: list[Message] = [
        {"type": "http.request", "body": part, "more_body": i < len(parts) - 1}
        for i, part in enumerate(parts)]
    if disconnect:
        incoming[-1] = {"type": "http.disconnect"}

    async def receive() -> Message:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "path": path, "method": method, "headers": headers}
    await middleware(scope, receive, send)
    return sent


def status(sent: list[Message]) -> int:
    return int(sent[0]["status"])


def text(sent: list[Message]) -> str:
    return b"".join(m.get("body", b"") for m in sent[1:]).decode()


async def test_a_valid_key_gets_through_with_its_own_namespace() -> None:
    app = App()
    middleware, statuses = guard(app)
    sent = await call(middleware, chunks=[b'{"a":', b" 1}"])
    assert status(sent) == 200
    [(namespace, body)] = app.seen
    assert namespace == f"key-{hashlib.sha256(KEY.encode()).hexdigest()[:16]}"
    assert body == b'{"a": 1}'  # the body the guard read is replayed to the app, whole
    assert statuses == [("/v1/chat/completions", 200)]


@pytest.mark.parametrize(("key", "says"), [(None, "missing API key"),
                                            ("wrong-key-0123456789", "invalid API key")])
async def test_missing_or_wrong_keys_are_401_naming_authorization(key: str | None,
                                                                  says: str) -> None:
    app = App()
    middleware, statuses = guard(app)
    sent = await call(middleware, key=key)
    assert status(sent) == 401 and text(sent).startswith("authorization: ") and says in text(sent)
    assert app.seen == [] and statuses == [("/v1/chat/completions", 401)]


async def test_probes_need_no_key_and_without_keys_everyone_shares_the_default() -> None:
    app = App()
    middleware, _ = guard(app)
    assert status(await call(middleware, path="/readyz", method="GET", key=None)) == 200
    open_guard, _ = guard(app, api_key_hashes=[])
    assert status(await call(open_guard, key=None)) == 200
    assert [namespace for namespace, _ in app.seen] == ["default", "default"]


async def test_bodies_over_the_limit_are_413_before_the_app_runs() -> None:
    app = App()
    middleware, _ = guard(app)
    declared = await call(middleware, content_length=101, chunks=[b"x"])
    streamed = await call(middleware, chunks=[b"x" * 60, b"x" * 41])
    for sent in (declared, streamed):
        assert status(sent) == 413 and text(sent).startswith("body: ")
    assert app.seen == []
    assert status(await call(middleware, chunks=[b"x" * 50, b"x" * 50])) == 200  # exactly 100


async def test_the_rate_limit_is_per_key_and_never_on_probes() -> None:
    app = App()
    middleware, _ = guard(app, rate_limit=TokenBuckets(rate_rps=0.001, burst=2))
    codes = [status(await call(middleware)) for _ in range(3)]
    assert codes == [200, 200, 429]
    assert status(await call(middleware, path="/healthz", method="GET")) == 200


async def test_a_client_gone_mid_body_gets_no_answer_and_the_app_never_runs() -> None:
    app = App()
    middleware, statuses = guard(app)
    sent = await call(middleware, chunks=[b"x" * 10, b"x" * 10], disconnect=True)
    assert sent == [] and app.seen == [] and statuses == []
