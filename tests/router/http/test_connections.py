"""The connection cap of `slotgate serve` under a real uvicorn: with every allowed connection
open and idle (keep-alive clients between requests), a new connection is served, the longest
idle one is closed to make room, and the others keep working; a connection whose request has
started arriving (half its headers) is never the one closed, with uvicorn's h11 parser or
httptools."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from router.backends.mock import MockBackend
from router.http.app import create_app
from router.http.connections import capped_protocol
from router.http.server import http_protocol
from router.settings import Settings
from tests.conftest import free_port

CAP = 4
HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: slotgate\r\n\r\n"


@pytest.fixture(params=["default", "h11", "httptools"])
def server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    settings = Settings(log={"decision_log_path": tmp_path / "d.jsonl"}, max_connections=CAP)
    port = free_port()
    protocol = http_protocol(settings) if request.param == "default" else capped_protocol(
        H11Protocol if request.param == "h11" else HttpToolsProtocol, CAP)
    config = uvicorn.Config(create_app(settings, backend=MockBackend(lambda r: [0.5, 0.5])),
                            host="127.0.0.1", port=port, log_level="warning", loop="asyncio",
                            ws="none", http=protocol)
    running = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(running.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not running.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    running.should_exit = True
    thread.join(timeout=10)


def ask(sock: socket.socket, request: bytes = HEALTHZ) -> bytes:
    """One /healthz request (or the rest of one) on an open keep-alive connection; the
    response's status line."""
    sock.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data or not data.endswith(b'{"status":"ok"}'):
        chunk = sock.recv(4096)
        if not chunk:
            return b""
        data += chunk
    return data.split(b"\r\n", 1)[0]


def test_a_new_connection_closes_the_longest_idle_one(server: str) -> None:
    port = int(server.rsplit(":", 1)[1])
    idle = []
    for _ in range(CAP):  # every allowed connection open, each idle after one request
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        assert ask(sock) == b"HTTP/1.1 200 OK"
        idle.append(sock)
    try:
        assert httpx.get(f"{server}/healthz", timeout=10).status_code == 200
        assert idle[0].recv(1) == b""  # the longest idle: closed by the server
        for sock in idle[1:]:
            assert ask(sock) == b"HTTP/1.1 200 OK"
    finally:
        for sock in idle:
            sock.close()


def test_a_connection_whose_request_is_arriving_is_never_closed_by_the_cap(server: str) -> None:
    port = int(server.rsplit(":", 1)[1])
    half, rest = HEALTHZ[:25], HEALTHZ[25:]  # "GET /healthz HTTP/1.1\r\nHo" / "st: ..."

    def connect() -> socket.socket:
        return socket.create_connection(("127.0.0.1", port), timeout=10)

    arriving = connect()  # open longest: half its first request's headers sent
    arriving.sendall(half)
    between = connect()  # a keep-alive connection that has sent half its second request
    assert ask(between) == b"HTTP/1.1 200 OK"
    between.sendall(half)
    pipelined = connect()  # half its second request sent with the first, in one write
    assert ask(pipelined, HEALTHZ + half) == b"HTTP/1.1 200 OK"
    idle = connect()  # also a barrier: the server has read the half requests sent before it
    assert ask(idle) == b"HTTP/1.1 200 OK"
    try:
        assert httpx.get(f"{server}/healthz", timeout=10).status_code == 200
        assert idle.recv(1) == b""  # the one with no request arriving, though the newest
        for sock in (arriving, between, pipelined):
            assert ask(sock, rest) == b"HTTP/1.1 200 OK"
    finally:
        for sock in (arriving, between, pipelined, idle):
            sock.close()
