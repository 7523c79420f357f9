"""The first seconds of a real `slotgate serve` process: litellm is imported
in the background then, and neither an escalation nor a shutdown in that window may hurt. A
fresh interpreter per test (litellm not yet imported), the stand-in LLM as the slow model."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from standins.llm import StandinHandle
from tests.conftest import ROOT, free_port
from tests.live import wait_until_up
from tests.reliability.conftest import SECRET, SLOW_MODEL, decision

SERVE = ("import sys; from pathlib import Path; from router.http.server import serve; "
         "serve(config=Path(sys.argv[1]))")
FAILED_SHUTDOWN = ("KeyError", "Application shutdown failed", "Traceback")


def write_config(tmp_path: Path, standin: StandinHandle, port: int) -> Path:
    config = tmp_path / "slotgate.yaml"
    config.write_text(json.dumps({
        "port": port, "fast": {"kind": "mock", "options": {"top_proba": 0.5}},
        "slow": {"model": SLOW_MODEL, "api_base": standin.api_base, "api_key": SECRET,
                 "timeout_s": 120},  # the first call waits for the import (seconds; more on a loaded machine)
        "policy": {"fallback_threshold": 0.9},
        "log": {"decision_log_path": str(tmp_path / "decisions.jsonl")}}))
    return config


@pytest.fixture
def started(fresh_standin: StandinHandle, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A `slotgate serve` process, returned as soon as /healthz answers (litellm still importing)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", SERVE, str(write_config(tmp_path, fresh_standin, port))],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    url = f"http://127.0.0.1:{port}"
    wait_until_up(url, proc, output=lambda: proc.communicate()[0])
    try:
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_an_early_escalation_does_not_block_healthz(
    started: tuple[subprocess.Popen[str], str]
) -> None:
    _, url = started
    replies: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: replies.append(httpx.post(
        f"{url}/v1/chat/completions", json=decision("my lost_card, first thing"), timeout=150)))
    t0 = time.monotonic()
    thread.start()
    healthz_s = []
    while thread.is_alive():
        h0 = time.perf_counter()
        assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200
        healthz_s.append(time.perf_counter() - h0)
        time.sleep(0.05)
    escalation_s = time.monotonic() - t0
    [reply] = replies
    assert reply.status_code == 200, reply.text
    assert reply.json()["slotgate"]["route"] == "slow"
    print(f"\nfirst escalation {escalation_s:.2f} s (litellm imported meanwhile); /healthz "
          f"polled {len(healthz_s)} times, max {max(healthz_s):.3f} s")
    # Blocked by the import, /healthz would wait about as long as the escalation itself. Brief
    # pauses remain (the start-up heap is collected and frozen once litellm is in: ~0.25 s of
    # CPU, router/http/startup_freeze.py), longer on a loaded machine, where the import is slower
    # too.
    assert max(healthz_s) < max(1.0, escalation_s / 4)


def test_sigterm_while_litellm_imports_shuts_down_cleanly(
    started: tuple[subprocess.Popen[str], str]
) -> None:
    proc, _ = started
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode in (0, -signal.SIGTERM), output
    assert not any(text in output for text in FAILED_SHUTDOWN), output


def test_a_failed_port_bind_shuts_down_cleanly(fresh_standin: StandinHandle, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([sys.executable, "-c", SERVE,
                                 str(write_config(tmp_path, fresh_standin, port))],
                                cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "address already in use" in output.lower(), output
    assert not any(text in output for text in FAILED_SHUTDOWN), output
