"""`slotgate alarms` as an operator meets it: a policy id nobody knows is refused naming the
known ones (nothing written), and a Redis that does not answer is one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from router.cli.app import app
from tests.conftest import free_port


def invoke(*args: object) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args])


def alarm(policy_id: str, kind: str, at: float) -> str:
    return json.dumps({"type": "alarm", "policy_id": policy_id, "kind": kind, "decision": 3,
                       "time": at, "detail": f"{kind} test"}) + "\n"


def one_error_line(result: Any, *parts: str) -> str:
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    [line] = result.stderr.strip().splitlines()
    assert all(part in line for part in parts), line
    return str(line)


def test_clear_of_an_unknown_policy_is_refused_naming_the_known_ones(tmp_path: Path) -> None:
    log = tmp_path / "decisions.jsonl"
    log.write_text(alarm("triage@1", "drift", 1.0) + alarm("intent@2", "accuracy", 2.0))
    before = log.read_text()
    result = invoke("alarms", "clear", "--policy", "triage@l", "--log", log)
    one_error_line(result, "--policy", "'triage@l'", "known: intent@2, triage@1")
    assert log.read_text() == before
    assert invoke("alarms", "clear", "--policy", "triage@1", "--log", log).exit_code == 0


def test_clear_of_a_policy_only_redis_knows(tmp_path: Path, redis_url: str) -> None:
    import redis

    from router.store.alarm_board import alarm_key

    client = redis.Redis.from_url(redis_url)
    client.set(alarm_key("fleet@1", "drift"), alarm("fleet@1", "drift", 1.0))
    client.close()
    log = tmp_path / "ops.jsonl"
    refused = invoke("alarms", "clear", "--policy", "fleet@7", "--log", log,
                     "--redis-url", redis_url)
    one_error_line(refused, "nor Redis", "known: fleet@1")
    done = invoke("alarms", "clear", "--policy", "fleet@1", "--log", log, "--redis-url", redis_url)
    assert done.exit_code == 0, done.output


def test_list_of_an_unknown_policy_is_refused_naming_the_known_ones(tmp_path: Path) -> None:
    log = tmp_path / "decisions.jsonl"
    log.write_text(alarm("triage@1", "drift", 1.0) + alarm("intent@2", "accuracy", 2.0))
    result = invoke("alarms", "list", "--policy", "triage@l", "--log", log)
    one_error_line(result, "--policy", "'triage@l'", "known: intent@2, triage@1")
    assert "no alarm stands" not in result.output
    listed = invoke("alarms", "list", "--policy", "triage@1", "--log", log, "--json")
    assert listed.exit_code == 0, listed.output
    assert [r["policy_id"] for r in json.loads(listed.stdout)["alarms"]] == ["triage@1"]


def test_list_with_redis_down_is_one_line(tmp_path: Path) -> None:
    down = f"redis://127.0.0.1:{free_port()}/0"
    result = invoke("alarms", "list", "--log", tmp_path / "d.jsonl", "--redis-url", down)
    one_error_line(result, "--redis-url", down, "did not answer")


def test_clear_with_redis_down_is_one_line(tmp_path: Path) -> None:
    down = f"redis://127.0.0.1:{free_port()}/0"
    log = tmp_path / "d.jsonl"
    log.write_text(alarm("p@1", "drift", 1.0))
    unknown = invoke("alarms", "clear", "--policy", "q@1", "--log", log, "--redis-url", down)
    one_error_line(unknown, "--redis-url", "did not answer")
    known = invoke("alarms", "clear", "--policy", "p@1", "--log", log, "--redis-url", down)
    one_error_line(known, "--redis-url", "logged but not shared")
