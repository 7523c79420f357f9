"""The decision log's in-memory index: of each recent decision only what ``/v1/feedback`` reads
(namespace, options, answer, and for monitoring the policy, route and escalation), bounded by entries *and* by bytes, so its size does not depend on
how long the messages were (the JSONL file and the Redis stream hold the full records)."""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

from router.store.records import DecisionView

# Per-entry cost beyond the id string itself: the 6-slot tuple (88 B), the
# OrderedDict's hash slot and linked-list node (~100 B), the unsynced mark when kept (~60 B).
# Measured with tracemalloc in tests/router/store/test_decision_index.py, which keeps it honest.
ENTRY_OVERHEAD_BYTES = 260


# What the index keeps of a decision besides its options and answer (short, repeated strings).
FACTS = ("namespace", "policy_id", "route", "escalated")


def feedback_view(decision_id: str, options: Sequence[str], answer: str | None,
                  facts: dict[str, Any]) -> DecisionView:
    """What ``DecisionLog.get`` returns: all ``/v1/feedback`` (and the monitor it tells) needs of
    a decision: ``decision_id``, ``options``, ``answer`` and the ``FACTS``."""
    policy_id, route = facts.get("policy_id"), facts.get("route")
    return DecisionView(decision_id=decision_id, options=tuple(options), answer=answer,
                        namespace=str(facts.get("namespace") or ""),
                        policy_id=None if policy_id is None else str(policy_id),
                        route=None if route is None else str(route),
                        escalated=bool(facts.get("escalated")))


def labelable(decision: DecisionView | None, namespace: str, *, trusted: bool
              ) -> DecisionView | None:
    """The decision a ``/v1/feedback`` caller may label: a trusted key any decision in the log,
    any other key only the decisions of its own namespace (another tenant's ids are as unknown to
    it as ids that never existed)."""
    if decision is None or not (trusted or decision.namespace == namespace):
        return None
    return decision


def unknown_decision_text(decision_id: str, *, trusted: bool) -> str:
    """What a ``/v1/feedback`` 404 says, true for the caller's role: a trusted key sees the
    whole log, any other key only its own decisions."""
    where = "in the log" if trusted else "among this API key's decisions"
    return f"decision_id: no decision {decision_id!r} {where}"


class DecisionIndex:
    """Recent decisions by id, oldest evicted first once there are more than ``max_entries`` or
    they take more than ``max_bytes``. Option lists are stored once per distinct list (a question
    asked a million times costs one copy), namespaces, policy ids and routes are interned, the
    answer is kept as its position among the options.

    ``unsynced`` (optional) remembers which entries another store (Redis) has not confirmed yet,
    so they can be re-sent after that store was down or lost its data."""

    def __init__(self, *, max_entries: int = 100_000, max_bytes: int = 32 * 2**20) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.nbytes = 0  # estimated bytes held: entries plus the distinct option lists
        # id -> (options, answer: its position in options or the string itself, namespace,
        # policy id, route, escalated)
        self._entries: OrderedDict[str, tuple[Any, ...]] = OrderedDict()
        self._options: dict[tuple[str, ...], list[Any]] = {}  # options -> [itself, refs, bytes]
        self._unsynced: OrderedDict[str, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, decision_id: object) -> bool:
        return decision_id in self._entries

    def add(self, decision_id: str, options: Sequence[str], answer: str | None,
            facts: dict[str, Any], *, unsynced: bool = False) -> None:
        """``facts``: the decision's ``FACTS`` (others are ignored)."""
        if decision_id in self._entries:
            self._drop(decision_id)
        shared = self._share(tuple(options))
        try:
            stored: int | str | None = shared.index(answer) if answer is not None else None
        except ValueError:
            stored = answer
        self._entries[decision_id] = (
            shared, stored, *(_intern(facts.get(name)) for name in FACTS))
        self.nbytes += sys.getsizeof(decision_id) + ENTRY_OVERHEAD_BYTES
        if unsynced:
            self._unsynced[decision_id] = None
        while len(self._entries) > self.max_entries or (
                self.nbytes > self.max_bytes and len(self._entries) > 1):
            self._drop(next(iter(self._entries)))

    def get(self, decision_id: str) -> DecisionView | None:
        entry = self.entry(decision_id)
        return None if entry is None else feedback_view(decision_id, *entry)

    def entry(self, decision_id: str
              ) -> tuple[tuple[str, ...], str | None, dict[str, Any]] | None:
        """(options, answer, facts); the options tuple is shared by every entry that has it."""
        entry = self._entries.get(decision_id)
        if entry is None:
            return None
        options, stored, *facts = entry
        answer = options[stored] if isinstance(stored, int) else stored
        return options, answer, dict(zip(FACTS, facts))

    def unsynced(self, limit: int) -> list[str]:
        """Up to ``limit`` ids not yet confirmed by the other store, oldest first."""
        ids: list[str] = []
        for decision_id in self._unsynced:
            if len(ids) >= limit:
                break
            ids.append(decision_id)
        return ids

    def mark_synced(self, decision_ids: Sequence[str]) -> None:
        for decision_id in decision_ids:
            self._unsynced.pop(decision_id, None)

    def mark_all_unsynced(self) -> None:
        """The other store lost what it had (e.g. Redis restarted without persistence)."""
        self._unsynced = OrderedDict.fromkeys(self._entries)

    @property
    def n_unsynced(self) -> int:
        return len(self._unsynced)

    def ids(self) -> Iterator[str]:
        return iter(self._entries)

    def _share(self, options: tuple[str, ...]) -> tuple[str, ...]:
        slot = self._options.get(options)
        if slot is None:
            size = sys.getsizeof(options) + sum(sys.getsizeof(o) for o in options) + 200
            slot = self._options[options] = [options, 0, size]
            self.nbytes += size
        slot[1] += 1
        shared: tuple[str, ...] = slot[0]
        return shared

    def _drop(self, decision_id: str) -> None:
        options = self._entries.pop(decision_id)[0]
        self._unsynced.pop(decision_id, None)
        self.nbytes -= sys.getsizeof(decision_id) + ENTRY_OVERHEAD_BYTES
        slot = self._options[options]
        slot[1] -= 1
        if slot[1] == 0:
            del self._options[options]
            self.nbytes -= slot[2]


def _intern(value: Any) -> Any:
    return sys.intern(value) if isinstance(value, str) else value
