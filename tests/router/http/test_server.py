"""`slotgate serve` as a person runs it: a subprocess with a YAML config, answering on loopback,
saying at start-up that escalation is unavailable, and exiting cleanly on SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from router.settings import Settings
from tests.conftest import free_port
from tests.live import wait_until_up

ROOT = Path(__file__).resolve().parents[2]


def test_serve_runs_the_config_and_stops_on_sigterm(tmp_path: Path) -> None:
    config = tmp_path / "slotgate.yaml"
    log_path = tmp_path / "decisions.jsonl"
    config.write_text(
        "fast:\n  kind: mock\n  options: {top_proba: 0.95}\n"
        "policy:\n  fallback_threshold: 0.9\n"  # no policy file: the fallback bar routes
        f"log:\n  decision_log_path: {log_path}\n")
    port = free_port()
    exe = Path(sys.executable).parent / "slotgate"
    env = {"PATH": str(Path(sys.executable).parent), "HOME": str(tmp_path)}  # no SLOTGATE_* leak
    proc = subprocess.Popen([str(exe), "serve", "--config", str(config), "--port", str(port)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_up(url, proc)
        body = {"model": "m", "guided_choice": ["yes", "no"],
                "messages": [{"role": "user", "content": "is it on?"}]}
        answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=10)
    finally:
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
    assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"] == "yes"
    assert answer.json()["slotgate"]["route"] == "fast"  # 0.95 clears the 0.9 fallback bar
    # A graceful stop: the lifespan shut down (log flushed); uvicorn then re-raises SIGTERM.
    assert "Application shutdown complete" in output and proc.returncode in (0, -signal.SIGTERM)
    assert "ESCALATION UNAVAILABLE" in output and "slow model NONE" in output
    [record] = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert record["answer"] == "yes" and record["policy_id"] == "fallback"


def test_serve_keeps_idle_connections_for_keep_alive_s_longer_than_client_pools(
        tmp_path: Path) -> None:
    """A server that closes an idle connection when the client's pool expires it (uvicorn's
    own default and httpx's expiry are both 5 s) races the client reusing it, which gets a
    ReadError with nothing in the server's log. `serve` keeps idle connections for keep_alive_s
    (default 75 s, past every client pool's expiry). Here it is set to 1 s: a reused connection
    answers, and the server closes it once keep_alive_s has passed, not at uvicorn's own 5 s
    (the close itself is awaited, not slept through)."""
    import socket

    assert Settings().keep_alive_s > httpx.Limits().keepalive_expiry  # type: ignore[operator]
    keep_alive_s = 1
    config = tmp_path / "slotgate.yaml"
    config.write_text(f"keep_alive_s: {keep_alive_s}\nfast:\n  kind: mock\n"
                      f"log:\n  decision_log_path: {tmp_path / 'decisions.jsonl'}\n")
    port = free_port()
    exe = Path(sys.executable).parent / "slotgate"
    env = {"PATH": str(Path(sys.executable).parent), "HOME": str(tmp_path)}
    proc = subprocess.Popen([str(exe), "serve", "--config", str(config), "--port", str(port)],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    request = f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    try:
        wait_until_up(f"http://127.0.0.1:{port}", proc)
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
            conn.sendall(request)
            first = read_response(conn)
            conn.sendall(request)  # reused at once: still open
            second = read_response(conn)
            idle_from = time.monotonic()
            closed = conn.recv(1)  # returns when the server closes the idle connection
            idle_s = time.monotonic() - idle_from
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert first.startswith(b"HTTP/1.1 200") and second.startswith(b"HTTP/1.1 200"), second
    assert closed == b"" and keep_alive_s - 0.5 <= idle_s < 4.0, idle_s


def read_response(conn: object) -> bytes:
    """One whole HTTP/1.1 response with a Content-Length body (b"" if the server closed)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)  # type: ignore[attr-defined]
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                  if line.startswith(b"content-length:"))
    while len(body) < length:
        body += conn.recv(4096)  # type: ignore[attr-defined]
    return head + b"\r\n\r\n" + body
