"""The one way labels meet decisions, for every reader of the log (export-log, monitor, the
replay): a human label (``/v1/feedback``) wins over an audit label (the slow model's answer);
among labels of one source the latest by time wins, a tie going to the one read later. Human
labels of keys without the "trusted" role are left out unless asked for (``untrusted``): a
client's wrong labels must not re-tune a policy or judge its replayed accuracy; joined, a
trusted label still beats them. A decision has one label, however often it was posted. A
decision id seen twice (a log appended twice, at-least-once delivery to Redis) counts once:
its first record."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Literal

from router.store.log_reader import AnyRecord
from router.store.records import AlarmRecord, AuditRecord, DecisionRecord, FeedbackRecord

LabelSource = Literal["human", "slow"]


class LabelJoin:
    """The labels of a log by decision id (``add`` every record; decisions are ignored). Holds
    two short strings per labelled decision, never the decisions themselves. ``untrusted``:
    how many decisions an untrusted key labelled (left out, or with ``untrusted=True`` joined)."""

    def __init__(self, *, untrusted: bool = False) -> None:
        self._human: dict[str, tuple[float, str]] = {}
        self._client: dict[str, tuple[float, str]] = {}  # untrusted keys' labels, when joined
        self._audit: dict[str, tuple[float, str]] = {}
        self._probability: dict[str, float] = {}  # of the audit kept, when it was logged
        self._with_untrusted = untrusted
        self._untrusted: set[str] = set()

    def add(self, record: AnyRecord) -> None:
        if isinstance(record, FeedbackRecord):
            if not record.trusted:
                self._untrusted.add(record.decision_id)
                if self._with_untrusted:
                    _keep_latest(self._client, record.decision_id, record.time, record.label)
                return
            _keep_latest(self._human, record.decision_id, record.time, record.label)
        elif isinstance(record, AuditRecord) and _keep_latest(
                self._audit, record.decision_id, record.time, record.label):
            if record.probability is None:
                self._probability.pop(record.decision_id, None)
            else:
                self._probability[record.decision_id] = record.probability

    @property
    def untrusted(self) -> int:
        return len(self._untrusted)

    def human(self, decision_id: str) -> str | None:
        found = self._human.get(decision_id) or self._client.get(decision_id)
        return None if found is None else found[1]

    def audit(self, decision_id: str) -> str | None:
        found = self._audit.get(decision_id)
        return None if found is None else found[1]

    def audit_probability(self, decision_id: str) -> float | None:
        """The draw probability logged with the decision's audit (None: none logged)."""
        return self._probability.get(decision_id)

    def label(self, decision_id: str, *, audits: bool = True
              ) -> tuple[str, LabelSource] | None:
        """The label that counts and where it came from; ``audits=False``: human labels only."""
        human = self.human(decision_id)
        if human is not None:
            return human, "human"
        audit = self.audit(decision_id) if audits else None
        return None if audit is None else (audit, "slow")

    def __len__(self) -> int:
        return len(self._human.keys() | self._client.keys() | self._audit.keys())


def distinct_decisions(records: Iterable[AnyRecord]) -> Iterator[DecisionRecord]:
    """The decision records, each decision id once (its first record)."""
    seen: set[str] = set()
    for record in records:
        if isinstance(record, DecisionRecord) and record.decision_id not in seen:
            seen.add(record.decision_id)
            yield record


def alarms(records: Iterable[AnyRecord]) -> Iterator[AlarmRecord]:
    """The alarm records, in log order (restore-at-start-up, the replay's logged alarms)."""
    return (r for r in records if isinstance(r, AlarmRecord))


def _keep_latest(labels: dict[str, tuple[float, str]], decision_id: str, at: float,
                 label: str) -> bool:
    held = labels.get(decision_id)
    if held is None or at >= held[0]:
        labels[decision_id] = (at, label)
        return True
    return False
