"""bench.load in a small form: `slotgate serve` under a few closed-loop clients for two seconds,
with the same mix of OpenAI decisions, System One decisions and passthrough chats the README's
load row reports; what it reports must add up."""

from __future__ import annotations

import argparse

import pytest

from bench.load import KINDS, run


async def test_a_short_load_run_answers_every_kind_and_its_counts_add_up() -> None:
    result = await run(argparse.Namespace(clients=8, seconds=2.0, warmup_s=1.0, quick=True))
    assert result["unexpected_errors"] == 0 and result["warmup_unexpected"] == 0, (
        result["statuses"], result["first_errors"])
    assert result["requests"] == result["ok"] + result["shed_429"] > 0
    assert sum(result["statuses"].values()) == result["requests"]
    assert set(result["latency_ms"]) == set(KINDS)  # every kind of request was answered
    assert result["requests_per_s"] == pytest.approx(result["ok"] / result["elapsed_s"], rel=0.01)
    # Decisions are logged (warm-up and measured ones alike); passthrough chats are not.
    assert result["decisions_logged"] >= 0.5 * result["ok"]
    assert result["rss_mib_after_warmup"] > 0 and result["rss_mib_end"] > 0
