"""The decision log on a real full filesystem (a 64 KB tmpfs; mounting one needs root, so the
module is skipped where it cannot): a decision the log cannot take is still answered, kept in
memory within the spool's bound and written when space returns (beyond the bound: counted as
unlogged), /readyz says the log fails, no line is torn or glued to the next, a label is refused
with 503, and the failure is said once when it starts and once when it ends.
tests/router/http/test_log_spool.py covers the same over HTTP with the disk simulated."""

from __future__ import annotations

import json
import logging
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.backends.mock import MockBackend
from router.errors import LogUnavailable
from router.http.state import app_state
from router.settings import Settings
from router.store.decision_log import JsonlDecisionLog
from router.store.log_reader import ReadCounts, read_log
from router.store.records import as_decision, encode
from tests.live import LiveServer
from tests.router.store.test_decision_log import record

DISK_BYTES = 64 * 1024


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KB tmpfs of its own, nearly filled by ``ballast`` (delete it to free the space)."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs",
                              str(mount_point)], capture_output=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        (mount_point / "ballast").write_bytes(b"x" * (DISK_BYTES - 8 * 1024))
        yield mount_point
    finally:
        subprocess.run(["umount", "--lazy", str(mount_point)], check=True)


def fill(disk: Path) -> None:
    """Take the free pages of the disk (a file beside the ballast, freed with it); the log's
    own last page keeps what it has left."""
    with (disk / "filler").open("ab", buffering=0) as f:
        try:
            while True:
                f.write(b"x" * 512)
        except OSError:
            pass


def free(disk: Path) -> None:
    for name in ("ballast", "filler"):
        (disk / name).unlink(missing_ok=True)


def whole_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of the log parsed (a torn or glued line fails the test), the file ending in
    a newline."""
    data = path.read_bytes()
    assert data.endswith(b"\n")
    counts = ReadCounts()
    records = [r.model_dump() for r in read_log(path, counts=counts)]
    assert counts.damaged == 0 and len(records) == data.count(b"\n")
    return records


def big_record(i: int) -> dict[str, Any]:
    return {**record(i), "text": f"message {i} " + "y" * 1500}  # 1.5 KB: a write can tear


async def test_a_full_disk_costs_records_never_a_caller(
    disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    unlogged: list[str] = []
    # room in memory for two of these records: the rest of what the disk cannot take is dropped
    line_bytes = len(encode(as_decision(big_record(10)))) + 1  # the longest of the twelve
    log = JsonlDecisionLog(disk / "decisions.jsonl", on_unlogged=unlogged.append,
                           spool_bytes=2 * line_bytes)
    with caplog.at_level(logging.WARNING, logger="router.store.decision_log"):
        for i in range(12):  # about twice what the disk has room for
            await log.append(big_record(i))
        assert log.failing is not None and "No space left" in log.failing
        assert unlogged and set(unlogged) == {"decision"}
        written = whole_lines(disk / "decisions.jsonl")
        kept, kept_bytes = log.spooled
        assert kept == 2 and kept_bytes <= 2 * line_bytes
        assert len(written) + kept + len(unlogged) == 12
        assert [r["decision_id"] for r in written] == [f"d{i}" for i in range(len(written))]
        free(disk)  # space comes back
        await log.append(big_record(99))
        assert log.failing is None and log.spooled == (0, 0)
        after = [r["decision_id"] for r in whole_lines(disk / "decisions.jsonl")]
        first_kept = len(written)
        assert after == [r["decision_id"] for r in written] + [
            f"d{first_kept}", f"d{first_kept + 1}", "d99"]
    await log.aclose()
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said  # once when it stopped, once when it wrote again
    assert "not logged" in said[0] and "writing again" in said[1]
    assert f"2 records kept in memory were written, {len(unlogged)} were not logged" in said[1]


async def test_a_torn_tail_is_ended_before_the_next_record(disk: Path) -> None:
    path = disk / "decisions.jsonl"
    log = JsonlDecisionLog(path)
    await log.append(record(0))
    with path.open("ab") as f:  # a tail another writer tore when the disk filled mid-line
        f.write(b'{"type": "decision", "decision_id": "torn')
    fill(disk)
    await log.append({**record(1), "text": "w" * 8192})  # more than the page left to the log
    assert log.failing is not None and log.spooled[0] == 1
    free(disk)
    await log.append(record(2))
    lines = path.read_bytes().splitlines()
    assert [json.loads(line)["decision_id"] for line in (lines[0], *lines[2:])] == [
        "d0", "d1", "d2"]
    assert lines[1].endswith(b"torn") and len(lines) == 4
    await log.aclose()


async def test_a_label_the_log_cannot_take_is_refused() -> None:
    """/dev/full: every write fails with ENOSPC, the disk that is always full."""
    unlogged: list[str] = []
    log = JsonlDecisionLog("/dev/full", on_unlogged=unlogged.append)
    await log.append(record(0))  # answered: the decision is kept in memory
    assert log.index.get("d0") is not None  # and feedback can still find it
    with pytest.raises(LogUnavailable) as refused:
        await log.add_feedback("d0", "lost_card", trusted=True)
    assert refused.value.status_code == 503 and refused.value.field == "label"
    assert unlogged == ["feedback"] and log.spooled[0] == 1
    await log.aclose()


def test_the_proxy_answers_on_a_full_disk_and_readyz_says_when_space_returns(disk: Path) -> None:
    settings = Settings(log={"decision_log_path": disk / "decisions.jsonl"},
                        policy={"fallback_threshold": 0.5})
    backend = MockBackend(lambda request: [0.9] + [0.1 / (len(request.options) - 1)]
                          * (len(request.options) - 1))
    body = {"model": "m", "messages": [{"role": "user", "content": "z" * 1500}],
            "response_format": {"type": "json_schema", "json_schema": {
                "name": "intent", "schema": {"type": "string", "enum": ["a", "b"]}}}}
    with LiveServer(settings, backend=backend) as server, httpx.Client(
            base_url=server.url, timeout=10) as client:
        assert client.get("/readyz").status_code == 200
        replies = [client.post("/v1/chat/completions", json=body) for _ in range(12)]
        assert [r.status_code for r in replies] == [200] * 12
        ready = client.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["checks"]["decision_log"] is False
        assert "No space left" in ready.json()["decision_log"]["failing"]
        assert ready.json()["decision_log"]["spooled_records"] >= 1
        free(disk)
        app_state(server.app).feedback.recheck_interval_s = 0  # type: ignore[attr-defined]
        assert client.get("/readyz").status_code == 200  # with no decision since
    assert len(whole_lines(disk / "decisions.jsonl")) == 12
