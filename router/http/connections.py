"""The connection cap of ``slotgate serve``: past ``max_connections`` open connections, a new one
closes the connection that has been idle longest (a keep-alive connection between requests, or
one that never sent a byte), so idle clients can never use up the process's file descriptors
and lock out new requests and health checks. A connection is idle from the moment its last
response is complete (or it opened) until the first byte of its next request arrives: one
whose request is still arriving (half its headers, a slow body) is never closed by the cap. With
none idle, the new connection is closed.

uvicorn has no such cap (its ``limit_concurrency`` answers 503 to new requests once connections
*or* tasks reach it, idle ones included: the health check is refused too). This is its HTTP
protocol class, subclassed: the one place that knows about uvicorn's connection internals."""

from __future__ import annotations

import asyncio
import logging
import resource
from typing import Any

log = logging.getLogger("slotgate")
FD_RESERVE = 128  # descriptors kept for the decision log, Redis, upstream calls and imports


def default_max_connections() -> int:
    """The process's open-file limit less ``FD_RESERVE`` (at least 64)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 65_536
    return max(64, soft - FD_RESERVE)


def capped_protocol(base: type[asyncio.Protocol], max_connections: int) -> type[asyncio.Protocol]:
    """``base`` (uvicorn's h11 or httptools protocol) with the connection cap."""

    class CappedProtocol(base):  # type: ignore[valid-type, misc]
        idle_since: float
        receiving = False  # a request's bytes have arrived and its response is not complete
        requests_begun = 0  # httptools: requests whose first bytes it parsed
        requests_answered = 0

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self.idle_since = self.loop.time()
            if len(self.connections) > max_connections:
                _make_room(self, self.connections)

        def data_received(self, data: bytes) -> None:
            self.receiving = True
            super().data_received(data)

        def on_message_begin(self) -> None:  # called by httptools only
            self.requests_begun += 1
            super().on_message_begin()

        def on_response_complete(self) -> None:
            self.idle_since = self.loop.time()
            self.requests_answered += 1
            super().on_response_complete()
            self.receiving = _holds_next_request(self)

    CappedProtocol.__name__ = f"Capped{base.__name__}"
    return CappedProtocol


def _holds_next_request(protocol: Any) -> bool:
    """Whether bytes of a request after the one just answered were read already (pipelined)."""
    conn = getattr(protocol, "conn", None)
    if conn is None:  # httptools
        return bool(protocol.requests_begun > protocol.requests_answered)
    import h11

    # h11: bytes not parsed into a request yet, or a request it parsed and has not answered
    return bool(conn.trailing_data[0]) or conn.their_state is not h11.IDLE


def _idle(protocol: Any) -> bool:
    cycle = getattr(protocol, "cycle", None)
    return not protocol.receiving and (cycle is None or bool(cycle.response_complete))


def _make_room(new: Any, connections: set[Any]) -> None:
    idle = [c for c in connections if c is not new and _idle(c) and not c.transport.is_closing()]
    victim = min(idle, key=lambda c: c.idle_since, default=None)
    if victim is None:
        log.warning("connection cap reached (%d open, none idle): new connection closed",
                    len(connections))
        victim = new
    victim.transport.close()
