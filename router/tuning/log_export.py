"""Production traffic back into tuning: the decision logs joined with their feedback (and,
optionally, audit) labels into the predictions format ``slotgate tune`` reads
(``slotgate export-log``). The records come from the replicas' JSONL files, from the Redis
stream they all write to, or both."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from router.store.decision_log import read_records
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
    ``signature``. Decisions without a fast read (no proba) are left out; the latest feedback
    label (by its time) wins; a record repeated (at-least-once delivery) counts once. With
    ``audit_labels``, a decision with no feedback takes its audit's label (the slow model's
    answer): a policy tuned on those promises agreement with the slow model. ``redis_stream``
    (url, stream name) adds the records of the Redis stream every replica writes to (what it
    still holds: see docs/reliability.md on Redis restarts).

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
    decisions: dict[str, dict[str, Any]] = {}
    labels: dict[str, tuple[float, str]] = {}  # decision id -> (time, label)
    audits: dict[str, str] = {}  # decision id -> the slow model's answer (router/monitoring)
    records: Iterator[dict[str, Any]] = (r for p in paths for r in read_records(p))
    if redis_stream is not None:
        records = _chain(records, read_stream(*redis_stream))
    for record in records:
        decision_id = str(record["decision_id"])
        if record.get("type") == "audit":
            audits[decision_id] = str(record["label"])
        elif record.get("type") == "feedback":
            at = float(record.get("time") or 0.0)
            if decision_id not in labels or at >= labels[decision_id][0]:
                labels[decision_id] = (at, str(record["label"]))
        elif record.get("proba") is not None and record.get("options"):
            decisions[decision_id] = record
    by_signature: dict[str, list[str]] = {}
    for decision_id, record in decisions.items():
        by_signature.setdefault(_question(record), []).append(decision_id)
    if signature is None and len(by_signature) > 1:
        listing = ", ".join(f"{s} ({len(ids)} decisions)" for s, ids in
                            sorted(by_signature.items(), key=lambda kv: -len(kv[1])))
        raise PredictionsError(path, None, "signature", f"the log holds {len(by_signature)} "
                               f"different questions; choose one with --signature: {listing}")
    chosen = by_signature.get(signature, []) if signature else next(iter(by_signature.values()), [])
    rows = []
    counts = {"human": 0, "slow": 0, "unlabelled": 0}
    for decision_id in chosen:
        record = decisions[decision_id]
        label, reference = None, None
        if decision_id in labels:  # a human label wins
            label, reference = labels[decision_id][1], "human"
        elif (audit_labels or reference_slow) and decision_id in audits:
            label, reference = audits[decision_id], "slow"
        elif reference_slow and record.get("escalated"):
            label, reference = record.get("answer"), "slow"
        if label not in record["options"]:
            label, reference = None, None
        counts[reference or "unlabelled"] += 1
        row = {"id": decision_id, "options": list(record["options"]),
               "proba": [float(p) for p in record["proba"]], "label": label}
        if reference_slow and reference is not None:
            row["reference"] = reference
        row.update({k: record[k] for k in ("signature", "fingerprint", "text") if record.get(k)})
        if row["label"] is not None or not labelled_only:
            rows.append(row)
    if tally is not None:
        tally.update(counts)
    if reference_slow and not counts["human"] + counts["slow"]:
        raise PredictionsError(path, None, "label", f"none of the {len(chosen)} decisions has a "
                               "reference label (no /v1/feedback label, no audit, no answer from "
                               "the slow model): run in shadow mode first")
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    write_predictions(Path(out_path), rows)
    return len(rows)


def _question(record: dict[str, Any]) -> str:
    """What one predictions file may hold: the signature, else the ordered options."""
    return str(record.get("signature") or json.dumps(record["options"]))


def read_stream(url: str, stream: str, *, chunk: int = 1000) -> Iterator[dict[str, Any]]:
    """Every record of the decision log's Redis stream, oldest first, read in chunks."""
    import orjson
    import redis

    client: Any = redis.Redis.from_url(url)  # redis-py's sync stubs type replies loosely
    try:
        start = "-"
        while True:
            entries = client.xrange(stream, min=start, max="+", count=chunk)
            for _, fields in entries:
                record = orjson.loads(fields[b"data"])
                if isinstance(record, dict) and record.get("decision_id"):
                    yield record
            if len(entries) < chunk:
                return
            start = "(" + entries[-1][0].decode()  # exclusive: after the last one read
    finally:
        client.close()


def _chain(*parts: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for part in parts:
        yield from part
