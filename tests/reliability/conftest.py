"""Reliability fixtures: the real app under uvicorn on loopback in a thread whose event loop the
test can inspect (task counts), the stand-in LLM (standins/llm.py), a switchable MockBackend
and counters of open upstream connections read from /proc/net/tcp."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from policies.types import DecisionRequest
from router.settings import Settings
from standins.llm import StandinHandle
from tests.live import LiveServer as BaseLiveServer

SLOW_MODEL = "openai/standin"
SECRET = "sk-test-SECRET-0123456789abcdef"  # the upstream key; must never come back out
OPTIONS = ["card_arrival", "lost_card", "exchange_rate"]


class LiveServer(BaseLiveServer):
    """The shared live server, plus what reliability tests read off it: tasks, metrics."""

    def tasks(self) -> int:
        """asyncio tasks alive in the server's loop (the counting task itself excluded)."""
        async def count() -> int:
            return len(asyncio.all_tasks()) - 1

        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(count(), self.loop).result(timeout=5)

    def settle_tasks(self, baseline: int, *, within_s: float) -> int:
        """Polls until the task count is back to ``baseline`` (or time runs out); the last count."""
        deadline = time.monotonic() + within_s
        n = self.tasks()
        while n > baseline and time.monotonic() < deadline:
            time.sleep(0.05)
            n = self.tasks()
        return n

    def metric(self, name: str, **labels: str) -> float:
        """One sample of /metrics (0 when absent)."""
        text = httpx.get(f"{self.url}/metrics", timeout=5).text
        return metric_value(text, name, **labels)

    def post(self, path: str, body: Any, **kwargs: Any) -> httpx.Response:
        return httpx.post(f"{self.url}{path}", json=body, timeout=kwargs.pop("timeout", 20),
                          **kwargs)


def metric_value(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        series, value = line.rsplit(" ", 1)
        metric, _, rest = series.partition("{")
        got = ",".join(sorted(rest.rstrip("}").split(","))) if rest else ""
        if metric == name and got == want:
            return float(value)
    return 0.0


class Switch:
    """A MockBackend handler whose behaviour a test flips: "ok" (0.97 on the first option when
    the state says 'sure', else 0.5: escalated under the 0.9 fallback threshold), "down"
    (BackendUnavailable, after ``down_s``: at once by default), "slow" (sleeps ``slow_s``),
    "malformed" (one probability too few)."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.slow_s = 1.0
        self.down_s = 0.0
        self.calls = 0
        self.in_flight = 0
        self.max_in_flight = 0

    async def __call__(self, request: DecisionRequest) -> list[float]:
        from router.errors import BackendUnavailable

        self.calls += 1
        k = len(request.options)
        if self.mode == "down":
            if self.down_s:
                await asyncio.sleep(self.down_s)
            raise BackendUnavailable("mock backend is down")
        if self.mode == "slow":
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                await asyncio.sleep(self.slow_s)
            finally:
                self.in_flight -= 1
        if self.mode == "malformed":
            return [1.0 / (k - 1)] * (k - 1)
        top = 0.97 if "sure" in request.state else 0.5
        return [top] + [(1 - top) / (k - 1)] * (k - 1)


def settings_for(standin: StandinHandle | None, tmp_path: Path, **overrides: Any) -> Settings:
    """Settings with the slow path on ``standin`` (timeout 2 s) and the log under ``tmp_path``."""
    slow = ({"model": SLOW_MODEL, "api_base": standin.api_base, "api_key": SECRET,
             "timeout_s": 2} if standin else {})
    return Settings(slow={**slow, **overrides.pop("slow", {})},
                    log={"decision_log_path": tmp_path / "decisions.jsonl",
                         **overrides.pop("log", {})},
                    policy={"fallback_threshold": 0.9}, **overrides)


def decision(text: str, options: list[str] = OPTIONS, **extra: Any) -> dict[str, Any]:
    """An OpenAI chat body that is a decision over ``options`` about ``text``."""
    return {"model": "m", "messages": [{"role": "user", "content": text}],
            "response_format": {"type": "json_schema", "json_schema": {
                "name": "intent", "schema": {"type": "string", "enum": options}}}, **extra}


def answer_of(response: httpx.Response) -> tuple[str, str]:
    """(answer, route) of a decision reply."""
    reply = response.json()
    return json.loads(reply["choices"][0]["message"]["content"]), reply["slotgate"]["route"]


def established(remote_port: int) -> int:
    """ESTABLISHED TCP connections on this host whose *remote* end is ``remote_port``: the
    connections some client (the router's upstream pool) holds open to that server."""
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                if fields[3] == "01" and int(fields[2].rsplit(":", 1)[1], 16) == remote_port:
                    n += 1
    return n


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def fresh_standin(standin: StandinHandle) -> StandinHandle:
    standin.set_mode("ok")
    standin.clear()
    return standin
