"""A full disk under the proxy, over HTTP: decisions answered while the decision log's file cannot
take them are kept in memory and written, in order, when space returns; /readyz re-checks the
file by itself (rate-limited), so a replica out of rotation comes back without traffic; beyond
``log.spool_bytes`` records are dropped and counted in /metrics. The full disk is the log's
file-writing seam (``_write_whole``) raising ENOSPC: no mount, no root."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.backends.mock import MockBackend
from router.http.state import app_state
from router.settings import Settings
from router.store import decision_log
from router.store.decision_log import read_records
from tests.live import LiveServer
from tests.reliability.conftest import metric_value


class Disk:
    """The decision log's writes fail with ENOSPC while ``full``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.full = False
        real = decision_log._write_whole

        def write_whole(fd: int, data: bytes) -> None:
            if self.full:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real(fd, data)

        monkeypatch.setattr(decision_log, "_write_whole", write_whole)


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> Disk:
    return Disk(monkeypatch)


def serve(tmp_path: Path, **log: Any) -> LiveServer:
    settings = Settings(log={"decision_log_path": tmp_path / "decisions.jsonl", **log},
                        policy={"fallback_threshold": 0.5})
    return LiveServer(settings, backend=MockBackend(lambda request: [0.9, 0.1]))


def decide(client: httpx.Client, text: str) -> str:
    """One decision answered fast (200); its id."""
    reply = client.post("/v1/chat/completions", json={
        "model": "m", "messages": [{"role": "user", "content": text}],
        "response_format": {"type": "json_schema", "json_schema": {
            "name": "intent", "schema": {"type": "string", "enum": ["a", "b"]}}}})
    assert reply.status_code == 200, reply.text
    return str(reply.json()["slotgate"]["decision_id"])


def logged_ids(path: Path) -> list[str]:
    return [r["decision_id"] for r in read_records(path) if r["type"] == "decision"]


@pytest.fixture
def client_of() -> Iterator[Any]:
    clients: list[httpx.Client] = []

    def make(server: LiveServer) -> httpx.Client:
        clients.append(httpx.Client(base_url=server.url, timeout=10))
        return clients[-1]

    yield make
    for client in clients:
        client.close()


def test_readyz_sees_space_return_with_no_traffic_and_the_kept_decisions_are_written_in_order(
    tmp_path: Path, disk: Disk, client_of: Any
) -> None:
    path = tmp_path / "decisions.jsonl"
    with serve(tmp_path) as server:
        client = client_of(server)
        log = app_state(server.app).feedback
        log.recheck_interval_s = 3600  # type: ignore[attr-defined]  # no re-check until lowered
        before = [decide(client, f"before {i}") for i in range(2)]
        disk.full = True
        during = [decide(client, f"during {i}") for i in range(36)]
        ready = client.get("/readyz")
        assert ready.status_code == 503 and ready.json()["checks"]["decision_log"] is False
        assert "No space left" in ready.json()["decision_log"]["failing"]
        assert ready.json()["decision_log"]["spooled_records"] == 36
        disk.full = False
        # within the interval the file is not tried again: still 503, nothing written yet
        assert client.get("/readyz").status_code == 503
        assert logged_ids(path) == before
        log.recheck_interval_s = 0  # type: ignore[attr-defined]
        ready = client.get("/readyz")  # no decision since the disk filled up
        assert ready.status_code == 200, ready.json()
        assert "decision_log" not in ready.json()
        assert logged_ids(path) == before + during
        metrics = client.get("/metrics").text
    assert metric_value(metrics, "slotgate_unlogged_records_total", kind="decision") == 0


def test_decisions_beyond_the_spool_are_dropped_and_counted(
    tmp_path: Path, disk: Disk, client_of: Any
) -> None:
    path = tmp_path / "decisions.jsonl"
    with serve(tmp_path, spool_bytes=4096) as server:
        client = client_of(server)
        app_state(server.app).feedback.recheck_interval_s = 0  # type: ignore[attr-defined]
        disk.full = True
        during = [decide(client, f"message {i} " + "z" * 500) for i in range(20)]
        kept = client.get("/readyz").json()["decision_log"]
        assert 0 < kept["spooled_records"] < 20 and kept["spooled_bytes"] <= 4096
        metrics = client.get("/metrics").text
        dropped = metric_value(metrics, "slotgate_unlogged_records_total", kind="decision")
        assert dropped == 20 - kept["spooled_records"]
        disk.full = False
        assert client.get("/readyz").status_code == 200
        # the first of the outage are kept, in order; those after the spool filled are not
        assert logged_ids(path) == during[:kept["spooled_records"]]


def test_readyz_probes_the_disk_when_nothing_is_kept(
    tmp_path: Path, disk: Disk, client_of: Any
) -> None:
    """A refused label leaves the log failing with nothing in memory to write: /readyz's
    re-check writes a probe file beside the log, and leaves no trace in the log or the folder."""
    path = tmp_path / "decisions.jsonl"
    with serve(tmp_path) as server:
        client = client_of(server)
        app_state(server.app).feedback.recheck_interval_s = 0  # type: ignore[attr-defined]
        decision_id = decide(client, "a message")
        disk.full = True
        label = client.post("/v1/feedback", json={"decision_id": decision_id, "label": "a"})
        assert label.status_code == 503
        assert client.get("/readyz").status_code == 503  # the probe fails too
        disk.full = False
        ready = client.get("/readyz")
        assert ready.status_code == 200, ready.json()
    assert sorted(p.name for p in tmp_path.iterdir() if "probe" in p.name) == []
    assert path.read_bytes().count(b"\n") == 1 and logged_ids(path) == [decision_id]
