"""standins/harness.py: a stand-in stops at once (with socketserver's default poll, its serving
thread notices shutdown only every 0.5 s, paid by every test that uses one)."""

from __future__ import annotations

import time

import httpx

from standins.harness import Reply, StandinServer


class Echo(StandinServer):
    def handle(self, method: str, path: str, body: bytes) -> Reply:
        return Reply(200, {"path": path})


def test_a_standin_answers_then_stops_at_once() -> None:
    server = Echo().start()
    assert httpx.post(f"{server.url}/v1/x", json={}, timeout=5).json() == {"path": "/v1/x"}
    time.sleep(0.1)  # the serving thread is now inside its poll wait
    t0 = time.perf_counter()
    server.stop()
    assert time.perf_counter() - t0 < 0.2
