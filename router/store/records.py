"""The decision log's records, typed: one pydantic model per kind (decision, feedback, audit,
alarm), a union discriminated on ``type``, and the one encoder every writer uses. Readers go
through ``router.store.log_reader``; nothing else parses a log line.

Fields added later get defaults, so logs written by older versions still read; a line that
is not one of these records (a missing required field, a wrong type, a proba of the wrong
length) is *damaged* and skipped by the reader, counted, never raised."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

# What a decision id may be: the service writes uuid4 hex, feedback ids are checked to 128.
DecisionId = Annotated[str, Field(min_length=1)]
# What an alarm record says: a watch's alarm (drift, accuracy), a broken cost promise (cost:
# ``router.monitoring.cost``), or an operator's clear of a policy's alarms.
AlarmRecordKind = Literal["drift", "accuracy", "cost", "clear"]
FAST_ROUTES = ("fast", "cache")  # where a fast answer reached the caller (cache: a cached read)


class _Record(BaseModel):
    # Unknown fields (written by a newer version) are ignored, not kept: what a reader uses is
    # exactly what is declared here.
    model_config = ConfigDict(extra="ignore", frozen=True)


class DecisionRecord(_Record):
    """One routed decision: ``Decision.facts()`` plus what tuning needs of the read (options,
    raw ``proba`` or None when no fast read was routed on, the state ``text``)."""

    type: Literal["decision"] = "decision"
    decision_id: DecisionId
    time: float = 0.0
    namespace: str = ""
    question_id: str = ""
    answer: str | None = None
    route: str | None = None
    escalated: bool = False
    probability: float | None = None
    raw_probability: float | None = None
    threshold: float | None = None
    policy_id: str | None = None
    latency_ms: float | None = None
    note: str | None = None
    shadow: bool = False
    guarantee: str | None = None
    # A cascade's decision: the tier that answered and every tier read (``TierRead.facts``).
    tier: str | None = None
    tiers: list[dict[str, Any]] | None = None
    # A cascade's decision: each tier's raw read by tier name (``monitor`` judges it again).
    tier_proba: dict[str, list[float]] | None = None
    # What was promised for the answer served (``Receipt.facts``).
    receipt: dict[str, Any] | None = None
    signature: str | None = None
    fingerprint: str | None = None
    options: list[str] = Field(default_factory=list)
    proba: list[float] | None = None
    text: str | None = None

    @model_validator(mode="after")
    def _proba_matches_options(self) -> DecisionRecord:
        if self.proba is not None and len(self.proba) != len(self.options):
            raise ValueError(f"proba has {len(self.proba)} values for "
                             f"{len(self.options)} options")
        return self

    @property
    def served_fast(self) -> bool:
        """Whether the caller got the policy's accepted fast answer: what a label of this
        decision measures (``accepted``)."""
        return accepted(self.route, self.escalated)

    @classmethod
    def trusted(cls, **fields: Any) -> DecisionRecord:
        """The routing service's own record, built from values its types already checked
        (``Decision``, ``OptionScores``), so not validated again. Validation, and pydantic's
        ``model_construct`` alike, took ~20 us of each decision (77 options), twice what
        writing the line takes; this sets the fields directly (~2 us). Every reader
        validates; ``tests/router/store/test_log_reader.py`` checks it equals the validated
        record."""
        values = _DECISION_DEFAULTS.copy()  # every field, in order
        values.update(fields)
        if len(values) != len(_DECISION_DEFAULTS):
            raise TypeError(f"DecisionRecord has no field(s) "
                            f"{sorted(fields.keys() - _DECISION_DEFAULTS.keys())}")
        if values["options"] is None:
            values["options"] = []
        record = cls.__new__(cls)
        object.__setattr__(record, "__dict__", values)
        object.__setattr__(record, "__pydantic_fields_set__", set(fields))
        object.__setattr__(record, "__pydantic_extra__", None)
        object.__setattr__(record, "__pydantic_private__", None)
        return record


# Every field of a decision record in order, with its default (None where it is required or a
# factory's: ``trusted`` is given those).
_DECISION_DEFAULTS: dict[str, Any] = {
    name: None if info.is_required() or info.default_factory is not None else info.default
    for name, info in DecisionRecord.model_fields.items()}


class FeedbackRecord(_Record):
    """A human label (``POST /v1/feedback``) for a logged decision. ``trusted``: the labeller's
    key had the "trusted" role (``feedback.roles``); re-tuning and the replay read only trusted
    labels unless asked (``export-log --untrusted-labels``)."""

    type: Literal["feedback"] = "feedback"
    decision_id: DecisionId
    label: str
    time: float = Field(default_factory=time.time)
    # A record without the field was written when every label fed the alarm and the export:
    # it reads as trusted, as it was then.
    trusted: bool = True


class AuditRecord(_Record):
    """The slow model's answer to an accepted decision drawn for audit (router/monitoring)."""

    type: Literal["audit"] = "audit"
    decision_id: DecisionId
    policy_id: str | None = None
    label: str
    answer: str | None = None
    correct: bool | None = None
    # The draw probability of the audited decision (``router.monitoring.weighted``); None in a
    # record written before audits were drawn by risk: the replay takes it as a trusted label.
    probability: float | None = Field(default=None, gt=0.0, le=1.0)
    time: float = Field(default_factory=time.time)


class AlarmRecord(_Record):
    """A policy's monitoring alarm, raised here or latched from another replica (``shared``)."""

    type: Literal["alarm"] = "alarm"
    policy_id: str
    kind: AlarmRecordKind
    decision: int
    time: float
    detail: str
    on_alarm: str | None = None
    shared: bool = False


LogRecord = Annotated[DecisionRecord | FeedbackRecord | AuditRecord | AlarmRecord,
                      Field(discriminator="type")]
LabelRecord = FeedbackRecord | AuditRecord
RECORD_TYPES = ("decision", "feedback", "audit", "alarm")
record_adapter: TypeAdapter[LogRecord] = TypeAdapter(LogRecord)


class DecisionView(_Record):
    """What ``DecisionLog.get`` returns of a decision: all ``/v1/feedback`` and the monitor
    need (never the text or the read)."""

    decision_id: str
    options: tuple[str, ...]
    answer: str | None = None
    namespace: str = ""
    policy_id: str | None = None
    route: str | None = None
    escalated: bool = False

    @property
    def served_fast(self) -> bool:
        return accepted(self.route, self.escalated)


def accepted(route: str | None, escalated: bool) -> bool:
    """The one rule for "the policy accepted this logged decision": its fast answer (fresh or a
    cached read) was served. Labels of these decisions are what the accuracy promise is about;
    a replay asks the policy itself instead (``router.monitoring.replay.verdict_on``)."""
    return route in FAST_ROUTES and not escalated


def encode(record: DecisionRecord | FeedbackRecord | AuditRecord | AlarmRecord) -> bytes:
    """A record's JSON (no newline), serialised once for the file, the index and Redis alike.
    orjson on the fields (plain values: strings, numbers, lists) writes the bytes pydantic's
    serialiser does in a third of the time; pydantic's serialiser is the fallback for what
    orjson refuses (integers past 64 bits)."""
    try:  # numpy scalars: a trusted record may hold a backend's own floats
        return orjson.dumps(record.__dict__, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError:  # orjson.JSONEncodeError
        return record.model_dump_json().encode()


def as_decision(record: DecisionRecord | dict[str, Any]) -> DecisionRecord:
    """A decision record, validated when it came as a mapping (older callers, tests)."""
    if isinstance(record, DecisionRecord):
        return record
    return DecisionRecord.model_validate({**record, "type": "decision"})
