"""Production traffic back into tuning: the decision logs joined with their feedback (and,
optionally, audit) labels into the predictions format ``slotgate tune`` reads
(``slotgate export-log``). The records come from the replicas' JSONL files, from the Redis
stream they all write to, or both."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from policies.scope import Question, scope_signature
from router.store.log_join import LabelJoin, LabelSource, distinct_decisions
from router.store.log_reader import AnyRecord, read_logs
from router.store.records import DecisionRecord
from router.tuning.predictions import PredictionsError, write_predictions

if TYPE_CHECKING:
    from router.settings import Settings


def export_predictions(source: Settings | Path | str | Sequence[Path | str], out_path: Path | str,
                       *, signature: str | None = None, default: str | None = None,
                       labelled_only: bool = False, audit_labels: bool = False,
                       untrusted_labels: bool = False,
                       redis_stream: tuple[str, str] | None = None, reference_slow: bool = False,
                       tally: dict[str, int] | None = None,
                       chosen: dict[str, str] | None = None) -> int:
    """Join JSONL decision logs with their feedback into the predictions format (id, options,
    raw proba, label or null, signature, fingerprint, text); returns the rows written. Several
    logs (one per replica) are joined as one: feedback sent to replica B for a decision made on
    A is in B's file. Decisions without a fast read (no proba) are left out; labels are joined by
    ``router.store.log_join`` (a human label wins, then the latest by time); a decision id
    repeated (a log appended twice, at-least-once delivery) counts once. With
    ``audit_labels``, a decision with no feedback takes its audit's label (the slow model's
    answer): a policy tuned on those promises agreement with the slow model. Labels posted with
    a key without the "trusted" role (``feedback.roles``) are left out unless
    ``untrusted_labels``: a client's wrong labels must not re-tune the policy. ``redis_stream``
    (url, stream name) adds the records of the Redis stream every replica writes to (what it
    still holds: see docs/reliability.md on Redis restarts). The logs are streamed twice
    (labels first, then the rows): memory holds labels and ids, never the records.

    A predictions file holds one question: the decisions a policy file's ``signature`` covers
    (``signature``, in any form a policy file holds it: ``policies.scope``), else, when the log
    holds several questions, those ``default`` covers (the configured default policy's
    signature), else the log's one question. Rows carry the signature of what was exported
    (the logged request's own when they share one), so ``slotgate tune`` on them writes a
    policy for that question. A log of several questions and no choice is bad input (field
    'signature') listing each question's scope signature; ``chosen`` receives the signature
    exported ("signature") and the listing of the other questions ("others", "" for none).

    ``reference_slow`` (``export-log --reference slow``, the shadow-mode path): a decision with
    no feedback takes the slow model's answer as its label: its audit's, else the answer it was
    served when that came from the slow model (shadow mode, or an escalation). Rows say where
    their label came from (``reference``: "human" | "slow"); ``tally`` receives the counts
    (human, slow, unlabelled, and "untrusted": the decisions an untrusted key labelled, left
    out or joined). No reference label at all is bad input (field 'label'), and
    nothing is written. Escalations alone are labelled only below the threshold, a biased
    sample; a shadow-mode log labels every decision."""
    paths = _log_paths(source)
    path: Path | str = paths[0] if paths else f"{redis_stream[1] if redis_stream else '?'}"

    def records(*, quiet: bool = False) -> Iterator[AnyRecord]:
        return read_logs(paths, redis_stream=redis_stream, quiet=quiet)

    labels = LabelJoin(untrusted=untrusted_labels)
    questions = _logged_questions(records(), labels)
    wanted, matching = _chosen_question(questions, path, signature=signature, default=default)
    row_signature = _row_signature(matching, wanted)
    if chosen is not None:
        others = [q for q in questions.values() if q not in matching]
        chosen.update(signature=row_signature or "", others=_listing(others))
    rows = _Rows(path, wanted=wanted, signature=row_signature,
                 label_of=_labeller(labels, audit_labels=audit_labels,
                                    reference_slow=reference_slow),
                 labelled_only=labelled_only, reference_slow=reference_slow)
    # The second pass: damage was warned of once, by the first.
    write_predictions(Path(out_path), rows.of(distinct_decisions(records(quiet=True))))
    if tally is not None:
        tally.update(rows.counts, untrusted=labels.untrusted)
    return rows.written


def _log_paths(source: Settings | Path | str | Sequence[Path | str]) -> list[Path]:
    if isinstance(source, str | Path):
        return [Path(source)]
    if isinstance(source, Sequence):
        return [Path(p) for p in source]
    return [source.log.decision_log_path]


def _logged_questions(records: Iterable[AnyRecord], labels: LabelJoin) -> dict[str, _Question]:
    """The first pass over the logs: every record's label into ``labels``, and each question
    (named scope) the exportable decisions answer, as first seen, counted once per decision."""
    questions: dict[str, _Question] = {}
    seen: set[str] = set()
    for record in records:
        labels.add(record)
        if (isinstance(record, DecisionRecord) and record.decision_id not in seen
                and _exportable(record)):
            seen.add(record.decision_id)
            scopes = record_scopes(record)
            question = questions.setdefault(scopes[1], _Question(record))
            question.decisions += 1
            question.logged.add(scopes[0])
    return questions


def _chosen_question(questions: dict[str, _Question], path: Path | str, *,
                     signature: str | None, default: str | None
                     ) -> tuple[str | None, list[_Question]]:
    """The signature to export (None: the log's one question) and the logged questions it
    covers: ``signature``, else with several questions the ``default``'s; bad input (field
    'signature') when neither chooses among several, or the choice answers none."""
    wanted = signature
    if wanted is None and len(questions) > 1:
        if default is None or not any(q.covers(default) for q in questions.values()):
            raise PredictionsError(path, None, "signature", f"the log holds {len(questions)} "
                                   "different questions; choose one with --signature: "
                                   + _listing(questions.values()))
        wanted = default
    matching = [q for q in questions.values() if wanted is None or q.covers(wanted)]
    if wanted is not None and questions and not matching:
        raise PredictionsError(path, None, "signature", f"no logged decision answers {wanted}; "
                               f"the log holds: {_listing(questions.values())}")
    return wanted, matching


def _row_signature(matching: list[_Question], wanted: str | None) -> str | None:
    """The signature the rows carry: the logged requests' own when they share one, else the
    one asked for, else the named scope of the log's question."""
    logged = {s for q in matching for s in q.logged if wanted is None or wanted in (s, q.named)}
    if len(logged) == 1:
        return next(iter(logged))
    return wanted or (matching[0].named if matching else None)


class _Rows:
    """The predictions rows of the chosen question's decisions, counting their labels by where
    they came from (``counts``) and the rows written (``written``)."""

    def __init__(self, path: Path | str, *, wanted: str | None, signature: str | None,
                 label_of: Callable[[DecisionRecord], tuple[str | None, LabelSource | None]],
                 labelled_only: bool, reference_slow: bool) -> None:
        self.path = path
        self.wanted = wanted
        self.signature = signature
        self.label_of = label_of
        self.labelled_only = labelled_only
        self.reference_slow = reference_slow
        self.counts = {"human": 0, "slow": 0, "unlabelled": 0}
        self.written = 0

    def of(self, decisions: Iterable[DecisionRecord]) -> Iterator[dict[str, Any]]:
        """One row per exported decision; with the slow reference, no reference label at all is
        bad input (field 'label'), raised before the file is renamed in."""
        for decision in decisions:
            if not _exportable(decision) or (self.wanted is not None
                                             and self.wanted not in record_scopes(decision)):
                continue
            label, reference = self.label_of(decision)
            self.counts[reference or "unlabelled"] += 1
            if label is None and self.labelled_only:
                continue
            self.written += 1
            yield self._row(decision, label, reference)
        if self.reference_slow and not self.counts["human"] + self.counts["slow"]:
            raise PredictionsError(self.path, None, "label", f"none of the "
                                   f"{sum(self.counts.values())} decisions has a reference "
                                   "label (no /v1/feedback label, no audit, no answer from the "
                                   "slow model): run in shadow mode first")

    def _row(self, decision: DecisionRecord, label: str | None,
             reference: LabelSource | None) -> dict[str, Any]:
        row: dict[str, Any] = {"id": decision.decision_id, "options": decision.options,
                               "proba": decision.proba, "label": label}
        if self.reference_slow and reference is not None:
            row["reference"] = reference
        row.update({k: v for k, v in (("signature", self.signature),
                                      ("fingerprint", decision.fingerprint),
                                      ("text", decision.text)) if v})
        return row


def _exportable(decision: DecisionRecord) -> bool:
    return decision.proba is not None and bool(decision.options)


def record_scopes(decision: DecisionRecord) -> tuple[str, str]:
    """The policy signatures that cover a logged decision: the request's own signature (a
    policy tuned on rows exported from the log) and the scope of its question asked by name
    alone (``slotgate tune --question ID``: no instructions, context or option descriptions,
    which the log does not keep)."""
    named = _named_scope(decision.question_id, tuple(decision.options))
    return decision.signature or named, named


@lru_cache(maxsize=1024)  # a log holds few questions, each logged many times
def _named_scope(question_id: str, options: tuple[str, ...]) -> str:
    try:
        question = Question.asked(question_id or "question")
    except ValueError:  # an id a person could not name on the command line
        return ""
    return scope_signature(options, question)


class _Question:
    """One logged question (a named scope): its first decision, how many, their signatures."""

    def __init__(self, first: DecisionRecord) -> None:
        self.first = first
        _, self.named = record_scopes(first)
        self.decisions = 0
        self.logged: set[str] = set()

    def covers(self, signature: str) -> bool:
        return signature == self.named or signature in self.logged

    def describe(self) -> str:
        options = self.first.options
        shown = ", ".join(options[:3]) + (", ..." if len(options) > 3 else "")
        return (f"{self.named} (question {self.first.question_id!r} over "
                f"{len(options)} options: {shown}; {self.decisions} decisions)")


def _listing(questions: Iterable[_Question]) -> str:
    return "; ".join(q.describe() for q in sorted(questions, key=lambda q: -q.decisions))


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


def default_policy(settings: Settings) -> tuple[str, str] | None:
    """The signature of the question the configured default policy answers, and its name
    (``policy.default``, else the one policy file); None when there is none to read."""
    from policies.file import PolicyFileError, load_policy

    files = settings.policy.files
    for path in files:
        try:
            policy = load_policy(path)
        except PolicyFileError:
            continue  # export reads the log; a missing or bad policy file only loses the default
        if policy.signature is not None and settings.policy.default in (policy.name, None) and (
                settings.policy.default is not None or len(files) == 1):
            return policy.signature, policy.name
    return None
