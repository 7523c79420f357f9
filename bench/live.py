"""What the live benchmarks share: the `slotgate` CLI as a subprocess, slotgate served under
uvicorn in a background thread of the benchmark's process, and BANKING77 intents asked through
the OpenAI SDK."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def slotgate(*args: Any) -> str:
    """Run a `slotgate` CLI command (the one installed beside this Python), returning stdout."""
    exe = Path(sys.executable).parent / "slotgate"
    done = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, cwd=ROOT,
                          check=False)
    if done.returncode != 0:
        sys.exit(f"slotgate {args[0]} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


@contextmanager
def serve_in_thread(settings: Any, *, loop: str = "auto") -> Iterator[tuple[str, Any]]:
    """``create_app(settings)`` under uvicorn in a daemon thread: (url, app), stopped on exit."""
    import uvicorn

    from router.http.app import create_app

    app = create_app(settings)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           loop=loop))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("slotgate did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def ask_intents(url: str, texts: Sequence[str], labels: list[str], *, concurrency: int,
                timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """Each text asked as a one-of-``labels`` decision: {"answer", "facts" (the reply's slotgate
    block), "ms" (as the client saw it)}, in order."""
    import openai
    from openai.types.chat import ChatCompletionMessageParam
    from openai.types.shared_params import ResponseFormatJSONSchema

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0,
                           timeout=timeout_s)
    response_format: ResponseFormatJSONSchema = {"type": "json_schema", "json_schema": {
        "name": "intent", "schema": {"type": "string", "enum": labels}}}

    def ask(text: str) -> dict[str, Any]:
        start = time.perf_counter()
        messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": text}]
        completion = client.chat.completions.create(
            model="banking77", response_format=response_format, messages=messages)
        return {"answer": json.loads(completion.choices[0].message.content or "null"),
                "facts": (completion.model_extra or {})["slotgate"],
                "ms": (time.perf_counter() - start) * 1000}

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(ask, texts))
