"""`slotgate serve` as a person runs it: a subprocess with a YAML config, answering on loopback,
saying at start-up that escalation is unavailable, and exiting cleanly on SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from tests.conftest import free_port
from tests.live import wait_until_up

ROOT = Path(__file__).resolve().parents[2]


def test_serve_runs_the_config_and_stops_on_sigterm(tmp_path: Path) -> None:
    config = tmp_path / "slotgate.yaml"
    log_path = tmp_path / "decisions.jsonl"
    config.write_text(
        "fast:\n  kind: mock\n  options: {top_proba: 0.95}\n"
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
