"""A small threaded JSON HTTP server for stand-ins: counts requests and concurrency, injects
queued faults and delays, checks Bearer auth, and runs in a background thread for tests."""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

POLL_S = 0.02  # how often the serving thread looks for stop()


@dataclass
class Reply:
    status: int
    # dict/list -> JSON, str/bytes -> sent as is, an iterator of bytes -> each chunk written as
    # it comes, the connection closed after the last (HTTP/1.0 style, as a relay streams)
    body: Any
    headers: dict[str, str] = field(default_factory=dict)  # a content-type here wins


@dataclass
class Stats:
    """What a test can assert about the traffic a stand-in saw."""

    requests: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    bodies: list[Any] = field(default_factory=list)
    auth_headers: list[str | None] = field(default_factory=list)


class StandinServer:
    """Subclasses implement ``handle(method, path, body) -> Reply``; this class does the rest.

    ``faults`` is a queue of Replies served, one per POST, before the real handler answers again
    (e.g. ``[Reply(500, ...)]`` makes the first call fail). ``delay_s`` holds each POST that long,
    so concurrent callers overlap and ``stats.max_in_flight`` shows the client's cap.
    """

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, api_key: str | None = None,
                 delay_s: float = 0.0) -> None:
        self.api_key = api_key
        self.delay_s = delay_s
        self.faults: deque[Reply] = deque()
        self.stats = Stats()
        self._lock = threading.Lock()
        self._httpd = _Server((host, port), _make_handler(self))
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        name = host.decode() if isinstance(host, bytes) else host
        return f"http://{name}:{port}"

    def handle(self, method: str, path: str, body: bytes) -> Reply:
        raise NotImplementedError

    def start(self) -> Self:
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        # socketserver looks for shutdown() once per poll interval (0.5 s by default): every
        # stop, so every test using a stand-in, paid up to that.
        self._httpd.serve_forever(poll_interval=POLL_S)

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def handle_typed(self, method: str, path: str, body: bytes, content_type: str) -> Reply:
        """``handle`` for a server whose answer depends on the body's content type."""
        return self.handle(method, path, body)

    def _serve(self, method: str, path: str, auth: str | None, body: bytes,
               content_type: str = "") -> Reply:
        if method == "GET":
            return self.handle(method, path, body)
        with self._lock:
            self.stats.requests += 1
            self.stats.in_flight += 1
            self.stats.max_in_flight = max(self.stats.max_in_flight, self.stats.in_flight)
            self.stats.auth_headers.append(auth)
            try:
                self.stats.bodies.append(json.loads(body))
            except ValueError:
                self.stats.bodies.append(None)
            fault = self.faults.popleft() if self.faults else None
        try:
            if self.delay_s:
                time.sleep(self.delay_s)
            if self.api_key is not None and auth != f"Bearer {self.api_key}":
                return Reply(401, {"error": {"message": "missing or wrong bearer token",
                                             "type": "authentication_error"}})
            if fault is not None:
                return fault
            return self.handle_typed(method, path, body, content_type)
        finally:
            with self._lock:
                self.stats.in_flight -= 1


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # the stock backlog of 5 resets connections under test load


def _make_handler(owner: StandinServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self._answer(owner._serve("GET", self.path, None, b""))

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length)
            self._answer(owner._serve("POST", self.path, self.headers.get("authorization"), body,
                                      self.headers.get("content-type") or ""))

        def _answer(self, reply: Reply) -> None:
            if isinstance(reply.body, Iterator):
                self._stream(reply)
                return
            if isinstance(reply.body, (dict, list)):
                data = json.dumps(reply.body).encode()
                content_type = "application/json"
            else:
                data = reply.body.encode() if isinstance(reply.body, str) else reply.body
                content_type = "text/plain"
            headers = {"content-type": content_type, **reply.headers,
                       "content-length": str(len(data))}
            self.send_response(reply.status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

        def _stream(self, reply: Reply) -> None:
            self.send_response(reply.status)
            for key, value in reply.headers.items():
                self.send_header(key, value)
            self.send_header("connection", "close")
            self.end_headers()
            self.close_connection = True
            for chunk in reply.body:
                self.wfile.write(chunk)
                self.wfile.flush()

        def log_message(self, format: str, *args: Any) -> None:
            pass  # tests would drown in access lines

    return Handler
