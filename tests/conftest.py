"""Shared fixtures: a private Redis server (never the machine's own), the BANKING77 path."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from standins.llm import StandinHandle, start_standin

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A redis-server this test session starts on its own port and stops; it keeps nothing on
    disk. Tests may flush it freely: nobody else uses it."""

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError(
                "redis-server is not installed; tests need a real Redis "
                "(Debian: apt-get install -y redis-server; .ci/run does this)"
            )
        self.binary = binary
        self.workdir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """URL of the private Redis, flushed before each test (safe: this session started it)."""
    import redis

    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    return redis_server.url


@pytest.fixture(scope="session")
def banking77_dir() -> Path:
    """BANKING77 from ../shared/data/banking77 (or $SLOTGATE_DATA_DIR); a missing folder fails loudly."""
    path = Path(os.environ.get("SLOTGATE_DATA_DIR", ROOT.parent / "shared/data/banking77"))
    if not (path / "train.csv").is_file():
        pytest.fail(
            f"BANKING77 not found at {path}: set SLOTGATE_DATA_DIR to the folder holding train.csv"
        )
    return path


@pytest.fixture(scope="module")
def standin() -> Iterator[StandinHandle]:
    """The OpenAI-compatible stand-in LLM (standins/llm.py) on a free loopback port, one per
    test module; it records every call and has fault switches (``set_mode``)."""
    handle = start_standin()
    yield handle
    handle.stop()
