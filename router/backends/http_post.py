"""One JSON POST to a backend server (System One or vLLM), with the retry rules of the protocol
notes: classified by status, never by message text, and translated into ``router.errors`` here.

    400/401/403/404/413/422 (any other 4xx)  -> BackendRejected, never retried; a status listed in
                                                ``caller_statuses`` (System One's 422: the body's
                                                content is refused) -> UnprocessableRequest
    500, 502                                 -> retried ``retries_5xx`` times, then BackendUnavailable
    429, 503, 529                            -> retried after Retry-After while the total wait stays
                                                within ``max_retry_wait_s``, then BackendUnavailable
    504                                      -> BackendTimeout; other 5xx -> BackendUnavailable
    connection refused/reset                 -> BackendUnavailable; httpx timeout -> BackendTimeout
    200 with a body that is not a JSON object -> BackendMalformed
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from router.errors import (
    BackendMalformed,
    BackendRejected,
    BackendTimeout,
    BackendUnavailable,
    UnprocessableRequest,
)
from router.retry_after import retry_after_s

RETRY_AFTER_STATUSES = frozenset({429, 503, 529})
RETRY_SPARINGLY_STATUSES = frozenset({500, 502})
DEFAULT_RETRY_AFTER_S = 1.0  # when a 429/503/529 names no Retry-After


def error_message(response: httpx.Response) -> str:
    """The server's own words from any of the three dialects: ``{"error": {"message"}}`` (example
    server, vLLM), ``{"detail": str | [..] | {..}}`` (OpenJev, Jev, FastAPI), ``{"message"}``
    (older vLLM); else the first 300 bytes of the body."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:300] or f"HTTP {response.status_code}"
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if isinstance(err, str):
            return err
        detail = body.get("detail")
        if isinstance(detail, str):
            return detail
        if isinstance(detail, dict):
            return str(detail.get("message", detail))
        if isinstance(detail, list):
            parts = []
            for item in detail:
                if isinstance(item, dict):
                    loc = ".".join(str(x) for x in item.get("loc", []))
                    parts.append(f"{loc}: {item.get('msg', item)}" if loc else str(item.get("msg")))
                else:
                    parts.append(str(item))
            return "; ".join(parts)
        if "message" in body:
            return str(body["message"])
    return json.dumps(body)[:300]


class JsonPoster:
    """POSTs JSON bodies through one ``httpx.AsyncClient`` under a concurrency cap.

    The cap is an ``asyncio.Semaphore`` held for the whole call including retries' waits, so a
    server without backpressure (the example server) never sees more than ``max_concurrency``
    requests from this router at once.
    """

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str | None = None,
        timeout_s: float = 10.0,
        max_concurrency: int = 8,
        retries_5xx: int = 1,
        retry_backoff_s: float = 0.05,
        max_retry_wait_s: float = 2.0,
        transport: httpx.AsyncBaseTransport | None = None,
        what: str = "backend",
        caller_statuses: frozenset[int] = frozenset(),
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._what = what
        self._caller_statuses = caller_statuses
        self._retries_5xx = retries_5xx
        self._retry_backoff_s = retry_backoff_s
        self._max_retry_wait_s = max_retry_wait_s
        self._semaphore = asyncio.Semaphore(max_concurrency)
        self._client_args: dict[str, Any] = {
            "base_url": base_url.rstrip("/"), "headers": headers,
            "timeout": httpx.Timeout(timeout_s), "transport": transport}
        self._client = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=max_concurrency), **self._client_args)

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """The decoded JSON object of a 200 answer, or a ``BackendError``."""
        async with self._semaphore:
            failures_5xx = 0
            waited_s = 0.0
            while True:
                response = await self._send(path, body)
                status = response.status_code
                if status == 200:
                    return self._decode(response)
                message = f"{self._what} answered {status}: {error_message(response)}"
                if status in RETRY_SPARINGLY_STATUSES:
                    failures_5xx += 1
                    if failures_5xx > self._retries_5xx:
                        raise BackendUnavailable(message)
                    await asyncio.sleep(self._retry_backoff_s * failures_5xx)
                    continue
                if status in RETRY_AFTER_STATUSES:
                    asked_s = retry_after_s(response.headers)
                    wait_s = DEFAULT_RETRY_AFTER_S if asked_s is None else asked_s
                    if waited_s + wait_s > self._max_retry_wait_s:
                        raise BackendUnavailable(
                            f"{message} (Retry-After {wait_s:g} s is past the retry budget)"
                        )
                    waited_s += wait_s
                    await asyncio.sleep(wait_s)
                    continue
                if status == 504:
                    raise BackendTimeout(message)
                if status >= 500:
                    raise BackendUnavailable(message)
                if status in self._caller_statuses:
                    raise UnprocessableRequest(error_message(response))
                raise BackendRejected(message)

    async def _send(self, path: str, body: dict[str, Any]) -> httpx.Response:
        try:
            return await self._client.post(path, json=body)
        except httpx.TimeoutException as exc:
            raise BackendTimeout(f"{self._what} timed out: {exc!r}") from exc
        except httpx.TransportError as exc:
            raise BackendUnavailable(f"{self._what} unreachable: {exc!r}") from exc

    def _decode(self, response: httpx.Response) -> dict[str, Any]:
        try:
            payload = response.json()
        except ValueError as exc:
            raise BackendMalformed(f"{self._what} answered 200 with invalid JSON") from exc
        if not isinstance(payload, dict):
            raise BackendMalformed(f"{self._what} answered 200 with a non-object JSON body")
        return payload

    async def status_of(self, path: str, body: dict[str, Any]) -> int | None:
        """The status a POST of ``body`` gets (readiness probes), None when unreachable."""
        try:
            response = await self._client.post(path, json=body)
        except httpx.HTTPError:
            return None
        return response.status_code

    async def get_ok(self, path: str) -> bool:
        """True when a GET answers 2xx (readiness probes); never raises."""
        try:
            response = await self._client.get(path)
        except httpx.HTTPError:
            return False
        return response.is_success

    async def get_json(self, path: str) -> dict[str, Any] | None:
        """The JSON object a GET answers with 200, None on a 404 (the server has no such
        route), a ``BackendError`` otherwise. A client of its own, closed before it returns, so
        it may run in any event loop (``slotgate serve`` asks before uvicorn's loop starts)."""
        try:
            async with httpx.AsyncClient(**self._client_args) as client:
                response = await client.get(path)
        except httpx.TimeoutException as exc:
            raise BackendTimeout(f"{self._what} timed out: {exc!r}") from exc
        except httpx.TransportError as exc:
            raise BackendUnavailable(f"{self._what} unreachable: {exc!r}") from exc
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise BackendUnavailable(f"{self._what} answered GET {path} with "
                                     f"{response.status_code}: {error_message(response)}")
        return self._decode(response)

    async def aclose(self) -> None:
        await self._client.aclose()


__all__ = ["JsonPoster", "error_message"]
