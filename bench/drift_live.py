"""bench/drift.py's live run: the shifted stream through slotgate under uvicorn (the OpenAI SDK
as client, the stand-in LLM as slow model and auditor), then what the proxy served and logged."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from bench.drift_data import Scored
from bench.live import ask_intents, serve_in_thread


def live_run(work: Path, model_path: Path, policy_path: Path, rows: Scored,
             order: NDArray[np.int64], *, n_pre: int, concurrency: int) -> dict[str, Any]:
    # The client's imports happen here, before the proxy's background import of litellm starts:
    # both import httpx, and two threads importing it at once can see it half-initialised.
    import openai  # noqa: F401

    from router.store.decision_log import read_records
    from standins.llm import rule_chooser, start_standin

    truth = dict(zip(rows.texts, rows.labels, strict=True))

    def oracle(text: str, options: Sequence[str]) -> str:
        label = truth.get(text)
        return label if label is not None and label in options else rule_chooser(text, options)

    from router.http.state import app_state
    from router.monitoring.checkpoint import checkpoint_path

    log_path = work / "decisions.jsonl"
    log_path.unlink(missing_ok=True)
    checkpoint_path(log_path).unlink(missing_ok=True)  # a fresh proxy: no evidence carried over
    standin = start_standin(chooser=oracle)
    try:
        with proxy(model_path, policy_path, standin.api_base, log_path) as (url, app):
            t0 = time.perf_counter()
            served = ask_all(url, [rows.texts[i] for i in order], sorted(set(rows.labels)),
                             concurrency=concurrency)
            elapsed = time.perf_counter() - t0
            audits = wait_for_audits(app)
            monitor: Any = app_state(app).service.monitor  # the Monitor behind the port
            tripped = [w.traffic_tripped_at for w in monitor.watches.values()
                       if w.traffic_tripped_at is not None]
    finally:
        standin.stop()
    alarms = [r for r in read_records(log_path, events=True) if r.get("type") == "alarm"]
    post = range(n_pre, len(order))
    fast_post = [p for p in post if served[p]["route"] in ("fast", "cache")
                 and not served[p]["escalated"]]
    wrong = sum(served[p]["answer"] != rows.labels[order[p]] for p in fast_post)
    first = alarms[0] if alarms else None
    return {
        "wrong_accepted_after_shift_with_action": int(wrong),
        "live_rows": len(order),
        "live_requests_per_s": round(len(order) / elapsed, 1),
        "live_alarm": None if first is None else first["kind"],
        # the policy's decision count at the alarm; requests overlap, so +- concurrency rows
        "live_detection_delay": None if first is None else max(0, int(first["decision"]) - n_pre),
        # the policy's decision count when its traffic test tripped (under escalate_all: its
        # escalation), rows after the shift
        "live_traffic_trip_delay": None if not tripped else max(0, tripped[0] - n_pre),
        "live_fast_answers_after_shift": len(fast_post),
        "live_audits": audits,
        "live_all_answers_valid": all(s["answer"] in rows.labels for s in served),
    }


def wait_for_audits(app: Any, timeout_s: float = 60.0) -> dict[str, int]:
    """Audits run after each reply; wait until the queue is empty, then read its counts."""
    from router.http.state import app_state

    monitor: Any = app_state(app).service.monitor  # the Monitor behind the observer port
    deadline = time.monotonic() + timeout_s
    while monitor.audits.pending and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)  # the last ones in flight
    counts = monitor.audits.counts
    return {"done": counts.done, "dropped": counts.dropped, "failed": counts.failed}


@contextmanager
def proxy(model_path: Path, policy_path: Path, api_base: str,
          log_path: Path) -> Iterator[tuple[str, Any]]:
    """slotgate as `slotgate serve` runs it, on a free port in a thread with its own loop."""
    from router.settings import Settings

    settings = Settings(
        fast={"kind": "sklearn", "model_path": model_path, "timeout_s": 5.0},
        policy={"files": [policy_path], "default": "banking77-drift"},
        slow={"model": "openai/standin", "api_base": api_base, "api_key": "sk-standin-drift",
              "timeout_s": 30},
        log={"decision_log_path": log_path},
    )
    with serve_in_thread(settings, loop="asyncio") as served:
        yield served


def ask_all(url: str, texts: list[str], labels: list[str], *,
            concurrency: int) -> list[dict[str, Any]]:
    return [{"answer": r["answer"], "route": r["facts"]["route"],
             "escalated": bool(r["facts"].get("escalated"))}
            for r in ask_intents(url, texts, labels, concurrency=concurrency)]
