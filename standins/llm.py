"""An OpenAI-compatible stand-in LLM for tests and demos: answers decision requests (a JSON-schema
``response_format`` with string enums) with a scikit-learn model's choice or a fixed rule, echoes
plain chats (streamed too), records every call and fails on command.

Run it:  python -m standins.llm --port 8090 [--model MODEL.joblib | --train TRAIN.csv]
         (--train: standins/slow_model.py, a model that disagrees with the fast tier)
Routes:  POST /v1/chat/completions, POST /v1/completions (echo), GET /v1/models,
         GET /calls (every recorded call), DELETE /calls,
         GET|POST /control  {"mode": "ok"|"fail500"|"stall"|"ratelimit"|"malformed"|"wrong_option"
                                      |"cut" (a stream drops its connection after two chunks)
                                      |"nested" (content is arrays nested 5,000 deep),
                             "times": N (then back to "ok"; omit for "until changed"),
                             "retry_after_s": 7, "stall_s": 30, "chunk_delay_s": 0.0}
In tests: ``handle = start_standin()``; ``handle.api_base`` for litellm; ``handle.stop()``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Imported at module level because FastAPI resolves the handlers' annotations from module globals.
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

if not __package__:  # run as a script (python standins/llm.py): the project root on the path
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from standins.spans import slow_span_answer  # after the path, when run as a script

GATE_WAIT_S = 10.0
MODES = ("ok", "fail500", "stall", "ratelimit", "malformed", "wrong_option", "cut", "nested")
NESTED_DEPTH = 5000  # mode "nested" answers arrays nested this deep (past Python's json parser)
# (text, options) -> one of options
Chooser = Callable[[str, Sequence[str]], str]


def rule_chooser(text: str, options: Sequence[str]) -> str:
    """Deterministic rule: the longest option named in the text (case-insensitive), else the first."""
    lowered = text.lower()
    named = [o for o in options if o.lower() in lowered]
    return max(named, key=len) if named else options[0]


def model_chooser(model_path: Path) -> Chooser:
    """A chooser backed by a model file: a slotgate text-model artifact (``slotgate train``:
    TF-IDF or embeddings + logistic regression), or any joblib'd scikit-learn estimator with
    ``predict_proba`` and ``classes_`` over option names. Its choice is restricted to the
    request's options; when none of them is a class it knows, the rule decides."""
    import joblib

    artifact = joblib.load(model_path)
    if isinstance(artifact, dict) and artifact.get("format") == "slotgate/text-model":
        from router.backends.sklearn import load_text_model

        artifact = load_text_model(Path(model_path)).pipeline  # checked: format, version, labels
    elif isinstance(artifact, dict):
        artifact = next(artifact[k] for k in ("pipeline", "model", "estimator") if k in artifact)
    return estimator_chooser(artifact)


def estimator_chooser(estimator: Any) -> Chooser:
    """A chooser backed by a fitted classifier with ``predict_proba`` and ``classes_`` over
    option names, restricted to the request's options (none it knows: the rule decides)."""
    import numpy as np

    classes = [str(c) for c in estimator.classes_]

    def choose(text: str, options: Sequence[str]) -> str:
        wanted = set(options)
        allowed = [i for i, c in enumerate(classes) if c in wanted]
        if not allowed:
            return rule_chooser(text, options)
        proba = np.asarray(estimator.predict_proba([text]))[0]
        return classes[max(allowed, key=lambda i: proba[i])]

    return choose


@dataclass
class StandinState:
    """Everything the stand-in remembers; shared with the test thread, so guarded by a lock."""

    chooser: Chooser = rule_chooser
    calls: list[dict[str, Any]] = field(default_factory=list)
    mode: str = "ok"
    times: int | None = None  # calls left in ``mode`` before it reverts to "ok"
    retry_after_s: float = 7.0
    stall_s: float = 30.0
    chunk_delay_s: float = 0.0
    error_message: str = "stand-in failure"  # what mode "fail500" says (tests put CR/LF in it)
    # When set, a stream's last chunk waits (at most GATE_WAIT_S) until a test sets it, so a test
    # can show a client got the first chunks while the stream was still open, without timing.
    last_chunk_gate: threading.Event | None = None
    gate_waits: list[bool] = field(default_factory=list)  # per held stream: opened before timeout
    stopping: bool = False
    # What GET /v1/models lists (vLLM: --served-model-name); every name is answered alike.
    served_models: tuple[str, ...] = ("standin",)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take_mode(self) -> str:
        with self.lock:
            mode = self.mode
            if self.times is not None:
                self.times -= 1
                if self.times <= 0:
                    self.mode, self.times = "ok", None
            return mode

    def control(self, body: dict[str, Any]) -> dict[str, Any]:
        mode = body.get("mode", "ok")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        with self.lock:
            self.mode = mode
            self.times = body.get("times")
            for key in ("retry_after_s", "stall_s", "chunk_delay_s"):
                if key in body:
                    setattr(self, key, float(body[key]))
            if "error_message" in body:
                self.error_message = str(body["error_message"])
            return {"mode": self.mode, "times": self.times}


def enum_questions(body: dict[str, Any]) -> tuple[str | None, dict[str, list[str]]] | None:
    """The enum questions of a decision request: (None, {"": options}) for a top-level enum schema,
    ("object", {property: options}) for an object of enums; None for a plain chat."""
    fmt = body.get("response_format") or {}
    schema = (fmt.get("json_schema") or {}).get("schema") if fmt.get("type") == "json_schema" else None
    if not isinstance(schema, dict):
        return None
    if isinstance(schema.get("enum"), list):
        return None, {"": [str(o) for o in schema["enum"]]}
    props = {k: v["enum"] for k, v in (schema.get("properties") or {}).items()
             if isinstance(v, dict) and isinstance(v.get("enum"), list)}
    return ("object", {k: [str(o) for o in v] for k, v in props.items()}) if props else None


def last_user_text(body: dict[str, Any]) -> str:
    for message in reversed(body.get("messages") or []):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):  # OpenAI content parts
                return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            return str(content or "")
    return ""


def answer_content(state: StandinState, body: dict[str, Any], mode: str) -> str:
    questions = enum_questions(body)
    text = last_user_text(body)
    if mode == "malformed":
        return "this is not JSON {"
    if mode == "nested":
        return "[" * NESTED_DEPTH + "]" * NESTED_DEPTH
    if questions is None:
        system = next((str(m.get("content")) for m in body.get("messages") or []
                       if m.get("role") == "system"), "")
        span = slow_span_answer(system, text)  # slotgate's span question: JSON with offsets
        return f"echo: {text}" if span is None else json.dumps(span)
    shape, by_name = questions
    chosen = {name: ("not-an-option" if mode == "wrong_option" else state.chooser(text, options))
              for name, options in by_name.items()}
    return json.dumps(chosen[""] if shape is None else chosen)


def completion(body: dict[str, Any], content: str) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion",
        "created": int(time.time()), "model": body.get("model", "standin"),
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


async def sse_chunks(state: StandinState, body: dict[str, Any], content: str, *,
                     cut: bool = False) -> AsyncIterator[bytes]:
    base = {"id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": body.get("model", "standin")}
    pieces = [content[i:i + 8] for i in range(0, len(content), 8)] or [""]
    deltas = [{"role": "assistant", "content": ""}] + [{"content": p} for p in pieces]
    for i, delta in enumerate(deltas):
        if cut and i == 2:
            raise ConnectionAbortedError("stand-in cut the stream (mode 'cut')")
        chunk = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        yield f"data: {json.dumps(chunk)}\n\n".encode()
        await asyncio.sleep(state.chunk_delay_s)
    final = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    if state.last_chunk_gate is not None:
        opened = await asyncio.to_thread(state.last_chunk_gate.wait, GATE_WAIT_S)
        with state.lock:
            state.gate_waits.append(opened)
    yield f"data: {json.dumps(final)}\n\ndata: [DONE]\n\n".encode()


def create_app(state: StandinState) -> FastAPI:
    app = FastAPI(title="slotgate stand-in LLM")

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await request.json()
        mode = state.take_mode()
        with state.lock:
            state.calls.append({"body": body, "mode": mode, "time": time.time(),
                                "authorization": request.headers.get("authorization"),
                                "traceparent": request.headers.get("traceparent")})
        if mode == "fail500" or (mode == "cut" and not body.get("stream")):
            return JSONResponse({"error": {"message": state.error_message, "type": "server_error"}},
                                status_code=500)
        if mode == "ratelimit":
            return JSONResponse({"error": {"message": "slow down", "type": "rate_limit_error"}},
                                status_code=429,
                                headers={"retry-after": f"{state.retry_after_s:g}"})
        if mode == "stall":  # polls so a stopping server or a gone client ends it early
            deadline = time.monotonic() + state.stall_s
            while time.monotonic() < deadline and not state.stopping:
                if await request.is_disconnected():
                    break
                await asyncio.sleep(0.05)
        content = answer_content(state, body, mode)
        if body.get("stream"):
            return StreamingResponse(sse_chunks(state, body, content, cut=mode == "cut"),
                                     media_type="text/event-stream")
        return completion(body, content)

    @app.post("/v1/completions")
    async def text_completion(request: Request) -> dict[str, Any]:
        """The legacy completions route: the prompt echoed (recorded as chats are)."""
        body = await request.json()
        with state.lock:
            state.calls.append({"body": body, "mode": "ok", "time": time.time(),
                                "authorization": request.headers.get("authorization")})
        return {"id": f"cmpl-{uuid.uuid4().hex[:12]}", "object": "text_completion",
                "created": int(time.time()), "model": body.get("model", "standin"),
                "choices": [{"index": 0, "text": f"echo: {body.get('prompt', '')}",
                             "finish_reason": "stop", "logprobs": None}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        """vLLM's list shape: one card per served name."""
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": int(time.time()), "owned_by": "vllm",
             "root": name, "parent": None, "max_model_len": 8192}
            for name in state.served_models]}

    @app.get("/calls")
    async def calls() -> list[dict[str, Any]]:
        with state.lock:
            return list(state.calls)

    @app.delete("/calls")
    async def clear_calls() -> dict[str, int]:
        with state.lock:
            n = len(state.calls)
            state.calls.clear()
        return {"cleared": n}

    @app.get("/control")
    async def get_control() -> dict[str, Any]:
        return {"mode": state.mode, "times": state.times}

    @app.post("/control")
    async def post_control(request: Request) -> Any:
        try:
            return state.control(await request.json())
        except (ValueError, TypeError) as exc:
            return JSONResponse({"error": {"message": str(exc), "type": "invalid_request_error"}},
                                status_code=400)

    return app


@dataclass
class StandinHandle:
    """A stand-in running in a background thread of this process."""

    url: str
    state: StandinState
    server: Any
    thread: threading.Thread

    @property
    def api_base(self) -> str:
        return f"{self.url}/v1"

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def calls(self) -> list[dict[str, Any]]:
        with self.state.lock:
            return list(self.state.calls)

    def clear(self) -> None:
        with self.state.lock:
            self.state.calls.clear()

    def set_mode(self, mode: str, *, times: int | None = None, **options: float | str) -> None:
        self.state.control({"mode": mode, "times": times, **options})

    def reset(self) -> None:
        """Back to how it started: mode ``ok``, the default fault knobs, no recorded calls."""
        fresh = StandinState()
        self.set_mode("ok", retry_after_s=fresh.retry_after_s, stall_s=fresh.stall_s,
                      chunk_delay_s=fresh.chunk_delay_s)
        self.clear()

    def stop(self) -> None:
        self.state.stopping = True
        self.server.should_exit = True
        self.thread.join(timeout=10)


def start_standin(*, chooser: Chooser | None = None, model_path: Path | None = None,
                  port: int = 0, host: str = "127.0.0.1",
                  served_models: Sequence[str] = ("standin",)) -> StandinHandle:
    """Start the stand-in on ``port`` (0: a free one) in a daemon thread; returns once it listens.
    ``served_models``: the names GET /v1/models lists."""
    import socket

    import uvicorn

    if port == 0:
        with socket.socket() as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
    state = StandinState(chooser=chooser or (model_chooser(model_path) if model_path else rule_chooser),
                         served_models=tuple(served_models))
    config = uvicorn.Config(create_app(state), host=host, port=port, log_level="warning",
                            lifespan="off", ws="none", timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"standin-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"stand-in LLM did not start on {host}:{port}")
        time.sleep(0.02)
    return StandinHandle(url=f"http://{host}:{port}", state=state, server=server, thread=thread)


def main(argv: Sequence[str] | None = None) -> None:

    import uvicorn


    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8090)
    choice = parser.add_mutually_exclusive_group()
    choice.add_argument("--model", type=Path, default=None,
                        help="joblib'd scikit-learn classifier over option names (default: a rule)")
    choice.add_argument("--train", type=Path, default=None, metavar="CSV",
                        help="fit the disagreeing stand-in (standins/slow_model.py) on a seeded "
                             "half of this CSV's text,category rows")
    parser.add_argument("--served-model-name", nargs="+", default=["standin"],
                        help="the names GET /v1/models lists, as vLLM's flag of that name")
    args = parser.parse_args(argv)
    if args.train:
        from standins.slow_model import train_slow_model

        print(f"stand-in LLM: fitting on half of {args.train} (about 10 s)", flush=True)
        chooser, what = estimator_chooser(train_slow_model(args.train)), f"fit on {args.train}"
    elif args.model:
        chooser, what = model_chooser(args.model), f"model {args.model}"
    else:
        chooser, what = rule_chooser, "rule: option named in the text"
    state = StandinState(chooser=chooser, served_models=tuple(args.served_model_name))
    print(f"stand-in LLM on http://{args.host}:{args.port}/v1 ({what})", flush=True)
    uvicorn.run(create_app(state), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
