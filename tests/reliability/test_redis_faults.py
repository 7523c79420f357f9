"""Fault matrix, Redis: a real redis-server (private, on its own port) is stopped mid-run while a
client keeps sending decisions, then restarted on the same port; or hung (SIGSTOP). No request
fails, /readyz stays 200 and says Redis is down (a 503 would take every replica out of
its load balancer over a cache), cache hits resume by themselves, and every decision and
feedback label that got a 2xx is in the JSONL decision log (Redis here keeps nothing on disk)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Self

import httpx
import pytest

from router.backends.mock import MockBackend
from router.store.decision_log import read_records
from tests.conftest import RedisServer
from tests.reliability.conftest import LiveServer, Switch, answer_of, decision, settings_for


class Traffic:
    """A client thread sending decisions back to back (20 states in a cycle, so repeats hit the
    cache) until stopped; keeps every status, route and decision id."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.results: list[tuple[int, str | None, str | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as http:
            i = 0
            while not self._stop.is_set():
                try:
                    r = http.post("/v1/chat/completions", json=decision(f"sure, lost_card #{i % 20}"))
                    ok = r.status_code == 200
                    self.results.append((r.status_code, answer_of(r)[1] if ok else r.text,
                                         r.json()["slotgate"]["decision_id"] if ok else None))
                except httpx.HTTPError as exc:
                    self.results.append((0, repr(exc), None))
                i += 1
                time.sleep(0.01)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=20)


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis of this test alone: it is stopped and restarted, which no shared one may be."""
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()


def wait_for(predicate, *, within_s: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_redis_stopped_and_restarted_mid_run(redis: RedisServer, tmp_path: Path) -> None:
    settings = settings_for(None, tmp_path, cache={"redis_url": redis.url})
    with LiveServer(settings, backend=MockBackend(Switch())) as server, \
            httpx.Client(base_url=server.url, timeout=10) as http, Traffic(server.url) as traffic:
        assert wait_for(lambda: any(r[1] == "cache" for r in traffic.results), within_s=20)
        assert http.get("/readyz").status_code == 200

        redis.stop()
        n_at_stop = len(traffic.results)
        down = http.get("/readyz")
        assert down.status_code == 200 and down.json()["redis"]["state"] == "down"
        # A decision and its feedback while Redis is down are served and logged all the same.
        during = http.post("/v1/chat/completions", json=decision("sure, lost_card while down"))
        assert during.status_code == 200 and answer_of(during)[1] == "fast"
        decision_id = during.json()["slotgate"]["decision_id"]
        feedback = http.post("/v1/feedback", json={"decision_id": decision_id,
                                                   "label": "lost_card"})
        assert feedback.status_code == 200, feedback.text
        assert wait_for(lambda: len(traffic.results) > n_at_stop + 20, within_s=20)
        routes_while_down = {r[1] for r in traffic.results[n_at_stop + 5:]}
        assert routes_while_down == {"fast"}  # served without the cache

        n_while_down = len(traffic.results) - n_at_stop
        redis.start()  # same port, empty (no persistence)
        t0 = time.monotonic()
        assert wait_for(lambda: http.get("/readyz").json()["redis"]["state"] == "up", within_s=10)
        ready_after_s = time.monotonic() - t0
        n_at_restart = len(traffic.results)
        # Cache use resumes by itself: the cycle of 20 states is cached again and hit.
        assert wait_for(lambda: any(r[1] == "cache" for r in traffic.results[n_at_restart:]),
                        within_s=20)
        cache_errors = server.metric("slotgate_cache_errors_total")

    failed = [r for r in traffic.results if r[0] != 200]
    print(f"redis: {len(traffic.results)} requests ({n_while_down} while Redis was down), "
          f"{len(failed)} failed; /readyz 200 again {ready_after_s:.2f} s after the restart; "
          f"{cache_errors:g} cache errors counted")
    assert failed == [] and len(traffic.results) > 60
    assert cache_errors >= 1  # the outage is visible in metrics
    # Nothing lost: every 2xx decision and the feedback label are in the JSONL log.
    records = list(read_records(settings.log.decision_log_path))
    logged = {r["decision_id"] for r in records if r.get("type") == "decision"}
    served = {r[2] for r in traffic.results} | {decision_id}
    assert served <= logged
    assert any(r.get("type") == "feedback" and r["decision_id"] == decision_id and
               r["label"] == "lost_card" for r in records)


def test_redis_hung_keeps_the_replica_ready_and_answering(redis: RedisServer,
                                                          tmp_path: Path) -> None:
    """Redis stopped with SIGSTOP (a hung host: connections open, nothing answers). Before:
    /readyz 503 while every decision was still answered."""
    settings = settings_for(None, tmp_path, cache={"redis_url": redis.url})
    assert redis.proc is not None
    with LiveServer(settings, backend=MockBackend(Switch())) as server, \
            httpx.Client(base_url=server.url, timeout=10) as http, Traffic(server.url) as traffic:
        assert wait_for(lambda: any(r[1] == "cache" for r in traffic.results), within_s=20)
        os.kill(redis.proc.pid, signal.SIGSTOP)
        try:
            n_at_stop = len(traffic.results)
            t0 = time.monotonic()
            hung = http.get("/readyz")
            probe_s = time.monotonic() - t0
            assert wait_for(lambda: len(traffic.results) > n_at_stop + 20, within_s=30)
            metrics = http.get("/metrics").text
        finally:
            os.kill(redis.proc.pid, signal.SIGCONT)
        assert wait_for(lambda: http.get("/readyz").json()["redis"]["state"] == "up", within_s=10)
    failed = [r for r in traffic.results if r[0] != 200]
    print(f"redis hung: /readyz {hung.status_code} in {probe_s * 1000:.0f} ms, "
          f"{len(traffic.results) - n_at_stop} decisions answered while hung, {len(failed)} failed")
    assert hung.status_code == 200 and hung.json()["redis"]["state"] == "down"
    assert probe_s < 2.0  # the probe does not hang with Redis
    assert "slotgate_redis_up 0.0" in metrics
    assert failed == []
