"""The tests' private redis-server (tests/conftest.py, RedisServer) never outlives the test
process: not when the process is killed before its teardown (SIGTERM from ``timeout``, a
cancelled CI job, SIGKILL), not when a test left it SIGSTOPped. Before, each such run left one
running (two seen after runs had ended, on ports 40985 and 38427). The machine's own Redis
(6379) is never touched: these start and watch servers of their own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, RedisServer

STARTS_ONE = (
    "import sys, time; from pathlib import Path; from tests.conftest import RedisServer; "
    "server = RedisServer(Path(sys.argv[1])); server.start(); "
    "print(server.proc.pid, server.port, flush=True); time.sleep(120)"
)


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) process."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and setpriv: Linux")
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_test_process_killed_before_its_teardown_takes_its_redis_server_along(
        how: signal.Signals, tmp_path: Path) -> None:
    with subprocess.Popen([sys.executable, "-c", STARTS_ONE, str(tmp_path)], cwd=ROOT,
                          stdout=subprocess.PIPE, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}) as owner:
        try:
            assert owner.stdout is not None
            pid_text, port_text = owner.stdout.readline().split()
            pid, port = int(pid_text), int(port_text)
            assert port != 6379
            assert b"redis-server" in Path(f"/proc/{pid}/cmdline").read_bytes()
            owner.send_signal(how)  # no teardown runs: nothing in the owner stops its server
            owner.wait(timeout=10)
            assert gone_within(pid, 5.0), f"redis-server {pid} (port {port}) outlived its owner"
        finally:
            if owner.poll() is None:
                owner.kill()
                owner.wait(timeout=10)

def test_stop_ends_a_server_a_test_left_stopped(tmp_path: Path) -> None:
    """SIGTERM stays pending while a process is stopped: ``stop()`` still ends a stopped server,
    within 5 s, rather than time out and leave it running (and stopped) for good."""
    server = RedisServer(tmp_path)
    server.start()
    assert server.proc is not None
    pid = server.proc.pid
    os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    server.stop()
    assert not alive(pid) and server.proc is None
    assert time.monotonic() - t0 < 5.0
