"""The decision log's index: only what feedback needs, bounded by entries and by bytes, its
byte estimate checked against tracemalloc, and a 900 KB message costing it what a short one does."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from router.store.decision_index import DecisionIndex
from router.store.decision_log import JsonlDecisionLog
from router.store.records import DecisionView

OPTIONS = [f"intent_{i}" for i in range(77)]


def test_get_returns_the_feedback_view_and_interns_option_lists() -> None:
    index = DecisionIndex()
    index.add("a", list(OPTIONS), "intent_3", {"namespace": "tenant", "policy_id": "p@1",
                                               "route": "fast", "escalated": False, "text": "x"})
    index.add("b", list(OPTIONS), "not-an-option", {"namespace": "tenant"})  # kept as it is
    index.add("c", ["yes", "no"], None, {"namespace": "tenant"})
    assert index.get("a") == DecisionView(  # what the monitor reads, and no text
        decision_id="a", namespace="tenant", options=tuple(OPTIONS), answer="intent_3",
        policy_id="p@1", route="fast", escalated=False)
    assert index.get("b").answer == "not-an-option"  # type: ignore[union-attr]
    assert index.get("c").answer is None  # type: ignore[union-attr]
    assert index.get("zzz") is None
    assert len(index._options) == 2  # one copy per distinct option list


def test_bounded_by_bytes_as_well_as_entries() -> None:
    index = DecisionIndex(max_entries=1_000_000, max_bytes=1_000_000)
    for i in range(5_000):  # every decision asks its own 100-option question
        index.add(f"d{i}", [f"q{i}-option-{j}" for j in range(100)], f"q{i}-option-0",
                  {"namespace": "ns"})
    assert index.nbytes <= 1_000_000
    assert 50 < len(index) < 500  # the oldest were evicted, the newest kept
    assert index.get("d4999") is not None and index.get("d0") is None
    assert len(index._options) == len(index)  # evicted option lists were freed too
    counted = DecisionIndex(max_entries=10, max_bytes=10**9)
    for i in range(50):
        counted.add(f"d{i}", OPTIONS, "intent_1", {"namespace": "ns"})
    assert len(counted) == 10 and counted.get("d40") is not None


def test_byte_estimate_matches_what_tracemalloc_sees() -> None:
    n = 20_000
    tracemalloc.start()
    try:
        index = DecisionIndex(max_entries=10**6, max_bytes=10**9)
        before = tracemalloc.get_traced_memory()[0]
        for i in range(n):
            index.add(f"{i:032x}", list(OPTIONS), OPTIONS[i % 77],
                      {"namespace": "default", "policy_id": "banking77@c0ffee", "route": "fast",
                       "escalated": False}, unsynced=True)
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    print(f"index: {used / n:.0f} B per decision measured, {index.nbytes / n:.0f} B estimated")
    assert 0.75 * index.nbytes < used < 1.25 * index.nbytes


def test_unsynced_marks() -> None:
    index = DecisionIndex()
    for i in range(5):
        index.add(f"d{i}", ["a", "b"], "a", {"namespace": "ns"}, unsynced=i % 2 == 0)
    assert index.unsynced(10) == ["d0", "d2", "d4"] and index.unsynced(2) == ["d0", "d2"]
    index.mark_synced(["d0", "d2"])
    assert index.unsynced(10) == ["d4"]
    index.mark_all_unsynced()
    assert index.n_unsynced == 5


async def test_a_900_kb_message_is_not_kept_in_memory(tmp_path: Path) -> None:
    """The index keeps what feedback needs, not the record: 50 decisions on one 900 KB message
    hold under 2 KB each (the full records would be 45 MB)."""
    log = JsonlDecisionLog(tmp_path / "d.jsonl")
    message = "I still have not received my card " * 26_500  # ~900 KB
    record = {"namespace": "default", "options": OPTIONS, "proba": [1 / 77] * 77,
              "text": message, "answer": "intent_0", "route": "fast"}
    await log.append({"decision_id": "warm-up", **record})
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(50):
            await log.append({"decision_id": f"d{i}", **record})
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
        await log.aclose()
    assert held < 50 * 2_000, f"{held / 50:.0f} B held per decision"
    assert (tmp_path / "d.jsonl").stat().st_size > 50 * len(message)  # the file has it all
    assert (await log.get("d7")).answer == "intent_0"  # type: ignore[union-attr]


def test_rejects_bad_bounds() -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        DecisionIndex(max_bytes=0)
    with pytest.raises(ValueError, match="max_entries"):
        DecisionIndex(max_entries=0)
