"""Replicas that agree: two live slotgate apps (real uvicorn on loopback,
each with its own decision log file) on one private Redis. Identical escalations on both make
one slow call (litellm to the stand-in LLM), the rate limit is shared, feedback
sent to replica B finds a decision made on A, a decision made on A while Redis was down is
found from B once Redis is back (also after a restart that lost everything), and `export-log`
over both logs sees the label."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from router.backends.mock import MockBackend
from router.cli.app import app as cli
from router.tuning.predictions import read_predictions
from standins.llm import StandinHandle
from tests.conftest import RedisServer
from tests.reliability.conftest import (
    OPTIONS,
    LiveServer,
    Switch,
    answer_of,
    decision,
    settings_for,
)
from tests.reliability.test_slow_deadlines import burst


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis of this test alone: it is stopped and restarted, which no shared one may be."""
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()


def replica(name: str, redis_url: str, tmp_path: Path, standin: StandinHandle | None = None,
            **overrides: object) -> LiveServer:
    settings = settings_for(standin, tmp_path, cache={"redis_url": redis_url},
                            log={"decision_log_path": tmp_path / f"{name}.jsonl"}, **overrides)
    return LiveServer(settings, backend=MockBackend(Switch()))


def feedback_until(server: LiveServer, decision_id: str, label: str, *,
                   within_s: float) -> httpx.Response:
    """POST /v1/feedback until it is not 404 (the log reaches Redis a few ms after the reply)."""
    deadline = time.monotonic() + within_s
    while True:
        r = server.post("/v1/feedback", {"decision_id": decision_id, "label": label})
        if r.status_code != 404 or time.monotonic() > deadline:
            return r
        time.sleep(0.05)


def test_identical_escalations_on_two_replicas_make_one_slow_call(
    redis: RedisServer, tmp_path: Path, fresh_standin: StandinHandle
) -> None:
    """Single flight spans replicas through Redis: per process, each replica would make its
    own call (2 here)."""
    with replica("a", redis.url, tmp_path, fresh_standin) as a, \
            replica("b", redis.url, tmp_path, fresh_standin) as b:
        for server in (a, b):
            server.wait_for_slow_path()
        fresh_standin.set_mode("stall", stall_s=1.0)  # both bursts arrive while it is in flight
        body = decision("where is my lost_card, asked on both replicas")

        async def both() -> list[tuple[int, float, httpx.Response]]:
            on_a = asyncio.ensure_future(burst(a.url, [body] * 10))
            await asyncio.sleep(0.3)
            return await on_a + await burst(b.url, [body] * 10)

        results = asyncio.run(both())
        fresh_standin.set_mode("ok")
    assert [status for status, _, _ in results] == [200] * 20
    assert {answer_of(response)[0] for _, _, response in results} == {"lost_card"}
    assert len(fresh_standin.calls()) == 1


def test_the_rate_limit_is_shared_by_the_replicas(redis: RedisServer, tmp_path: Path) -> None:
    """The bucket lives in Redis: with a bucket per process, two replicas would let 6 of these
    6 through."""
    limit = {"rate_limit_rps": 0.2, "rate_limit_burst": 3}
    with replica("a", redis.url, tmp_path, **limit) as a, \
            replica("b", redis.url, tmp_path, **limit) as b:
        statuses = [server.post("/v1/chat/completions", decision(f"sure {i}")).status_code
                    for i, server in enumerate([a, b, a, b, a, b])]
        refused = b.post("/v1/chat/completions", decision("sure"))
    assert statuses == [200, 200, 200, 429, 429, 429]
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1


def test_feedback_on_another_replica_and_export_of_both_logs(redis: RedisServer,
                                                             tmp_path: Path) -> None:
    with replica("a", redis.url, tmp_path) as a, replica("b", redis.url, tmp_path) as b:
        made = a.post("/v1/chat/completions", decision("sure, lost my card"))
        assert made.status_code == 200
        decision_id = made.json()["slotgate"]["decision_id"]
        fed = feedback_until(b, decision_id, "lost_card", within_s=5)
        assert fed.status_code == 200 and fed.json()["correct"] is False
        bad = b.post("/v1/feedback", {"decision_id": decision_id, "label": "not-an-option"})
        assert bad.status_code == 400  # B knows the decision's options too

        redis.stop()  # a decision made on A while Redis is down ...
        during = a.post("/v1/chat/completions", decision("sure, card arrival"))
        assert during.status_code == 200
        during_id = during.json()["slotgate"]["decision_id"]
        redis.start()  # ... back, and empty (no persistence): the first decision's key is gone
        # too. A re-sends both without being asked (its next retry after 1 s).
        back = time.monotonic()
        assert feedback_until(b, during_id, "card_arrival", within_s=10).status_code == 200
        assert feedback_until(b, decision_id, "card_arrival", within_s=10).status_code == 200
        print(f"\nreplicas: both decisions found from B {time.monotonic() - back:.2f} s after "
              "Redis came back empty")

    logs = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    runner = CliRunner()  # the replicas have no API keys: every label is an untrusted client's
    for log in logs:  # each file alone: A's decisions without labels, B's labels alone
        out = tmp_path / f"{log.stem}-only.jsonl"
        result = runner.invoke(cli, ["export-log", "--log", str(log), "--out", str(out),
                                     "--labelled-only", "--untrusted-labels"])
        assert result.exit_code == 0 and "wrote 0 predictions" in result.output, result.output
    out = tmp_path / "both.jsonl"
    result = runner.invoke(cli, ["export-log", "--log", str(logs[0]), "--log", str(logs[1]),
                                 "--out", str(out), "--labelled-only", "--untrusted-labels"])
    assert result.exit_code == 0, result.output
    preds = read_predictions(out)
    labels = dict(zip(preds.ids, preds.labels))
    # the latest label wins: decision_id was labelled lost_card, then card_arrival
    assert labels == {decision_id: "card_arrival", during_id: "card_arrival"}
    assert preds.options == tuple(OPTIONS)

    # Through Redis instead of the files: the stream holds what was written since the restart,
    # so the decision made before it (its record went with the restart) is not there.
    via_redis = tmp_path / "redis.jsonl"
    result = runner.invoke(cli, ["export-log", "--redis-url", redis.url, "--out", str(via_redis),
                                 "--labelled-only", "--untrusted-labels"])
    assert result.exit_code == 0, result.output
    preds = read_predictions(via_redis)
    assert dict(zip(preds.ids, preds.labels)) == {during_id: "card_arrival"}
    redis.stop()
    result = runner.invoke(cli, ["export-log", "--redis-url", redis.url, "--out", str(via_redis)])
    assert result.exit_code == 2 and "--redis-url" in result.output
    redis.start()  # for the fixture's stop
