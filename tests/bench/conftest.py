"""What the benchmarks' tests share: a BANKING77-shaped folder small enough that a benchmark run
on it takes seconds, the benchmarks' own servers, and a result folder that is never the
committed bench/results/."""

from __future__ import annotations

import csv
import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import RedisServer

# The first intents of categories.json: card questions that overlap (arrival, delivery estimate,
# linking, not working), so a fast tier is sure of some answers and unsure of others.
SMALL_INTENTS = 10


def small_copy(source: Path, target: Path, *, intents: int, train_per_intent: int | None = None,
               test_per_intent: int | None = None) -> Path:
    """``target`` laid out as BANKING77 (train.csv, test.csv, categories.json) with the first
    ``intents`` intents of ``source``'s categories.json and at most the given rows of each."""
    chosen = json.loads((source / "categories.json").read_text())[:intents]
    target.mkdir(parents=True, exist_ok=True)
    (target / "categories.json").write_text(json.dumps(chosen))
    for name, cap in (("train.csv", train_per_intent), ("test.csv", test_per_intent)):
        with (source / name).open(newline="", encoding="utf-8") as f:
            rows = [r for r in csv.DictReader(f) if r["category"] in chosen]
        kept: dict[str, int] = {}
        with (target / name).open("w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=["text", "category"])
            writer.writeheader()
            for row in rows:
                kept[row["category"]] = kept.get(row["category"], 0) + 1
                if cap is None or kept[row["category"]] <= cap:
                    writer.writerow({"text": row["text"], "category": row["category"]})
    return target


@pytest.fixture(scope="session")
def small_banking77(banking77_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """BANKING77's first ten intents, every row of them (about 1,300 train, 400 test rows)."""
    return small_copy(banking77_dir, tmp_path_factory.mktemp("banking77-small"),
                      intents=SMALL_INTENTS)


@pytest.fixture(autouse=True)
def _results_elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Any result a benchmark writes by its own default lands in this test's folder."""
    from bench import common

    results = tmp_path / "results"
    monkeypatch.setattr(common, "RESULTS_DIR", results)
    monkeypatch.setattr(common, "LOCAL_RESULTS_DIR", results / "local")
    return results


@dataclass(frozen=True)
class Peers:
    """The instant upstream and `slotgate serve` in front of it (mock fast read, the upstream
    as slow model through litellm, the session's private Redis as cache), as bench.overhead and
    bench.cache start them, without the LiteLLM proxy."""

    upstream: str
    slotgate: str
    api_key: str
    redis_url: str


@pytest.fixture(scope="session")
def bench_peers(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[Peers]:
    from bench import common, peers

    work = tmp_path_factory.mktemp("bench-peers")
    api_key = "sk-" + secrets.token_hex(24)
    settings = common.slotgate_settings("", work, api_key, redis_url=redis_server.url)
    with peers.upstream_server() as up:
        settings["slow"]["api_base"] = f"{up.url}/v1"
        with peers.slotgate_server(settings, work) as sg:
            yield Peers(up.url, sg.url, api_key, redis_server.url)


@pytest.fixture
def cli_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """The `slotgate` commands a benchmark runs (bench.live.slotgate) run in this process: the
    same commands and arguments, without a fresh interpreter importing sklearn for each."""
    import sys

    from typer.testing import CliRunner

    from bench import live
    from router.cli.app import app

    def slotgate(*args: object) -> str:
        result = CliRunner().invoke(app, [str(a) for a in args])
        if result.exit_code != 0:
            sys.exit(f"slotgate {args[0]} failed ({result.exit_code}): {result.stderr.strip()}"
                     f"{result.exception!r}")
        return result.stdout

    as_subprocess = live.slotgate
    for name, module in list(sys.modules.items()):
        if name.startswith("bench.") and getattr(module, "slotgate", None) is as_subprocess:
            monkeypatch.setattr(module, "slotgate", slotgate)
