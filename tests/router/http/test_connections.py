"""The connection cap of `slotgate serve` under a real uvicorn: with every allowed connection
open and idle (keep-alive clients between requests), a new connection is served, the longest
idle one is closed to make room, and the others keep working."""

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

from router.backends.mock import MockBackend
from router.http.app import create_app
from router.http.server import http_protocol
from router.settings import Settings
from tests.conftest import free_port

CAP = 4
HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: slotgate\r\n\r\n"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    settings = Settings(log={"decision_log_path": tmp_path / "d.jsonl"}, max_connections=CAP)
    port = free_port()
    config = uvicorn.Config(create_app(settings, backend=MockBackend(lambda r: [0.5, 0.5])),
                            host="127.0.0.1", port=port, log_level="warning", loop="asyncio",
                            ws="none", http=http_protocol(settings))
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


def ask(sock: socket.socket) -> bytes:
    """One /healthz request on an open keep-alive connection; the response's status line."""
    sock.sendall(HEALTHZ)
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
