"""Nothing lost: `slotgate serve` (a real subprocess) is sent SIGTERM while clients keep sending
decisions and feedback. Graceful shutdown drains the requests in flight and flushes the decision
log, so every decision and every feedback label that got a 2xx is in the JSONL log.
(The Redis-restart half of this property is in test_redis_faults.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from router.store.decision_log import read_records
from standins.llm import StandinHandle
from tests.conftest import ROOT, free_port
from tests.reliability.conftest import SECRET, SLOW_MODEL, decision

SERVE = "import sys; from pathlib import Path; from router.http.server import serve; " \
        "serve(config=Path(sys.argv[1]))"
N_CLIENTS = 12
STALL_S = 0.4  # every decision escalates and the stand-in takes this long: many are in flight
MIN_ANSWERED = 20  # decisions answered before SIGTERM


class Client(threading.Thread):
    """Sends decision, then feedback on it, back to back until the server is gone."""

    def __init__(self, url: str, n: int, answered: threading.Semaphore) -> None:
        super().__init__(daemon=True)
        self.url, self.n, self.answered = url, n, answered
        self.decisions: list[tuple[str, float]] = []  # (decision id, time its 200 arrived)
        self.feedback: list[str] = []
        self.failures = 0

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as http:
            i = 0
            while self.failures < 3:
                try:
                    r = http.post("/v1/chat/completions",
                                  json=decision(f"client {self.n} message {i}: lost_card"))
                    if r.status_code != 200:
                        self.failures += 1
                        continue
                    decision_id = r.json()["slotgate"]["decision_id"]
                    self.decisions.append((decision_id, time.monotonic()))
                    self.answered.release()
                    f = http.post("/v1/feedback", json={"decision_id": decision_id,
                                                        "label": "lost_card"})
                    if f.status_code == 200:
                        self.feedback.append(decision_id)
                except httpx.HTTPError:
                    self.failures += 1
                    time.sleep(0.05)
                i += 1


@pytest.mark.long
def test_sigterm_under_load_loses_nothing(fresh_standin: StandinHandle, tmp_path: Path) -> None:
    port = free_port()
    log_path = tmp_path / "decisions.jsonl"
    config = tmp_path / "slotgate.yaml"
    config.write_text(yaml.safe_dump({
        "host": "127.0.0.1", "port": port,
        "fast": {"kind": "mock", "options": {"top_proba": 0.5}},
        "slow": {"model": SLOW_MODEL, "api_base": fresh_standin.api_base, "api_key": SECRET,
                 "timeout_s": 10},
        "policy": {"fallback_threshold": 0.9},
        "log": {"decision_log_path": str(log_path)},
    }))
    stderr_path = tmp_path / "server.log"
    with stderr_path.open("wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-c", SERVE, str(config)], cwd=ROOT,
                                stdout=stderr, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        warm = None
        while time.monotonic() < deadline and warm is None:
            try:  # the first escalation also imports litellm: wait for it before the load
                warm = httpx.post(f"{url}/v1/chat/completions", json=decision("warm: lost_card"),
                                  timeout=120)
            except httpx.TransportError:
                assert proc.poll() is None, stderr_path.read_text()
                time.sleep(0.2)
        assert warm is not None and warm.status_code == 200
        fresh_standin.set_mode("stall", stall_s=STALL_S)
        answered = threading.Semaphore(0)  # released once per decision answered
        clients = [Client(url, n, answered) for n in range(N_CLIENTS)]
        for c in clients:
            c.start()
        for _ in range(MIN_ANSWERED):  # under load: SIGTERM meets the next ones in flight
            assert answered.acquire(timeout=60), "the load never got going"
        sigterm_at = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        # uvicorn re-raises SIGTERM once it has shut down cleanly, hence -15 rather than 0.
        assert proc.wait(timeout=40) in (0, -signal.SIGTERM), stderr_path.read_text()[-3000:]
        for c in clients:
            c.join(timeout=40)
    finally:
        fresh_standin.set_mode("ok")
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    decided = [d for c in clients for d in c.decisions]
    answered_ids = {d for d, _ in decided}
    drained = [d for d, t in decided if t > sigterm_at]
    feedback_ids = [d for c in clients for d in c.feedback]
    records = list(read_records(log_path))
    logged = {r["decision_id"] for r in records if r.get("type") == "decision"}
    labelled = {r["decision_id"] for r in records if r.get("type") == "feedback"}
    print(f"sigterm: {len(decided)} decisions and {len(feedback_ids)} labels got 2xx "
          f"({len(drained)} answered after SIGTERM: drained); {len(logged)} decisions and "
          f"{len(labelled)} labels in the log")
    assert len(decided) >= MIN_ANSWERED and len(drained) >= 1  # requests really were in flight at SIGTERM
    assert answered_ids - logged == set()
    assert set(feedback_ids) - labelled == set()
    server_log = stderr_path.read_text()
    assert "Application shutdown complete" in server_log
    assert "shutdown with decisions still in flight" not in server_log
