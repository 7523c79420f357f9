"""The processes a benchmark runs, each as a subprocess on a free loopback port with readiness
polling: the instant upstream, the LiteLLM proxy (its own venv), `slotgate serve` (with its
garbage-collector pauses recorded) and a private redis-server.

Also runnable as ``python -m bench.peers upstream --port P``: an OpenAI-compatible upstream that
answers at once (a hand-rolled asyncio HTTP/1.1 server, so the upstream costs next to nothing),
and ``python -m bench.peers slotgate --config C`` (what `slotgate serve --config C` runs)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

ROOT = Path(__file__).resolve().parent.parent
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
    gc_stats_path: Path | None = None  # slotgate_server only
    # A line the server logs once it is warm (after readiness): measuring before it would time
    # its start-up work (slotgate: litellm's background import, then the heap freeze).
    warm_log_marker: str | None = None
    warm_at: float | None = None  # time.time() once started and warm

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        import httpx

        if self.proc is not None and self.proc.poll() is None:  # it would lose this process
            raise RuntimeError(f"{self.name} is already started (pid {self.proc.pid})")

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
                self._wait_warm(deadline)
                self.warm_at = time.time()
                return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{self.name} not ready in {self.ready_timeout_s}s:\n{self.tail()}")

    def _wait_warm(self, deadline: float) -> None:
        while self.warm_log_marker and self.warm_log_marker not in self.tail(n_chars=10**7):
            if time.monotonic() > deadline:
                print(f"{self.name}: no {self.warm_log_marker!r} in its log; measuring anyway",
                      file=sys.stderr)
                return
            time.sleep(0.2)

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
    if not LITELLM_BIN.exists():  # first run on this machine: the peer sets itself up (~1 min)
        print("installing the LiteLLM proxy into bench/.venv-litellm ...", file=sys.stderr)
        subprocess.run(["bash", str(ROOT / "bench" / "setup_litellm_env.sh")], check=True,
                       stdout=subprocess.DEVNULL)
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


def slotgate_server(settings: dict[str, Any], workdir: Path) -> Server:
    """`slotgate serve` with ``settings`` (a Settings dict; host and port are filled in). The
    server also records its garbage-collector pauses (read_gc_stats); with a slow model it
    counts as started once it has frozen its start-up heap (router/http/startup_freeze.py), after
    litellm's background import."""
    import yaml

    port = free_port()
    cfg = workdir / f"slotgate-{port}.yaml"
    cfg.write_text(yaml.safe_dump({**settings, "host": "127.0.0.1", "port": port}))
    gc_stats = workdir / f"slotgate-{port}.gc.json"
    argv = [sys.executable, str(Path(__file__)), "slotgate", "--config", str(cfg),
            "--gc-stats", str(gc_stats)]
    return Server(f"slotgate-{port}", argv, port, ready_path="/healthz", gc_stats_path=gc_stats,
                  # logged once litellm's background import is done (only with a slow model)
                  warm_log_marker="start-up heap frozen" if (settings.get("slow") or {}).get(
                      "model") else None)


def read_gc_stats(server: Server) -> dict[str, Any] | None:
    """The GC pauses a slotgate_server has had so far (refreshed every gen-2 collection and
    every 200 collections, so up to 200 young collections behind), with ``serving``: the gen-2
    pauses since it was started and warm (start-up's, during litellm's import, left out)."""
    path = server.gc_stats_path
    if path is None or not path.exists():
        return None
    stats: dict[str, Any] = json.loads(path.read_text())
    since = server.warm_at or 0.0
    pauses = [ms for t, ms in stats.get("gen2_pauses", []) if t >= since]
    stats["serving"] = {"gen2_count": len(pauses), "gen2_total_ms": sum(pauses),
                        "gen2_max_ms": max(pauses, default=0.0)}
    return stats


def _serve_slotgate(config: Path, gc_stats: Path) -> None:
    """What `slotgate serve --config` runs (router.http.server.serve), plus a gc callback that
    records the pauses: a full collection walks every live object, litellm's included."""
    import gc

    from router.http.server import serve

    started = time.monotonic()
    stats: dict[str, Any] = {str(g): {"count": 0, "total_ms": 0.0, "max_ms": 0.0} for g in range(3)}
    clock: dict[str, float] = {"t": 0.0, "n": 0}
    gen2_pauses: list[tuple[float, float]] = []  # (time.time(), ms): rare, so kept one by one

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            clock["t"] = time.perf_counter()
            return
        pause_ms = (time.perf_counter() - clock["t"]) * 1000.0
        g = stats[str(info["generation"])]
        g["count"] += 1
        g["total_ms"] += pause_ms
        g["max_ms"] = max(g["max_ms"], pause_ms)
        clock["n"] += 1
        if info["generation"] == 2:
            gen2_pauses.append((time.time(), pause_ms))
        # Cheap on purpose (no object census here): the hook must not become a cost itself.
        if info["generation"] == 2 or clock["n"] % 200 == 0:
            gc_stats.write_text(json.dumps({"generations": stats, "gen2_pauses": gen2_pauses,
                                            "wall_s": time.monotonic() - started}))

    gc.callbacks.append(on_gc)
    serve(config=config)


def litellm_version() -> str:
    py = LITELLM_BIN.parent / "python"
    return subprocess.run([str(py), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
                          capture_output=True, text=True, check=False).stdout.strip()


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


def use_uvloop() -> None:
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


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
    parser.add_argument("--gc-stats", type=Path)
    args = parser.parse_args()
    if args.command == "upstream":
        _serve_upstream(args.port)
    else:
        _serve_slotgate(args.config, args.gc_stats)
