"""Single flight across replicas when the claim holder dies: two replicas on one private Redis,
replica A a real `slotgate serve` process (the one killed), replica B the app under uvicorn in
this process. Replica A claims a question and calls a slow model that never answers; replica
B's identical escalations wait on A's claim; A is SIGKILLed.
The claim is short (cache.claim_ttl_s, 3 s) and renewed by its holder's heartbeat: it lapses
within 3 s of A's death, one of B's waiters claims it and calls, and all are answered. A claim
that lived as long as the slow deadline (30 s) would run B's waiters into a 504. What one slow
call through replica B costs on the machine at the time (a distinct question, timed just before
the kill) is the peer the takeover time is bounded by: the test holds on a loaded machine."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from router.settings import Settings
from standins.llm import StandinHandle
from tests.conftest import ROOT, free_port
from tests.live import wait_until_up
from tests.reliability.conftest import SECRET, SLOW_MODEL, LiveServer, answer_of, decision

CLAIM_TTL_S = 1.0  # shorter than the default 3 s: the takeover is awaited, not slept through


class Hang:
    """A slow model endpoint that accepts connections and never answers (the claim holder's
    call is in flight when the holder dies)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


def config(name: str, tmp_path: Path, *, redis_url: str, api_base: str) -> dict[str, Any]:
    """One replica's settings: the same on both replicas but for the slow model's address."""
    return {
        "fast": {"kind": "mock", "options": {"top_proba": 0.5}},  # below 0.9: escalated
        "slow": {"model": SLOW_MODEL, "api_base": api_base, "api_key": SECRET, "timeout_s": 30},
        "cache": {"redis_url": redis_url, "claim_ttl_s": CLAIM_TTL_S},
        "policy": {"fallback_threshold": 0.9},
        "log": {"decision_log_path": str(tmp_path / f"{name}.jsonl")}}


def replica_process(name: str, tmp_path: Path, *, redis_url: str, api_base: str) -> tuple[
        subprocess.Popen[str], str]:
    """`slotgate serve` on ``config``, as a process of its own (so it can be SIGKILLed)."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config(name, tmp_path, redis_url=redis_url,
                                          api_base=api_base)))
    port = free_port()
    env = {"PATH": str(Path(sys.executable).parent), "HOME": str(tmp_path),
           "LITELLM_LOCAL_MODEL_COST_MAP": "True",
           # the checkout under test, where it is not the installed one (a worktree)
           **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"}}
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "slotgate"), "serve", "--config", str(path),
         "--port", str(port)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, text=True)
    return proc, f"http://127.0.0.1:{port}"


def escalation_known(url: str, *, within_s: float = 120) -> None:
    """Until litellm is loaded in that replica (its slow path is warm)."""
    deadline = time.monotonic() + within_s
    while httpx.get(f"{url}/readyz", timeout=10).json()["escalation_available"] is not True:
        assert time.monotonic() < deadline, "litellm never loaded"
        time.sleep(0.2)


@pytest.fixture
def hang() -> Iterator[Hang]:
    server = Hang()
    yield server
    server.close()


def test_waiters_take_over_within_the_claim_ttl_when_the_holder_is_killed(
        redis_url: str, standin: StandinHandle, hang: Hang, tmp_path: Path) -> None:
    import redis

    replica_b = LiveServer(Settings(**config("b", tmp_path, redis_url=redis_url,
                                             api_base=standin.api_base)))
    with replica_b as b:  # up, its slow path warm, before A's process starts beside it
        url_b = b.url
        a, url_a = replica_process("a", tmp_path, redis_url=redis_url,
                                   api_base=f"http://127.0.0.1:{hang.port}/v1")
        try:
            wait_until_up(url_a, a, timeout_s=120)
            escalation_known(url_a)
            body = decision("my card never came and nobody tells me why")
            threading.Thread(target=lambda: _post(url_a, body, {}), daemon=True).start()
            store = redis.Redis.from_url(redis_url)
            deadline = time.monotonic() + 20
            while not store.keys("slotgate:v1:*:claim"):  # A holds the claim, its call hanging
                assert time.monotonic() < deadline, "replica A never claimed the question"
                time.sleep(0.05)
            results: list[dict[str, Any]] = [{} for _ in range(5)]
            waiters = [threading.Thread(target=_post, args=(url_b, body, results[i]))
                       for i in range(5)]
            for waiter in waiters:
                waiter.start()
            peer: dict[str, Any] = {}  # one escalation through B, now: what a slow call costs
            peer_started = time.monotonic()
            _post(url_b, decision("a distinct question: where is my refund"), peer)
            peer_s = peer["done"] - peer_started
            # B's waiters poll A's claim, renewed meanwhile by A's heartbeat
            time.sleep(max(0.0, CLAIM_TTL_S - peer_s))
            assert all(not r for r in results)
            killed_at = time.monotonic()
            os.kill(a.pid, signal.SIGKILL)
            for waiter in waiters:
                waiter.join(timeout=60)
            store.close()
        finally:
            if a.poll() is None:
                a.send_signal(signal.SIGTERM)
                a.wait(timeout=30)
    after_kill_s = max(r["done"] for r in results) - killed_at
    print(f"claim holder SIGKILLed: replica B's 5 waiters answered {after_kill_s:.2f} s later "
          f"(one slow call through B: {peer_s:.2f} s), {len(standin.calls())} slow call(s) from B")
    assert peer["status"] == 200, peer
    assert [r["status"] for r in results] == [200] * 5, results
    assert {r["route"] for r in results} <= {"slow", "cache"}  # "cache": shared, not called
    # The claim's TTL, then one slow call (twice the peer: the waiters' polling and a loaded
    # loop), far inside the 30 s a claim as long as the slow deadline would take.
    assert after_kill_s < CLAIM_TTL_S + 2 * peer_s + 1.0, (after_kill_s, peer_s)
    assert len(standin.calls()) == 2  # the peer's call and the one B's waiters shared


def _post(url: str, body: dict[str, Any], into: dict[str, Any]) -> None:
    try:
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    except httpx.HTTPError as exc:
        into.update(status=0, error=repr(exc), done=time.monotonic())
        return
    into.update(status=r.status_code, done=time.monotonic(),
                route=answer_of(r)[1] if r.status_code == 200 else r.text)
