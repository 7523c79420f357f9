"""Production traffic back into tuning: the decision logs joined with their feedback (and,
optionally, audit) labels into the predictions format ``slotgate tune`` reads
(``slotgate export-log``). The records come from the replicas' JSONL files, from the Redis
stream they all write to, or both."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from router.store.log_join import LabelJoin, LabelSource, distinct_decisions
from router.store.log_reader import AnyRecord, read_logs
from router.store.records import DecisionRecord
from router.tuning.predictions import PredictionsError, write_predictions

if TYPE_CHECKING:
    from router.settings import Settings


def export_predictions(source: Settings | Path | str | Sequence[Path | str], out_path: Path | str,
                       *, signature: str | None = None, labelled_only: bool = False,
                       audit_labels: bool = False,
                       redis_stream: tuple[str, str] | None = None, reference_slow: bool = False,
                       tally: dict[str, int] | None = None) -> int:
    """Join JSONL decision logs with their feedback into the predictions format (id, options,
    raw proba, label or null, signature, fingerprint, text); returns the rows written. Several
    logs (one per replica) are joined as one: feedback sent to replica B for a decision made on
    A is in B's file. A predictions file holds one question, so a log of several needs
    ``signature``. Decisions without a fast read (no proba) are left out; labels are joined by
    ``router.store.log_join`` (a human label wins, then the latest by time); a decision id
    repeated (a log appended twice, at-least-once delivery) counts once. With
    ``audit_labels``, a decision with no feedback takes its audit's label (the slow model's
    answer): a policy tuned on those promises agreement with the slow model. ``redis_stream``
    (url, stream name) adds the records of the Redis stream every replica writes to (what it
    still holds: see docs/reliability.md on Redis restarts). The logs are streamed twice
    (labels first, then the rows): memory holds labels and ids, never the records.

    ``reference_slow`` (``export-log --reference slow``, the shadow-mode path): a decision with
    no feedback takes the slow model's answer as its label: its audit's, else the answer it was
    served when that came from the slow model (shadow mode, or an escalation). Rows say where
    their label came from (``reference``: "human" | "slow"); ``tally`` receives the counts
    (human, slow, unlabelled). No reference label at all is bad input (field 'label'), and
    nothing is written. Escalations alone are labelled only below the threshold, a biased
    sample; a shadow-mode log labels every decision."""
    if isinstance(source, str | Path):
        paths = [Path(source)]
    elif isinstance(source, Sequence):
        paths = [Path(p) for p in source]
    else:
        paths = [source.log.decision_log_path]
    path: Path | str = paths[0] if paths else f"{redis_stream[1] if redis_stream else '?'}"

    def records(*, quiet: bool = False) -> Iterator[AnyRecord]:
        return read_logs(paths, redis_stream=redis_stream, quiet=quiet)

    labels = LabelJoin()
    questions: dict[str, int] = {}  # question -> decisions, in the order first seen
    seen: set[str] = set()
    for record in records():
        labels.add(record)
        if (isinstance(record, DecisionRecord) and record.decision_id not in seen
                and _exportable(record)):
            seen.add(record.decision_id)
            questions[_question(record)] = questions.get(_question(record), 0) + 1
    del seen
    if signature is None and len(questions) > 1:
        listing = ", ".join(f"{s} ({n} decisions)" for s, n in
                            sorted(questions.items(), key=lambda kv: -kv[1]))
        raise PredictionsError(path, None, "signature", f"the log holds {len(questions)} "
                               f"different questions; choose one with --signature: {listing}")
    chosen = signature if signature is not None else next(iter(questions), None)
    counts = {"human": 0, "slow": 0, "unlabelled": 0}
    label_of = _labeller(labels, audit_labels=audit_labels, reference_slow=reference_slow)

    def rows() -> Iterator[dict[str, Any]]:
        for decision in distinct_decisions(records(quiet=True)):  # damage warned once, above
            if not _exportable(decision) or _question(decision) != chosen:
                continue
            label, reference = label_of(decision)
            counts[reference or "unlabelled"] += 1
            if label is None and labelled_only:
                continue
            row: dict[str, Any] = {"id": decision.decision_id, "options": decision.options,
                                   "proba": decision.proba, "label": label}
            if reference_slow and reference is not None:
                row["reference"] = reference
            row.update({k: v for k, v in (("signature", decision.signature),
                                          ("fingerprint", decision.fingerprint),
                                          ("text", decision.text)) if v})
            written[0] += 1
            yield row
        if reference_slow and not counts["human"] + counts["slow"]:  # nothing is renamed in
            raise PredictionsError(path, None, "label", f"none of the {sum(counts.values())} "
                                   "decisions has a reference label (no /v1/feedback label, no "
                                   "audit, no answer from the slow model): run in shadow mode "
                                   "first")

    written = [0]
    write_predictions(Path(out_path), rows())
    if tally is not None:
        tally.update(counts)
    return written[0]


def _exportable(decision: DecisionRecord) -> bool:
    return decision.proba is not None and bool(decision.options)


def _question(decision: DecisionRecord) -> str:
    """What one predictions file may hold: the signature, else the ordered options."""
    return decision.signature or json.dumps(decision.options)


def _labeller(labels: LabelJoin, *, audit_labels: bool, reference_slow: bool
              ) -> Callable[[DecisionRecord], tuple[str | None, LabelSource | None]]:
    """A decision's exported label and where it came from: a human label, else (with audit
    labels or the slow reference) its audit's, else (the slow reference) the slow model's own
    answer to an escalated decision. A label that is not one of the options is no label."""

    def label_of(decision: DecisionRecord) -> tuple[str | None, LabelSource | None]:
        joined = labels.label(decision.decision_id, audits=audit_labels or reference_slow)
        if joined is None and reference_slow and decision.escalated and decision.answer:
            joined = decision.answer, "slow"
        if joined is None or joined[0] not in decision.options:
            return None, None
        return joined

    return label_of
