"""Passthrough to the System One servers of ``systemone`` tiers (docs/proxy.md, "Passthrough to
the System One server").

The vLLM example server answers more than ``/v1/systemone``: plain chat and every other
``/v1/...`` POST go to its vLLM unchanged, and ``GET /v1/models`` lists vLLM's served names. A
request to slotgate whose ``model`` is one of those names is relayed here to that server as the
client sent it (the bytes, streaming included), after slotgate's own admission (API keys, rate
limit, body limits, connection cap) and under a concurrency cap of its own. What comes back
(status, content type, body, ``Retry-After``) is relayed chunk by chunk, never buffered. A relayed
request is no decision: nothing of it is cached or written to the decision log.

Each server's model list is fetched on first need and reused for ``passthrough.models_ttl_s``; a
failed fetch (unreachable, an error status, a body that is not a model list) is kept for
``passthrough.models_retry_s``, said in ``GET /v1/models`` and logged, and names of that server
are not routed to it meanwhile."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncGenerator, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from router.errors import InvalidRequest, PassthroughTimeout, PassthroughUnavailable
from router.routing.backpressure import ConcurrencyLimit
from router.settings import PassthroughSettings, Settings
from router.store.metrics import Metrics

log = logging.getLogger(__name__)
MODELS_TIMEOUT_S = 10.0  # a model list is small: the example server gives vLLM this long too
CONNECT_TIMEOUT_S = 10.0
RELAYED_HEADERS = ("content-type", "content-encoding", "retry-after")  # of its answer, passed on


class ModelNotServed(InvalidRequest):
    """A passthrough request naming a model no System One server lists."""

    status_code = 404
    error_type = "not_found_error"


@dataclass(frozen=True, slots=True)
class ModelList:
    """One server's ``GET /v1/models`` as last fetched: its entries, or why there are none."""

    entries: tuple[dict[str, Any], ...]
    error: str | None
    fetched_at: float  # time.monotonic()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(str(e["id"]) for e in self.entries)


class UpstreamServer:
    """The System One server of one ``systemone`` tier, for relayed requests."""

    def __init__(self, tier: str, url: str, settings: PassthroughSettings, *,
                 limit: ConcurrencyLimit, api_key: str | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.tier = tier
        self.url = url.rstrip("/")
        self.settings = settings
        self._limit = limit
        headers = {"accept-encoding": "identity"}  # bytes relayed as they arrive, undecoded
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"  # the tier's key, never the client's
        self._client = httpx.AsyncClient(
            base_url=self.url, headers=headers, transport=transport,
            timeout=httpx.Timeout(settings.timeout_s, connect=CONNECT_TIMEOUT_S),
            limits=httpx.Limits(max_connections=settings.max_concurrency))
        self._models: ModelList | None = None
        self._fetching = asyncio.Lock()

    async def models(self) -> ModelList:
        """The server's model list, fetched again once it is older than its TTL (a failed
        fetch: ``models_retry_s``); concurrent callers share one fetch."""
        if self._fresh(self._models):
            assert self._models is not None
            return self._models
        async with self._fetching:
            if not self._fresh(self._models):
                self._models = await self._fetch_models()
            assert self._models is not None
            return self._models

    def _fresh(self, known: ModelList | None) -> bool:
        if known is None:
            return False
        ttl_s = self.settings.models_retry_s if known.error else self.settings.models_ttl_s
        return time.monotonic() - known.fetched_at < ttl_s

    async def _fetch_models(self) -> ModelList:
        now = time.monotonic()
        try:
            response = await self._client.get("/v1/models", timeout=MODELS_TIMEOUT_S)
        except httpx.HTTPError as exc:
            return self._failed(f"GET /v1/models failed: {type(exc).__name__}", now)
        if response.status_code != 200:
            return self._failed(f"GET /v1/models answered {response.status_code}", now)
        entries = _model_entries(response.content)
        if entries is None:
            return self._failed("GET /v1/models answered no model list "
                                "({\"data\": [{\"id\": ...}]})", now)
        return ModelList(entries, None, now)

    def _failed(self, error: str, now: float) -> ModelList:
        log.warning("System One server of tier %r (%s): %s; its models are not passed through "
                    "for %.0f s", self.tier, self.url, error, self.settings.models_retry_s)
        return ModelList((), error, now)

    async def relay(self, path: str, body: bytes, content_type: str) -> StreamingResponse:
        """``POST path`` with ``body`` as sent; the server's answer relayed as it arrives. The
        concurrency slot is held until the answer's last byte (or the client leaves)."""
        stack = AsyncExitStack()
        await stack.enter_async_context(self._limit.acquire())
        try:  # a failure or a cancellation (the client left) gives the slot back
            response = await self._send(path, body, content_type)
        except BaseException:
            await stack.aclose()
            raise
        stack.push_async_callback(response.aclose)
        headers = {k: v for k in RELAYED_HEADERS if (v := response.headers.get(k)) is not None}
        headers["x-slotgate-upstream"] = self.tier
        return _Relayed(self._body(response, stack), stack, status_code=response.status_code,
                        headers=headers)

    async def _send(self, path: str, body: bytes, content_type: str) -> httpx.Response:
        request = self._client.build_request(
            "POST", path, content=body, headers={"content-type": content_type})
        try:
            return await self._client.send(request, stream=True)
        except httpx.TimeoutException as exc:
            raise PassthroughTimeout(
                f"the System One server of tier {self.tier!r} did not answer {path} within "
                f"passthrough.timeout_s ({self.settings.timeout_s:g} s)") from exc
        except httpx.HTTPError as exc:
            raise PassthroughUnavailable(
                f"the System One server of tier {self.tier!r} could not be reached for {path}: "
                f"{type(exc).__name__}") from exc

    async def _body(self, response: httpx.Response,
                    stack: AsyncExitStack) -> AsyncGenerator[bytes, None]:
        try:
            async for chunk in response.aiter_raw():
                yield chunk
        except httpx.HTTPError as exc:
            # The status is sent: a stream can only end. An event stream says why first.
            log.warning("relay from tier %r cut: %s", self.tier, type(exc).__name__)
            if response.headers.get("content-type", "").startswith("text/event-stream"):
                error = {"message": f"the System One server of tier {self.tier!r} cut the "
                                    f"stream: {type(exc).__name__}", "type": "upstream_error"}
                yield b"data: " + json.dumps({"error": error}).encode() + b"\n\n"
        finally:
            await stack.aclose()  # on client disconnect too: no upstream connection left open

    async def aclose(self) -> None:
        await self._client.aclose()


class _Relayed(StreamingResponse):
    """A relayed answer whose upstream response and concurrency slot are released as soon as
    sending ends, however it ends: a client that left frees them then, not whenever the abandoned
    body is collected (and also when it left before the body was first read, which closing the
    body alone would not cover: an unstarted generator runs no ``finally``)."""

    def __init__(self, body: AsyncGenerator[bytes, None], held: AsyncExitStack,
                 **kwargs: Any) -> None:
        super().__init__(body, **kwargs)
        self._generator = body
        self._held = held

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._generator.aclose()
            await self._held.aclose()  # a no-op when the body's own finally released it


class Upstreams:
    """The System One servers of every ``systemone`` tier, in tier order: a name two of them
    serve goes to the first."""

    def __init__(self, servers: Sequence[UpstreamServer]) -> None:
        self.servers = list(servers)

    @classmethod
    def from_settings(cls, settings: Settings, metrics: Metrics) -> Upstreams | None:
        """One server per ``systemone`` tier with a URL; None when there is none or
        ``passthrough.enabled`` is false."""
        config = settings.passthrough
        tiers = [t for t in settings.all_tiers if t.kind == "systemone" and t.url]
        if not config.enabled or not tiers:
            return None
        return cls([UpstreamServer(
            t.name, t.url or "", config,
            limit=ConcurrencyLimit(f"passthrough to tier {t.name!r}",
                                   capacity=config.max_concurrency,
                                   max_waiting=settings.max_queue,
                                   on_reject=lambda: metrics.queue_rejected("passthrough")),
            api_key=t.api_key.get_secret_value() if t.api_key else None) for t in tiers])

    async def lists(self) -> list[tuple[UpstreamServer, ModelList]]:
        found = await asyncio.gather(*(server.models() for server in self.servers))
        return list(zip(self.servers, found, strict=True))

    async def serving(self, model: str) -> UpstreamServer | None:
        for server, listed in await self.lists():
            if model in listed.names:
                return server
        return None

    async def problems(self) -> list[str]:
        """Why a server's names are unknown now (one line per failed list)."""
        return [f"tier {server.tier!r}: {listed.error}" for server, listed in await self.lists()
                if listed.error]

    async def aclose(self) -> None:
        for server in self.servers:
            await server.aclose()


def _model_entries(content: bytes) -> tuple[dict[str, Any], ...] | None:
    """The entries of an OpenAI model list (each an object with a string ``id``), or None."""
    try:
        value = json.loads(content)
    except ValueError:
        return None
    data = value.get("data") if isinstance(value, dict) else None
    if not isinstance(data, list) or not all(
            isinstance(e, dict) and isinstance(e.get("id"), str) and e["id"] for e in data):
        return None
    return tuple(data)
