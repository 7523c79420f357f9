"""Shared fixtures: a private Redis server (never the machine's own), the BANKING77 path, the one
TF-IDF model trained on BANKING77 for the session, and the one stand-in LLM for the session."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from router import parse_lock
from standins.llm import StandinHandle, start_standin

ROOT = Path(__file__).resolve().parent.parent
# Before any test runs: parses on several threads must not meet (router/parse_lock.py says why).
parse_lock.install()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--bench-smoke", action="store_true",
                     help="also run the benchmarks' smoke runs (make bench-smoke)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "bench_smoke: a benchmark's --quick run, minutes long; deselected unless "
                   "--bench-smoke (make bench-smoke) is given")


# The files of a minute or more of CPU, longest first: they run first. ``make test``'s two workers
# take whole files (``--dist loadfile``) in collection order; one of these started last would
# leave the other worker idle while it runs.
LONGEST_FIRST = ("test_doc_blocks.py", "tests/bench/", "reliability/test_fuzz.py",
                 "reliability/test_memory.py", "reliability/test_claim_holder_death.py")


def _longest_first(item: pytest.Item) -> int:
    path = item.path.as_posix()
    return next((i for i, part in enumerate(LONGEST_FIRST) if part in path), len(LONGEST_FIRST))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest files first (``LONGEST_FIRST``; the rest keep their order). ``make test``
    leaves the benchmarks' smoke runs to ``make bench-smoke``: minutes each, and what they
    report is checked, at a small size, by tests that stay."""
    items.sort(key=_longest_first)  # stable
    if config.getoption("--bench-smoke"):
        return
    smoke = [item for item in items if item.get_closest_marker("bench_smoke")]
    if smoke:
        config.hook.pytest_deselected(items=smoke)
        items[:] = [item for item in items if not item.get_closest_marker("bench_smoke")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A redis-server this test session starts on its own port and stops; it keeps nothing on
    disk. Tests may flush it freely: nobody else uses it.

    It never outlives the test process, however that ends: a run stopped by SIGTERM (``timeout
    600 pytest ...``, a cancelled CI job) or SIGKILL runs no fixture teardown, so the kernel sends
    the server SIGTERM when the thread that started it ends (``setpriv --pdeathsig``, util-linux;
    the main thread here: when the test process ends); and ``stop()`` resumes a server a test
    SIGSTOPped before it terminates, then kills it (a SIGTERM stays pending while stopped).
    tests/test_redis_server_cleanup.py checks both."""

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
        # Tied to this process's life where the platform allows (Linux: setpriv, util-linux).
        tie = [setpriv, "--pdeathsig", "TERM", "--"] if (setpriv := shutil.which("setpriv")) \
            and sys.platform.startswith("linux") else []
        self.proc = subprocess.Popen(
            [*tie, self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
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
        self.stop()  # not left running on a port nobody will use
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        """SIGTERM (after SIGCONT: a stopped process holds SIGTERM pending), then SIGKILL if it
        has not exited within 10 s; it is gone when this returns."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


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


@dataclass(frozen=True)
class TrainedModel:
    """A text-model artifact (``slotgate train``'s format) and the labels it was trained on."""

    path: Path
    labels: list[str]


@pytest.fixture(scope="session")
def banking77_model(banking77_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> TrainedModel:
    """The one TF-IDF model the tests share, trained once per session: every sixth row of
    BANKING77's train.csv (~1,700 messages, all 77 intents; a few seconds on 2 cores). Tests
    that need their own artifact file copy or re-save it; none may write to this one."""
    import csv

    from router.backends.sklearn import save_text_model, train_text_model

    with (banking77_dir / "train.csv").open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))[::6]
    texts, labels = [r["text"] for r in rows], [r["category"] for r in rows]
    path = tmp_path_factory.mktemp("banking77-model") / "tfidf.joblib"
    save_text_model(path, train_text_model(texts, labels, kind="tfidf"), kind="tfidf",
                    n_train=len(texts), data_hash="0" * 64)
    return TrainedModel(path, sorted(set(labels)))


@pytest.fixture(scope="session")
def standin() -> Iterator[StandinHandle]:
    """The OpenAI-compatible stand-in LLM (standins/llm.py) on a free loopback port, one per
    session; it records every call and has fault switches (``set_mode``). Every test that uses
    it starts with it reset (``_reset_standin``)."""
    handle = start_standin()
    yield handle
    handle.stop()


@pytest.fixture(autouse=True)
def _reset_standin(request: pytest.FixtureRequest) -> None:
    """A test never sees another test's fault mode or calls on the shared stand-in."""
    if "standin" in request.fixturenames:
        handle = request.getfixturevalue("standin")
        if isinstance(handle, StandinHandle):  # some modules name another stand-in "standin"
            handle.reset()
