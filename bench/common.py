"""Benchmark harness shared by bench/overhead.py and bench/cache.py: servers as subprocesses on
free ports, a bounded async load generator, interleaved rounds across paths, percentiles, JSON.

Also runnable as ``python bench/common.py upstream --port P``: an OpenAI-compatible upstream that
answers at once (a hand-rolled asyncio HTTP/1.1 server, so the upstream costs next to nothing)."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "bench" / "results"
LITELLM_BIN = ROOT / "bench" / ".venv-litellm" / "bin" / "litellm"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------- servers as subprocesses
@dataclass
class Server:
    """A process we start on ``port`` and poll until ``ready_path`` answers 2xx. Its output goes
    to a log file (a pipe nobody reads would fill and stall it)."""

    name: str
    argv: list[str]
    port: int
    ready_path: str | None = "/health"  # None: ready once the port accepts connections
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path = ROOT
    ready_timeout_s: float = 90.0
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        import httpx

        fd, log = tempfile.mkstemp(prefix=f"bench-{self.name}-", suffix=".log")
        self.log_path = Path(log)
        self.proc = subprocess.Popen(
            self.argv, cwd=self.cwd, env={**os.environ, **self.env},
            stdout=fd, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        os.close(fd)
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited early ({self.proc.returncode}):\n{self.tail()}")
            if self._ready(httpx):
                return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{self.name} not ready in {self.ready_timeout_s}s:\n{self.tail()}")

    def _ready(self, httpx: Any) -> bool:
        try:
            if self.ready_path is None:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return True
            return bool(httpx.get(self.url + self.ready_path, timeout=1.0).status_code < 300)
        except (OSError, httpx.HTTPError):
            return False

    def tail(self, n_chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-n_chars:] if self.log_path else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.proc = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def upstream_server() -> Server:
    port = free_port()
    return Server("upstream", [sys.executable, str(Path(__file__)), "upstream", "--port", str(port)],
                  port, ready_path="/health")


def redis_server(workdir: Path) -> Server:
    """A private redis-server on a free port (never the machine's 6379); nothing kept on disk."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed (Debian: apt-get install -y redis-server)")
    port = free_port()
    return Server("redis", [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                            "--appendonly", "no", "--dir", str(workdir)], port, ready_path=None)


def litellm_proxy(upstream_url: str, workdir: Path, *, master_key: str,
                  model: str = "standin") -> Server:
    """The LiteLLM proxy (bench/.venv-litellm, see setup_litellm_env.sh) as a peer, one worker,
    routing ``model`` to our upstream as an OpenAI-compatible endpoint. It refuses to start
    without a master key, so clients send ``Authorization: Bearer <master_key>``."""
    if not LITELLM_BIN.exists():
        raise RuntimeError("LiteLLM proxy not installed: run bash bench/setup_litellm_env.sh")
    cfg = workdir / "litellm.yaml"
    cfg.write_text(
        "model_list:\n"
        f"  - model_name: {model}\n"
        "    litellm_params:\n"
        f"      model: openai/{model}\n"
        f"      api_base: {upstream_url}/v1\n"
        "      api_key: sk-bench\n"
        # As LiteLLM's own benchmark config: no callbacks, no retries.
        "litellm_settings:\n"
        "  telemetry: false\n"
        "  callbacks: []\n"
        "  num_retries: 0\n"
        "general_settings:\n"
        f"  master_key: {master_key}\n"
    )
    port = free_port()
    env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR", "NO_DOCS": "True",
           "DISABLE_ADMIN_UI": "True"}
    return Server("litellm", [str(LITELLM_BIN), "--config", str(cfg), "--host", "127.0.0.1",
                              "--port", str(port), "--num_workers", "1"],
                  port, ready_path="/health/liveliness", env=env, ready_timeout_s=180.0)


# ---------------------------------------------------------------- request bodies, settings
MODEL = "standin"
OPTIONS = ["card_lost", "card_arrival", "balance", "refund", "other"]


def chat_body(i: int) -> bytes:
    return json.dumps({"model": MODEL, "max_tokens": 4,
                       "messages": [{"role": "user", "content": f"hello number {i}"}]}).encode()


def decision_body(i: int) -> bytes:
    """A decision whose state is distinct per ``i``: a new ``i`` misses the cache."""
    return json.dumps({
        "model": MODEL,
        "messages": [{"role": "user", "content": f"I lost my card, ticket {i}"}],
        "response_format": {"type": "json_schema", "json_schema": {
            "name": "intent", "schema": {"type": "string", "enum": OPTIONS}}},
    }).encode()


def slotgate_settings(upstream_url: str, workdir: Path, api_key: str, *,
                      redis_url: str | None = None) -> dict[str, Any]:
    """slotgate's settings for a benchmark: its slow path is our upstream through litellm."""
    return {
        "fast": {"kind": "mock"},
        "slow": {"model": f"openai/{MODEL}", "api_base": f"{upstream_url}/v1",
                 "api_key": "sk-bench", "allowed_models": [MODEL, f"openai/{MODEL}"]},
        "cache": {"redis_url": redis_url},
        "log": {"decision_log_path": str(workdir / "decisions.jsonl")},
        # The LiteLLM proxy checks a master key on every request; slotgate checks one too.
        "api_key_hashes": [hashlib.sha256(api_key.encode()).hexdigest()],
    }


def slotgate_server(settings: dict[str, Any], workdir: Path) -> Server:
    """slotgate with ``settings`` (a Settings dict; host and port are filled in) and a mock fast
    backend that is sure of the first option, so a decision costs the router and nothing else."""
    import yaml

    port = free_port()
    cfg = workdir / f"slotgate-{port}.yaml"
    cfg.write_text(yaml.safe_dump({**settings, "host": "127.0.0.1", "port": port}))
    argv = [sys.executable, str(Path(__file__)), "slotgate", "--config", str(cfg)]
    return Server(f"slotgate-{port}", argv, port, ready_path="/healthz")


def _serve_slotgate(config: Path) -> None:
    """The app `slotgate serve` runs, with MockBackend injected (create_app's test seam) and the
    same server options (uvloop, httptools, no access log)."""
    import uvicorn

    from router.app import create_app
    from router.backends.mock import MockBackend
    from router.settings import load_settings

    def sure_of_first(request: Any) -> list[float]:
        k = len(request.options)
        return [0.97] + [0.03 / (k - 1)] * (k - 1)

    settings = load_settings(config)
    app = create_app(settings, backend=MockBackend(sure_of_first, label="bench"))
    uvicorn.run(app, host=settings.host, port=settings.port, loop="uvloop", http="httptools",
                access_log=False, log_level="warning")


class Profiler:
    """py-spy attached to a running server (``--pid``), sampling until ``stop()``; its output is
    collapsed stacks (one ``frame;frame;... count`` line per distinct stack)."""

    def __init__(self, pid: int, out: Path, *, rate_hz: int = 250) -> None:
        spy = Path(sys.executable).parent / "py-spy"
        if not spy.exists():
            raise RuntimeError("py-spy not installed: .venv/bin/pip install py-spy")
        self.out = out
        self.proc = subprocess.Popen(
            [str(spy), "record", "--pid", str(pid), "--format", "raw", "--rate", str(rate_hz),
             "--nonblocking", "--output", str(out)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)

    def stop(self) -> Path | None:
        self.proc.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        return self.out if self.out.exists() else None


def litellm_version() -> str:
    py = LITELLM_BIN.parent / "python"
    return subprocess.run([str(py), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
                          capture_output=True, text=True, check=False).stdout.strip()


# ---------------------------------------------------------------- load generation
@dataclass(frozen=True)
class Target:
    """One way to reach the upstream: a name, a URL and a body per request index (bytes, built
    before the clock starts so the client's JSON encoding is not timed)."""

    name: str
    url: str
    body: Callable[[int], bytes]
    headers: dict[str, str] = field(default_factory=dict)
    # A response header holding the server's own timing in ms (LiteLLM's overhead), if any.
    timing_header: str | None = None


@dataclass
class LoadResult:
    latencies_ms: list[float]
    errors: int
    elapsed_s: float
    first_error: str | None = None
    header_ms: list[float] = field(default_factory=list)

    @property
    def requests_per_s(self) -> float:
        return len(self.latencies_ms) / self.elapsed_s if self.elapsed_s > 0 else 0.0


async def run_load(session: Any, path: Target, *, concurrency: int, n_requests: int,
                   max_seconds: float, start_index: int = 0) -> LoadResult:
    """Closed loop: ``concurrency`` workers send requests back to back until ``n_requests`` are
    done or ``max_seconds`` pass. Non-2xx replies count as errors, not latencies. ``session`` is
    an aiohttp ClientSession: httpx's pool tops out near 500 req/s at concurrency 32 on this
    machine (aiohttp: 13,000+), which would measure the client instead of the servers."""
    bodies = [path.body(start_index + i) for i in range(n_requests)]
    headers = {"content-type": "application/json", **path.headers}
    latencies: list[float] = []
    header_ms: list[float] = []
    errors = 0
    first_error: str | None = None
    next_i = 0
    t0 = time.perf_counter()
    deadline = t0 + max_seconds

    async def worker() -> None:
        nonlocal next_i, errors, first_error
        while next_i < n_requests and time.perf_counter() < deadline:
            i = next_i
            next_i += 1
            t = time.perf_counter()
            try:
                async with session.post(path.url, data=bodies[i], headers=headers) as r:
                    payload = await r.read()
                    ok = r.status < 300
                    timing = r.headers.get(path.timing_header) if path.timing_header else None
                if not ok and first_error is None:
                    first_error = f"{r.status}: {payload[:300]!r}"
            except Exception as exc:  # noqa: BLE001 - any failure is counted, the run goes on
                ok, timing = False, None
                if first_error is None:
                    first_error = repr(exc)
            if ok:
                latencies.append((time.perf_counter() - t) * 1000.0)
                if timing is not None:
                    header_ms.append(float(timing))
            else:
                errors += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return LoadResult(latencies, errors, time.perf_counter() - t0, first_error, header_ms)


@dataclass
class PathStats:
    latencies_ms: list[float] = field(default_factory=list)
    rounds_rps: list[float] = field(default_factory=list)
    header_ms: list[float] = field(default_factory=list)
    errors: int = 0
    first_error: str | None = None


async def interleaved(paths: Sequence[Target], *, concurrency: int, rounds: int,
                      per_round: int, segment_s: float, warmup: int = 50,
                      seed: int = 0) -> dict[str, PathStats]:
    """Runs ``rounds`` rounds; in each, every path gets ``per_round`` requests (at most
    ``segment_s`` seconds) in a shuffled order, so machine noise (other tenants, CPU frequency)
    falls on all paths alike."""
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=30.0)
    clients = {p.name: aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=concurrency), timeout=timeout) for p in paths}
    stats = {p.name: PathStats() for p in paths}
    rng = random.Random(seed)
    try:
        for p in paths:  # warm connections, JITs of caches, lazy imports on the servers
            await run_load(clients[p.name], p, concurrency=concurrency, n_requests=warmup,
                           max_seconds=segment_s, start_index=10_000_000)
        for r in range(rounds):
            order = list(paths)
            rng.shuffle(order)
            for p in order:
                res = await run_load(clients[p.name], p, concurrency=concurrency,
                                     n_requests=per_round, max_seconds=segment_s,
                                     start_index=r * per_round)
                s = stats[p.name]
                s.latencies_ms.extend(res.latencies_ms)
                s.rounds_rps.append(res.requests_per_s)
                s.header_ms.extend(res.header_ms)
                s.errors += res.errors
                s.first_error = s.first_error or res.first_error
    finally:
        for c in clients.values():
            await c.close()
    return stats


def summarize(latencies_ms: Sequence[float]) -> dict[str, float]:
    import numpy as np

    if not latencies_ms:
        return {"n": 0, "p50_ms": float("nan"), "p90_ms": float("nan"),
                "p99_ms": float("nan"), "mean_ms": float("nan")}
    a = np.asarray(latencies_ms, dtype=float)
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {"n": int(a.size), "p50_ms": float(p50), "p90_ms": float(p90),
            "p99_ms": float(p99), "mean_ms": float(a.mean())}


def median(values: Sequence[float]) -> float:
    import numpy as np

    return float(np.median(values)) if values else float("nan")


# ---------------------------------------------------------------- reporting
def machine_info() -> dict[str, Any]:
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
               platform.processor())
    mem_kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                  if line.startswith("MemTotal"))
    return {"nproc": os.cpu_count(), "cpu_model": cpu, "mem_gib": round(mem_kb / 2**20, 1),
            "loadavg_at_start": list(os.getloadavg()), "python": platform.python_version(),
            "platform": platform.platform()}


def write_json(name: str, payload: dict[str, Any]) -> Path:
    import orjson

    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = RESULTS_DIR / name
    out.write_bytes(orjson.dumps(payload, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS
                                 | orjson.OPT_SERIALIZE_NUMPY) + b"\n")
    return out


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for c in columns:
        table.add_column(c, justify="right" if c != columns[0] else "left")
    for row in rows:
        table.add_row(*(f"{v:.2f}" if isinstance(v, float) else str(v) for v in row))
    Console(stderr=True).print(table)


def use_uvloop() -> None:
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


# ---------------------------------------------------------------- the instant upstream
_COMPLETION = (
    b'{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"standin",'
    b'"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],'
    b'"usage":{"prompt_tokens":8,"completion_tokens":1,"total_tokens":9}}'
)
_MODELS = b'{"object":"list","data":[{"id":"standin","object":"model","owned_by":"bench"}]}'
_SSE = (b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,'
        b'"model":"standin","choices":[{"index":0,"delta":{"role":"assistant","content":"ok"},'
        b'"finish_reason":null}]}\n\ndata: {"id":"chatcmpl-bench","object":"chat.completion.chunk",'
        b'"created":1700000000,"model":"standin","choices":[{"index":0,"delta":{},'
        b'"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n')


def _response(body: bytes, content_type: bytes = b"application/json") -> bytes:
    return (b"HTTP/1.1 200 OK\r\ncontent-type: " + content_type + b"\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


class _Upstream(asyncio.Protocol):
    """HTTP/1.1 with keep-alive and Content-Length bodies (what httpx, aiohttp and the OpenAI
    SDK send); any POST gets one fixed chat.completion, or SSE chunks when it asks to stream."""

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].lower()
            length = 0
            for line in head.split(b"\r\n")[1:]:
                if line.startswith(b"content-length:"):
                    length = int(line[15:])
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4:end + 4 + length]
            self.buf = self.buf[end + 4 + length:]
            if head.startswith(b"post"):
                streaming = b'"stream":true' in body.replace(b" ", b"")
                reply = _response(_SSE, b"text/event-stream") if streaming else _response(_COMPLETION)
            else:
                reply = _response(_MODELS if b"/models" in head.split(b"\r\n", 1)[0] else b"{}")
            self.transport.write(reply)


def _serve_upstream(port: int) -> None:
    use_uvloop()

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(_Upstream, "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("command", choices=["upstream", "slotgate"])
    parser.add_argument("--port", type=int)
    parser.add_argument("--config", type=Path)
    args = parser.parse_args()
    if args.command == "upstream":
        _serve_upstream(args.port)
    else:
        sys.path.insert(0, str(ROOT))
        _serve_slotgate(args.config)
