"""The versioned policy file that ``slotgate tune`` writes and the router loads: the calibrator,
the acceptance rule, and the evidence behind them (target, delta, bound, coverage, data hash,
backend fingerprint). Validated on load; errors name the file and the field."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from calibration.artifacts import atomic_path
from policies.scope import (
    SCOPE_PREFIX,
    Question,
    question_recorded,
    scope_signature,
    verbatim_signature,
)
from policies.specs import (
    CalibratorSpec,
    OpenUnit,
    RuleSpec,
    TargetAccuracy,
    ThresholdRuleSpec,
    Unit,
    guaranteed_threshold_of,
)
from policies.types import QuestionKind, canonical_hash

POLICY_FORMAT = "slotgate/policy"
# Version 4 records the question it was tuned for (``question``, with its hash in the scope
# ``signature``). Version 3 records how its id is hashed (``id_layout``) and stores the threshold
# once, in the rule. Versions 1 (a top-level copy of the threshold as well, checked against the
# rule), 2 (no ``id_layout``: theirs is "v1") and 3 are upgraded as they are read, with
# ``question`` null: "question unrecorded", which the router refuses to serve (re-tune them).
POLICY_VERSION = 4
READABLE_VERSIONS = (1, 2, 3, 4)
# How ``policy_id`` hashes a file, by name. "v1": the fields of a version 1 file (version 1, the
# threshold at the top level, the fields added since only when set), leaving out the creation
# time, shadow, the monitoring fields and ``id_layout``. Every file so far has it, so ids
# survived the format's changes (alarms are keyed by them); a new layout gets a new name, and
# files keep the one they were written with.
IdLayout = Literal["v1"]
# audit_then_escalate (default): a drift alarm raises the audit rate to audit_boost, an accuracy
# alarm escalates; escalate_all: any alarm escalates; alert_only: never acts (docs/monitoring.md).
OnAlarm = Literal["audit_then_escalate", "escalate_all", "alert_only"]
# How the policy is watched in production, not what it decides: left out of ``policy_id``, so
# changing them keeps a policy's identity (and its alarm) while re-tuning gives a new one.
MONITORING_FIELDS = frozenset({"audit_rate", "on_alarm", "alarm_alpha", "reference",
                               "audit_boost", "on_cost_alarm"})
# Fields added after version 1, hashed only when set: older files keep their ids.
LATER_FIELDS = ("options", "per_answer_floor", "question", "cascade", "cost_promise")
# Fields added after digests were, digested only when set: older files keep their digests.
LATER_DIGESTED = ("cost_promise",)
# What an operator edits in a tuned file on purpose (docs/calibration.md): its mode and how it
# is watched. Every other field is what tuning produced, and ``digest`` covers it.
OPERATOR_FIELDS = frozenset({"shadow", "audit_rate", "on_alarm", "alarm_alpha", "audit_boost",
                             "on_cost_alarm", "created_at", "digest", "hmac"})
# What the router does once the live check finds the cost promise broken
# (``router.monitoring.cost``): alert_only (default) raises the alarm; serve_unverified also
# serves the fast answer, marked unverified, where the policy would escalate.
OnCostAlarm = Literal["alert_only", "serve_unverified"]


class PolicyFileError(ValueError):
    """A policy file that cannot be used; the message names the file and the field."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class ReferenceSummary(BaseModel):
    """What drift monitoring keeps of the threshold rows (``calibration.monitoring``): their
    confidences on the ranking grid, sorted, and the share the policy accepted."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    n: int = Field(ge=1)
    accept_share: float = Field(ge=0, le=1)
    confidence: list[float]

    @field_validator("confidence")
    @classmethod
    def _confidences(cls, value: list[float]) -> list[float]:
        if not value:
            raise ValueError("no confidences: the drift test needs the tuning rows'")
        if any(not 0.0 <= v <= 1.0 for v in value):
            raise ValueError("confidences must be in [0, 1]")
        return value


class QuestionRecord(BaseModel):
    """The question a policy was tuned for, as a person reads it (``policies.scope.Question``:
    where each field comes from on each surface)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1)
    instructions: str = ""
    context: str = ""
    kind: QuestionKind = "choice"

    def question(self) -> Question:
        return Question.asked(self.id, instructions=self.instructions, context=self.context,
                              kind=self.kind)


class TierSpec(BaseModel):
    """One fast tier of a cascade: the backend it was tuned on (its ``name`` in the settings,
    ``fast.name`` for the first, and its fingerprint), its calibrator and threshold (None: the
    tier is not read), the cost each read of it was given at tuning, the share of the
    threshold rows it answered, and its drift reference."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    backend_fingerprint: str = "unknown"
    calibrator: CalibratorSpec
    threshold: Unit | None
    cost: float = Field(ge=0)
    coverage: Unit
    # Its confidences on the threshold rows it read, and the share it accepted: what a replay
    # compares its live reads with (``slotgate monitor``); None when it is not read.
    reference: ReferenceSummary | None = None


class CostPromiseRecord(BaseModel):
    """The promise on cost tuning held the policy to (``calibration.block_cost``): the slow
    model answers more than ``share`` of a block of ``block`` consecutive decisions with
    probability at most ``delta``, blocks fixed, under exchangeability. The evidence, on the
    ``n`` threshold rows: ``n_escalated`` of them escalated, ``escalation_upper`` bounds the
    escalation probability (level delta / 2), ``block_bound`` the chance of a block past the
    share (<= delta). ``live_cap``: the escalation probability the live check tests against;
    ``coverage_alone``: the coverage the accuracy promise alone gave (the file's ``coverage``
    is the pair's)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    share: Unit
    block: int = Field(ge=1)
    delta: OpenUnit
    n: int = Field(ge=1)
    n_escalated: int = Field(ge=0)
    escalation_upper: Unit
    block_bound: Unit
    live_cap: OpenUnit
    coverage_alone: Unit

    @model_validator(mode="after")
    def _kept(self) -> CostPromiseRecord:
        if self.n_escalated > self.n:
            raise ValueError(f"field 'cost_promise.n_escalated' is {self.n_escalated}, more "
                             f"than its {self.n} rows")
        if self.block_bound > self.delta:
            raise ValueError(f"field 'cost_promise.block_bound' is {self.block_bound}, above "
                             f"its delta {self.delta}: the promise was not kept")
        return self

    def options(self) -> dict[str, Any]:
        """The ``PolicyOptions`` fields this promise was tuned with."""
        return {"cost_share": self.share, "cost_block": self.block, "cost_delta": self.delta}


class CascadeSpec(BaseModel):
    """The fast tiers of a cascade policy, in the order they read (``calibration.cascade``):
    a decision goes to the first tier read, each accepts when its calibrated top probability is
    >= its threshold, and what none accepts goes to the slow model. The file's ``bound``,
    ``coverage`` and ``reference`` are the whole cascade's; its ``calibrator``, ``rule`` and
    ``backend_fingerprint`` are the first tier's (what a one-tier reader sees).
    ``slow_coverage``: the share of threshold rows no tier accepted; ``expected_cost``: the mean
    cost of a decision on them (every tier read plus the slow model when it escalates);
    ``max_slow_share``: the cap tuning kept the slow share under (``slow_share_bound``: its upper
    bound at 1 - delta / 2)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tiers: list[TierSpec] = Field(min_length=2)
    slow_cost: float = Field(ge=0)
    slow_coverage: Unit
    expected_cost: float = Field(ge=0)
    max_slow_share: Unit | None = None
    slow_share_bound: float | None = None

    @field_validator("tiers")
    @classmethod
    def _distinct_names(cls, value: list[TierSpec]) -> list[TierSpec]:
        names = [tier.name for tier in value]
        if len(set(names)) != len(names):
            raise ValueError(f"tier names must be distinct, got {names}")
        return value


class PolicyFile(BaseModel):
    """What a tuned policy is and why it can be trusted.

    ``threshold`` (read from the rule, stored there only) is the guaranteed one (None: no
    threshold passed, everything escalates); ``per_answer_floor`` is set when tuning also gave
    each answer its own bar (``rule.per_option``) so that every answer's accepted accuracy is at
    least that floor (docs/calibration.md); ``bound`` is the Clopper-Pearson lower bound on accepted accuracy reached at it (level
    1 - delta) and ``coverage`` the share accepted, both on the ``n_tune`` threshold rows.
    ``max_escalation`` and ``budget_threshold`` are set when tuning had an escalation budget;
    ``budget_exceeded`` says the guarantee needed more escalation than the budget allows.
    ``tuning`` says how the rows were spent: "split" (``n_calibration`` rows fit the calibrator,
    ``n_tune`` others chose the threshold) or "cross-fitted" (out-of-fold reads over ``n_folds``
    folds; every row did both, see docs/calibration.md for what that assumes). ``guarantee``
    says what "accurate" means: agreement with a human label ("accuracy") or with the slow
    model's answer ("agreement_with_slow", tuned on a shadow-mode log). ``shadow``: every
    decision is also answered by the slow model, whose answer is served; the fast read is logged
    (None: follow the server's ``policy.shadow``; left out of ``policy_id``: switching shadow
    off serves the same tuned policy).

    Monitoring (docs/monitoring.md): ``audit_rate`` is the seeded share of accepted decisions
    also sent to the slow model after the reply; ``on_alarm`` what an alarm does;
    ``alarm_alpha`` the false-alarm probability of the drift and accuracy alarms together;
    ``reference`` the tuning rows' summary (None in older files: no drift alarm);
    ``on_cost_alarm`` what the cost promise's live check does when it alarms.
    ``cost_promise``: the promise on the slow share of fixed blocks it was tuned to keep.

    Scope (``policies.scope``): ``question`` is the question the policy was tuned for and
    ``signature`` its hash with the option names (``scope-v2:``); a policy tuned on rows exported
    from the decision log keeps that logged question's own signature (exact: its kind, context,
    text and options in order) and records no ``question``. A file with neither (``question``
    null and a ``scope-v1:`` or null signature: written before questions were recorded) says
    "question unrecorded"; it can be evaluated, but the router refuses to serve it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["slotgate/policy"] = "slotgate/policy"
    version: int = POLICY_VERSION
    id_layout: IdLayout = "v1"
    name: str = Field(min_length=1)
    signature: str | None = None
    backend_fingerprint: str = "unknown"
    calibrator: CalibratorSpec
    rule: RuleSpec
    target_accuracy: TargetAccuracy
    delta: OpenUnit
    bound: Unit
    coverage: Unit
    n_tune: int = Field(ge=1)
    n_calibration: int = Field(ge=0)
    seed: int = 0
    max_escalation: Unit | None = None
    budget_threshold: float | None = None
    budget_exceeded: bool = False
    data_hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    tuning: Literal["split", "cross-fitted"] = "split"
    n_folds: int | None = Field(default=None, ge=2)
    guarantee: Literal["accuracy", "agreement_with_slow"] = "accuracy"
    shadow: bool | None = None
    audit_rate: Unit = 0.0
    on_alarm: OnAlarm = "audit_then_escalate"
    audit_boost: Unit = 0.75  # audit rate while a drift alarm stands (docs/monitoring.md)
    alarm_alpha: OpenUnit = 0.05
    on_cost_alarm: OnCostAlarm = "alert_only"
    reference: ReferenceSummary | None = None
    # The option names tuned on, in order (None in files written before it was recorded):
    # `slotgate eval` refuses predictions over other options.
    options: list[str] | None = None
    per_answer_floor: TargetAccuracy | None = None
    question: QuestionRecord | None = None
    # Several fast tiers under one guarantee (None: one fast tier, the calibrator and the rule).
    cascade: CascadeSpec | None = None
    # The promise on cost it was tuned to keep (None: none).
    cost_promise: CostPromiseRecord | None = None
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    # SHA-256 over what tuning produced (every field but ``OPERATOR_FIELDS``), written by
    # ``slotgate tune``: a file edited since is refused, or served without its guarantee
    # (``policy.on_edited``). ``hmac``: HMAC-SHA256 of the digest under the configured
    # ``policy.signing_key`` (signed policies). None in files written before digests were.
    digest: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    hmac: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")

    @field_validator("version")
    @classmethod
    def _known_version(cls, value: int) -> int:
        if value not in READABLE_VERSIONS:
            raise ValueError(f"unsupported policy file version {value}; this slotgate reads "
                             f"versions {', '.join(map(str, READABLE_VERSIONS))} "
                             "(re-run `slotgate tune`, or upgrade slotgate)")
        return value

    @model_validator(mode="before")
    @classmethod
    def _upgrade(cls, data: Any) -> Any:
        """A file of an older version becomes a current one. A top-level ``threshold`` (version
        1 files; older callers) must equal the rule's, and is not kept: the rule is where the
        bar lives."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if data.get("version") in (1, 2, 3):
            # Its id_layout: the default, "v1"; its question: none recorded (null).
            data["version"] = POLICY_VERSION
        if "threshold" not in data:
            return data
        threshold = data.pop("threshold")
        rule = data.get("rule")
        rule = rule.model_dump() if isinstance(rule, BaseModel) else rule
        while isinstance(rule, dict) and rule.get("kind") == "budget":
            rule = rule.get("base")
        in_rule = rule.get("threshold") if isinstance(rule, dict) else None
        if isinstance(rule, dict) and rule.get("kind") == "threshold" and threshold != in_rule:
            raise ValueError(f"field 'threshold' is {threshold!r} but the rule's threshold is "
                             f"{in_rule!r}; they must agree (the rule is where the bar lives)")
        return data

    @model_validator(mode="after")
    def _question_matches_signature(self, info: ValidationInfo) -> PolicyFile:
        """The readable question and the hashed scope must say the same: a hand-edited
        ``question`` must not widen or move what the policy answers. Validated with the context
        ``{"scope_unchecked": True}`` (``slotgate migrate``, which re-signs an older scope after
        its own checks), the file is read as it is."""
        if isinstance(info.context, dict) and info.context.get("scope_unchecked"):
            return self
        if self.question is None:
            if self.signature is not None and self.signature.startswith(SCOPE_PREFIX):
                raise ValueError(f"field 'question' is missing: signature {self.signature[:20]}"
                                 "... is a question's scope; the file must say which question")
            return self
        if not self.options:
            raise ValueError("field 'options' is missing: a recorded question needs the "
                             "options it was tuned on")
        try:
            expected = scope_signature(self.options, self.question.question())
        except ValueError as exc:
            raise ValueError(f"field 'question': {exc}") from exc
        if self.signature == expected:
            return self
        if self.signature == verbatim_signature(self.options, self.question.model_dump()):
            raise ValueError("field 'signature' hashes the question's texts as written, from "
                             "before question texts were held in canonical form; re-sign it "
                             "with `slotgate migrate --policy FILE` (docs/calibration.md, "
                             "\"Scope\")")
        raise ValueError(f"field 'signature' is {self.signature!r}, but the question "
                         f"{self.question.id!r} over the recorded options hashes to "
                         f"{expected!r}; re-tune rather than edit either")

    @model_validator(mode="after")
    def _cascade_starts_with_the_file(self) -> PolicyFile:
        """A cascade's first tier is what the file's top level says (calibrator, threshold rule,
        fingerprint): a one-tier reader of the file sees the first tier, not another."""
        if self.cascade is None:
            return self
        first = self.cascade.tiers[0]
        rule = self.rule
        if not isinstance(rule, ThresholdRuleSpec) or rule.per_option:
            raise ValueError("field 'rule': a cascade's rule is its first tier's single "
                             "threshold (no budget, margin or per-answer bars)")
        for field, top, tier in (("calibrator", self.calibrator, first.calibrator),
                                 ("threshold", rule.threshold, first.threshold),
                                 ("backend_fingerprint", self.backend_fingerprint,
                                  first.backend_fingerprint)):
            if top != tier:
                raise ValueError(f"field 'cascade.tiers.0.{field}' must equal the file's "
                                 f"{'rule threshold' if field == 'threshold' else field} "
                                 "(the first tier is the file's top level)")
        return self

    @property
    def question_unrecorded(self) -> bool:
        """Written before questions were recorded: its scope is an option set (and perhaps an
        id), not a question (``policies.scope.question_recorded``)."""
        return not question_recorded(self.signature)

    @property
    def threshold(self) -> float | None:
        """The guaranteed global bar (the rule's; None for a margin rule or when none passed)."""
        return guaranteed_threshold_of(self.rule)

    @property
    def policy_id(self) -> str:
        """The name plus a short hash of what the policy decides, in the file's ``id_layout``:
        re-tuning gives a new id; changing shadow or a monitoring field keeps it (and the
        alarms keyed by it)."""
        exclude = {"created_at", "shadow", "id_layout", "digest", "hmac", *MONITORING_FIELDS}
        exclude.update(name for name in LATER_FIELDS if getattr(self, name) is None)
        content = self.model_dump(mode="json", exclude=exclude)
        for tier in (content.get("cascade") or {}).get("tiers", ()):
            tier.pop("reference", None)  # a tier's drift reference is monitoring, as the file's
        content.update(version=1, threshold=self.threshold)  # the "v1" layout, the only one
        return f"{self.name}@{canonical_hash(content)[:12]}"

    def content_digest(self) -> str:
        """The digest of what tuning produced: every field but those an operator may edit."""
        exclude = set(OPERATOR_FIELDS)
        exclude.update(name for name in LATER_DIGESTED if getattr(self, name) is None)
        return canonical_hash(self.model_dump(mode="json", exclude=exclude))

    def sealed(self, signing_key: bytes | None = None) -> PolicyFile:
        """This file with its ``digest`` (and, given a key, its ``hmac``) written in."""
        digest = self.content_digest()
        return self.model_copy(update={
            "digest": digest,
            "hmac": None if signing_key is None else _hmac(signing_key, digest)})

    def integrity_problem(self, signing_key: bytes | None = None) -> str | None:
        """What is wrong with the file's seal (None: nothing): its content no longer matches
        its digest (edited since tuning), or, with a signing key configured, its ``hmac`` is
        missing or not the key's. A file without a digest (written before digests were) has no
        problem here unless a key is configured."""
        import hmac as hmac_module

        if self.digest is not None and self.digest != self.content_digest():
            return ("its content does not match its digest: it was edited after tuning (fields "
                    "other than " + ", ".join(sorted(OPERATOR_FIELDS - {"digest", "hmac"}))
                    + " are what tuning produced)")
        if signing_key is None:
            return None
        if self.digest is None or self.hmac is None:
            return "it is not signed, and policy.signing_key asks for signed policies"
        if not hmac_module.compare_digest(self.hmac, _hmac(signing_key, self.digest)):
            return "its hmac is not policy.signing_key's"
        return None

    def write(self, path: Path) -> None:
        """Write atomically (temporary file, then rename), as indented JSON."""
        with atomic_path(path) as tmp:
            tmp.write_text(self.model_dump_json(indent=2) + "\n", encoding="utf-8")


def _hmac(key: bytes, digest: str) -> str:
    import hashlib
    import hmac

    return hmac.new(key, digest.encode(), hashlib.sha256).hexdigest()


def load_policy(path: Path) -> PolicyFile:
    """Read and validate a policy file; every problem raises PolicyFileError naming the field."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise PolicyFileError(f"{path}: policy file not found") from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PolicyFileError(f"{path}: not a readable JSON file: {exc}") from exc
    except RecursionError as exc:  # the parser's own limit, near 1,000 levels
        raise PolicyFileError(f"{path}: not a readable JSON file: nested too deeply") from exc
    if not isinstance(data, dict):
        raise PolicyFileError(f"{path}: a policy file is a JSON object")
    if data.get("format") != POLICY_FORMAT:
        raise PolicyFileError(
            f"{path}: field 'format' is {data.get('format')!r}, expected {POLICY_FORMAT!r}",
            field="format")
    try:
        return PolicyFile.model_validate(data)
    except ValidationError as exc:
        field, message = first_error(exc)
        raise PolicyFileError(f"{path}: field {field!r}: {message}", field=field) from exc


def first_error(exc: ValidationError) -> tuple[str | None, str]:
    """The dotted field of a validation error's first problem and its message; a model-level
    error (no field) names the field its message starts with ("field 'threshold' ...")."""
    first = exc.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or None
    message = first["msg"].removeprefix("Value error, ")
    if field is None and message.startswith("field '"):
        field = message.split("'")[1]
    return field, message
