"""``slotgate alarms list|clear``: operator control of policy alarms. ``list`` shows the alarms
standing in a decision log (an operator's clear wins over the alarms before it) and, with
``--redis-url``, those the fleet shares; ``clear`` writes a clear record to the log (so a restart
does not re-arm the alarm) and, with ``--redis-url``, posts it to every replica through Redis.
``--policy`` is an id, a policy file or a configured policy's name (``policy_ref.py``), as in
`eval` and `monitor`. A policy id neither the log nor Redis knows is refused by both commands
(exit 2, naming the known ones), and a Redis that does not answer is one line and exit 2, within
the client's short timeouts."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from router.cli.help import PlainHelp

if TYPE_CHECKING:
    from router.store.alarm_board import RedisAlarmBoard
    from router.store.records import AlarmRecord

app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None,
                  help="Policy alarms: list them, clear them (docs/monitoring.md).")

LogOption = Annotated[Path, typer.Option(
    "--log", envvar="SLOTGATE_LOG__DECISION_LOG_PATH",
    help="The decision log (the proxy's log.decision_log_path).")]
RedisOption = Annotated[str | None, typer.Option(
    "--redis-url", envvar="SLOTGATE_CACHE__REDIS_URL",
    help="The fleet's Redis (cache.redis_url): read or clear the alarms every replica shares.")]
DETAIL = "cleared by an operator (slotgate alarms clear)"


def standing(log: Path, policy: str | None = None) -> dict[tuple[str, str], AlarmRecord]:
    """(policy id, kind) -> the alarm record standing in ``log``: the first of its kind since
    the policy's last clear, as the proxy re-arms them at start-up."""
    from router.store.log_join import alarms
    from router.store.log_reader import read_log

    held: dict[tuple[str, str], AlarmRecord] = {}
    cleared: dict[str, float] = {}
    for record in alarms(read_log(log, quiet=True)):
        if policy is not None and record.policy_id != policy:
            continue
        if record.kind == "clear":
            cleared[record.policy_id] = max(cleared.get(record.policy_id, 0.0), record.time)
            for key in [k for k in held if k[0] == record.policy_id]:
                if held[key].time <= record.time:
                    del held[key]
        elif record.time > cleared.get(record.policy_id, 0.0):
            held.setdefault((record.policy_id, record.kind), record)
    return held


async def _shared(redis_url: str, policy: str | None) -> list[AlarmRecord]:
    """The alarms standing in Redis (clears left out), of ``policy`` or of every policy."""
    from router.store.alarm_board import RedisAlarmBoard

    board = RedisAlarmBoard(redis_url, ttl_s=1)
    try:
        ids = [policy] if policy is not None else sorted(await _shared_ids(board, redis_url))
        records = await board.read(ids) if ids else []
        if records is None:
            _no_redis(redis_url, "did not answer")
        return [r for r in records if r.kind != "clear"]
    finally:
        await board.aclose()


async def _shared_ids(board: RedisAlarmBoard, redis_url: str) -> set[str]:
    """The policy ids Redis holds alarm or clear records of; exits 2 when Redis fails."""
    from router.store.redis_client import redis_errors

    try:
        return await board.policy_ids()
    except redis_errors() as exc:
        _no_redis(redis_url, f"did not answer ({type(exc).__name__}: {exc})")


def _no_redis(redis_url: str, what: str) -> NoReturn:
    from router.cli.common import fail

    fail(f"--redis-url: Redis at {redis_url} {what}")


@app.command(name="list", cls=PlainHelp)
def list_alarms(
    log: LogOption = Path("var/decisions.jsonl"),
    policy: Annotated[str | None, typer.Option(help="Only this policy: its id, or its policy "
                                               "file, or the name of one ./slotgate.yaml "
                                               "loads.")] = None,
    redis_url: RedisOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """The alarms standing: in the decision log and, with --redis-url, shared by the fleet."""
    from router.cli.common import show_table
    from router.cli.policy_ref import policy_id

    if policy is not None:
        policy = policy_id(policy)
        _check_known(policy, log, redis_url)
    rows = [{**record.model_dump(), "source": "log"} for record in standing(log, policy).values()]
    if redis_url is not None:
        rows += [{**r.model_dump(), "source": "redis"}
                 for r in asyncio.run(_shared(redis_url, policy))]
    if as_json:
        typer.echo(json.dumps({"alarms": rows}))
        return
    if not rows:
        typer.echo("no alarm stands" + (f" for policy {policy}" if policy else ""))
        return
    show_table("policy alarms", [
        (f"{r['policy_id']} {r['kind']} ({r['source']})",
         f"{datetime.fromtimestamp(r['time'], UTC):%Y-%m-%d %H:%M:%S}Z: {r['detail']}")
        for r in rows])


@app.command(cls=PlainHelp)
def clear(
    policy: Annotated[str, typer.Option(help="The policy: its id (as `alarms list` and the "
                                        "/metrics labels show it), or its policy file, or the "
                                        "name of one ./slotgate.yaml loads.")],
    log: LogOption = Path("var/decisions.jsonl"),
    redis_url: RedisOption = None,
) -> None:
    """Clear a policy's alarms: its decisions are routed by the policy again. Logged (a restart
    does not re-arm them) and, with --redis-url, shared: every replica clears within
    monitoring.alarm_sync_s. Without Redis a running replica clears when it restarts."""
    from router.cli.common import fail
    from router.cli.policy_ref import policy_id

    policy = policy_id(policy)
    if redis_url is None and not log.parent.is_dir():
        fail(f"--log: no folder {log.parent} (and no --redis-url): nothing to clear in")
    _check_known(policy, log, redis_url)
    at = time.time()
    held = standing(log, policy) if log.is_file() else {}
    if log.parent.is_dir():
        from router.store.records import AlarmRecord, encode

        record = AlarmRecord(policy_id=policy, kind="clear", decision=0, time=at, detail=DETAIL)
        with log.open("ab") as f:  # one short O_APPEND write: whole or absent
            f.write(encode(record) + b"\n")
    where = f"logged in {log}"
    if redis_url is not None:
        asyncio.run(_clear_shared(redis_url, policy, at))
        where += "; shared through Redis: every replica clears within monitoring.alarm_sync_s"
    else:
        where += "; replicas running now clear when restarted (pass --redis-url for a fleet)"
    kinds = ", ".join(sorted(kind for _, kind in held)) or "none in the log"
    typer.echo(f"cleared policy {policy} (alarms: {kinds}); {where}")


def _check_known(policy: str, log: Path, redis_url: str | None) -> None:
    """Exit 2, naming the known ids, when neither the log nor Redis has heard of ``policy``: a
    typo must not be reported as a clear. Redis is asked only when the log does not know it."""
    from router.cli.common import fail
    from router.store.log_reader import read_log
    from router.store.records import AlarmRecord, DecisionRecord

    known = {record.policy_id for record in read_log(log, quiet=True)
             if isinstance(record, DecisionRecord | AlarmRecord) and record.policy_id}
    if policy in known:
        return
    where = f"--log {log}"
    if redis_url is not None:
        known |= asyncio.run(_known_shared(redis_url))
        where += " nor Redis"
    if policy not in known:
        shown = ", ".join(sorted(map(str, known))[:20]) or "none"
        fail(f"--policy: no policy {policy!r} in {where} (--policy takes a policy id, a "
             f"policy file or a configured policy's name); known: {shown}")


async def _known_shared(redis_url: str) -> set[str]:
    from router.store.alarm_board import RedisAlarmBoard

    board = RedisAlarmBoard(redis_url, ttl_s=1)
    try:
        return await _shared_ids(board, redis_url)
    finally:
        await board.aclose()


async def _clear_shared(redis_url: str, policy: str, at: float) -> None:
    from router.cli.common import fail
    from router.store.alarm_board import RedisAlarmBoard
    from router.store.redis_client import redis_errors

    board = RedisAlarmBoard(redis_url, ttl_s=7 * 24 * 3600)
    try:
        await board.clear(policy, at, DETAIL)
    except redis_errors() as exc:
        fail(f"--redis-url: the clear was logged but not shared ({type(exc).__name__}: {exc})")
    finally:
        await board.aclose()
