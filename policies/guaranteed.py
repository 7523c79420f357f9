"""The policy object, in the shape of MAPIE's risk controllers: ``GuaranteedPolicy(**options)``
(``TuneOptions``, validated at ``fit``), ``fit(proba, y_true)`` on labelled fast-read
probabilities, ``decide(scores)`` on one read, ``to_file`` / ``from_file`` for the policy file
(``policies.file.PolicyFile``, serialisation only).

Two ways to keep the threshold's rows unseen by the calibrator. Without ``folds`` the labelled
rows are split with a fixed seed: one part fits the calibrator, the other chooses the threshold
(``calibration.risk.guaranteed_threshold``). With ``folds`` (out-of-fold reads, each row read by a
model that never saw it, ``slotgate train --cv``) the calibrator is cross-fitted over the same
folds, so every row both calibrates and chooses the threshold. With ``max_escalation`` the
guaranteed threshold still stands; the rule becomes a ``BudgetRule`` around it (see its docstring
for what happens once the budget is used up). With ``per_answer_floor`` each answer also gets its
own bar (``policies.answer_floor``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Self

import numpy as np
from numpy.typing import ArrayLike, NDArray
from pydantic import BaseModel, ConfigDict, Field, field_validator

from calibration.calibrators import calibrator_kinds, make_calibrator
from calibration.risk import budget_threshold, guaranteed_threshold
from policies.answer_floor import AnswerBar, per_answer_bars
from policies.rules import BudgetRule, EscalationWindow, Rule, ThresholdRule
from policies.specs import BudgetRuleSpec, OpenUnit, TargetAccuracy, Unit
from policies.types import OptionScores, Verdict

if TYPE_CHECKING:
    from pathlib import Path

    from calibration.base import Calibrator
    from policies.file import PolicyFile
    from policies.scope import Question

FloatArray = NDArray[np.float64]
__all__ = ["GuaranteeOptions", "GuaranteedPolicy", "TuneOptions", "answer_confidence",
           "split_rows"]


class GuaranteeOptions(BaseModel):
    """The parameters every guaranteed policy is tuned with (one tier or a cascade), validated
    once at ``fit``; a bad value names its field (the CLI turns the field into its flag)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    calibrator: str = "temperature"
    target_accuracy: TargetAccuracy = 0.95
    delta: OpenUnit = 0.05
    calibration_fraction: OpenUnit = 0.5
    seed: int = 0

    @field_validator("calibrator")
    @classmethod
    def _known_calibrator(cls, value: str) -> str:
        kinds = calibrator_kinds()
        if value not in kinds:
            raise ValueError(f"must be one of {', '.join(sorted(kinds))}, got {value!r}")
        return value


class TuneOptions(GuaranteeOptions):
    """A one-tier policy's parameters: an escalation budget and per-answer bars besides."""

    max_escalation: Unit | None = None
    budget_window: int = Field(default=1000, ge=1)
    per_answer_floor: TargetAccuracy | None = None


class GuaranteedPolicy:
    """A calibrator and a rule whose threshold carries a finite-sample accuracy guarantee, fit
    like a scikit-learn estimator and run on one read at a time.

    ``__init__`` stores ``TuneOptions`` fields (``params``), validated by ``check_params`` at
    ``fit``. ``fit(proba, y_true, options=..., folds=...)`` learns, into attributes ending in
    ``_``: ``params_`` (the validated options), ``calibrator_`` (fitted), ``rule_``, ``options_``,
    ``risk_`` (the threshold search's result at ``target_accuracy``), ``answer_bars_`` (per
    answer, with ``per_answer_floor``), and the evidence over the threshold rows:
    ``proba_before_``, ``proba_after_``, ``y_true_``, ``answers_``, ``confidence_``,
    ``correct_``, ``accepted_`` (under ``rule_``), ``coverage_``, ``escalation_rate_``,
    ``budget_threshold_``, ``budget_exceeded_``, ``n_calibration_``, ``n_folds_`` (None when
    split). ``from_file`` gives a policy with ``params_``, ``calibrator_``, ``rule_``,
    ``options_`` and ``file_`` (the file it was read from; its evidence is the file's).
    ``policy_id`` names it in decision logs: the file's id, "unsaved" before one is written.
    """

    policy_id = "unsaved"
    options_: tuple[str, ...] | None
    file_: PolicyFile | None = None

    def __init__(self, **params: Any) -> None:
        self.params = params

    def get_params(self) -> dict[str, Any]:
        return dict(self.params)

    def check_params(self) -> TuneOptions:
        """The parameters, validated (pydantic ValidationError naming the field); ``fit`` calls
        it first, a caller may call it before reading any data."""
        return TuneOptions.model_validate(self.params)

    @classmethod
    def from_parts(cls, calibrator: Calibrator, rule: Rule, *, policy_id: str,
                   params: TuneOptions | None = None) -> GuaranteedPolicy:
        """A runnable policy from a fitted calibrator and a rule (the router's fallback for
        decisions no tuned policy covers: no guarantee behind it)."""
        policy = cls()
        policy.params_ = params if params is not None else TuneOptions()
        policy.calibrator_, policy.rule_, policy.options_ = calibrator, rule, None
        policy.policy_id = policy_id
        return policy

    @classmethod
    def from_file(cls, source: PolicyFile | Path) -> GuaranteedPolicy:
        """The policy a file holds (a path is read with ``load_policy``: errors name the field),
        its calibrator and rule built once."""
        from policies.file import PolicyFile, load_policy

        file = source if isinstance(source, PolicyFile) else load_policy(source)
        policy = cls.from_parts(file.calibrator.build(), file.rule.build(),
                                policy_id=file.policy_id, params=_tuned_with(file))
        policy.options_ = None if file.options is None else tuple(file.options)
        policy.file_ = file
        return policy

    def calibrate(self, scores: OptionScores) -> list[float]:
        calibrated = self.calibrator_.transform(np.asarray([scores.proba], dtype=np.float64))
        return [float(p) for p in calibrated[0]]

    def decide(self, scores: OptionScores, *, escalations: int = 0
               ) -> tuple[Verdict, list[float]]:
        """The verdict on the raw argmax (the fast answer), and the calibrated probabilities of
        every option. Pure: ``escalations`` is the caller's ``EscalationWindow`` count (a budget
        rule reads it; the caller records the verdict in its window)."""
        calibrated = self.calibrate(scores)
        verdict = self.rule_.verdict(scores.options, calibrated, scores.top_index,
                                     escalations=escalations)
        return verdict, calibrated

    def escalation_window(self) -> EscalationWindow | None:
        """A fresh window for a caller that runs this policy on a stream of decisions (None: its
        rule has no budget, nothing to count)."""
        rule = self.rule_
        return EscalationWindow(rule.window) if isinstance(rule, BudgetRule) else None

    def __repr__(self) -> str:
        rule = getattr(self, "rule_", None)
        return (f"GuaranteedPolicy({self.policy_id!r}, "
                f"rule={None if rule is None else rule.to_dict()!r})")

    def fit(self, proba: ArrayLike, y_true: ArrayLike, *, options: Sequence[str] | None = None,
            folds: ArrayLike | None = None) -> Self:
        """Fit the calibrator and choose the rule. ``options`` names the columns (default "0",
        "1", ...); ``folds``: the rows are out-of-fold reads, cross-fit over these folds."""
        params = self.params_ = self.check_params()
        proba = np.asarray(proba, dtype=np.float64)
        labels = np.asarray(y_true, dtype=np.int64)
        if proba.ndim != 2:
            raise ValueError(f"proba must be 2-D (n_samples, n_options), got shape {proba.shape}")
        self.options_ = names = tuple(options) if options is not None else tuple(
            str(j) for j in range(proba.shape[1]))
        if len(names) != proba.shape[1]:
            raise ValueError(f"options names {len(names)} options but proba has "
                             f"{proba.shape[1]} columns")
        if folds is None:
            cal_rows, tune_rows = split_rows(len(labels), seed=params.seed,
                                             calibration_fraction=params.calibration_fraction)
            self.calibrator_ = make_calibrator(params.calibrator).fit(proba[cal_rows],
                                                                      labels[cal_rows])
            self.proba_before_, self.y_true_ = proba[tune_rows], labels[tune_rows]
            self.proba_after_ = self.calibrator_.transform(self.proba_before_)
            self.n_calibration_, self.n_folds_ = len(cal_rows), None
        else:
            from calibration.crossfit import check_folds, crossfit_calibrated

            fold_ids = np.asarray(folds, dtype=np.int64)
            self.n_folds_ = check_folds(fold_ids, n_samples=len(labels))
            self.proba_after_ = crossfit_calibrated(proba, labels, fold_ids,
                                                    calibrator=params.calibrator)
            # The policy keeps a calibrator fit on all rows (the one that serves).
            self.calibrator_ = make_calibrator(params.calibrator).fit(proba, labels)
            self.proba_before_, self.y_true_ = proba, labels
            self.n_calibration_ = len(labels)
        self._choose(params, names)
        return self

    def _choose(self, params: TuneOptions, options: tuple[str, ...]) -> None:
        """The guaranteed threshold on the calibrated threshold rows, and the rule around it."""
        self.answers_, self.confidence_ = answer_confidence(self.proba_before_, self.proba_after_)
        self.correct_ = self.answers_ == self.y_true_
        self.risk_ = guaranteed_threshold(self.confidence_, self.correct_,
                                          target_accuracy=params.target_accuracy,
                                          delta=params.delta)
        self.answer_bars_: list[AnswerBar] | None = None
        bars_rule = ThresholdRule(self.risk_.threshold)
        if params.per_answer_floor is not None:
            self.answer_bars_ = per_answer_bars(
                self.answers_, self.confidence_, self.correct_, options=options,
                floor=params.per_answer_floor, delta=params.delta, threshold=self.risk_.threshold)
            bars_rule = ThresholdRule(self.risk_.threshold,
                                      {b.option: b.bar for b in self.answer_bars_
                                       if b.bar != self.risk_.threshold})
        rule: Rule = bars_rule
        bars = np.array([_inf(bars_rule.bar(name)) for name in options])
        self.accepted_ = self.confidence_ >= bars[self.answers_]
        self.coverage_ = float(self.accepted_.mean())
        self.escalation_rate_ = 1.0 - self.coverage_
        self.budget_threshold_, self.budget_exceeded_ = None, False
        if params.max_escalation is not None:
            self.budget_threshold_ = budget_threshold(self.confidence_,
                                                      max_escalation=params.max_escalation)
            self.budget_exceeded_ = self.escalation_rate_ > params.max_escalation
            rule = BudgetRule(rule, max_escalation=params.max_escalation,
                              window=params.budget_window)
        self.rule_ = rule

    def to_file(self, *, name: str, data_hash: str, question: Question | None = None,
                logged_signature: str | None = None, backend_fingerprint: str = "unknown",
                guarantee: str = "accuracy", shadow: bool | None = None,
                audit_rate: float = 0.0, alarm_alpha: float = 0.05, **watch: Any) -> PolicyFile:
        """The policy file of this fitted policy, scoped to ``question`` over its options (or,
        tuned on rows exported from the decision log, to that ``logged_signature``; one of the
        two), with the monitoring settings given here (``watch``: further monitoring fields,
        ``on_alarm``, ``audit_boost``; left out, the file's defaults)."""
        from calibration.monitoring import reference_summary
        from policies.file import PolicyFile
        from policies.scope import scope_signature

        if (question is None) == (logged_signature is None):
            raise ValueError("a policy file is scoped to one question: pass question or "
                             "logged_signature (exactly one)")
        assert self.options_ is not None  # set by fit
        signature = (logged_signature if question is None
                     else scope_signature(self.options_, question))
        params = self.params_
        reference = reference_summary(self.confidence_, threshold=self.risk_.threshold,
                                      seed=params.seed)
        reference["accept_share"] = self.coverage_  # the rule's, per-answer bars included
        return PolicyFile.model_validate({
            "name": name, "signature": signature, "backend_fingerprint": backend_fingerprint,
            "calibrator": self.calibrator_.to_dict(), "rule": self.rule_.to_dict(),
            "target_accuracy": params.target_accuracy, "delta": params.delta,
            "bound": self.risk_.bound, "coverage": self.coverage_, "n_tune": self.risk_.n,
            "n_calibration": self.n_calibration_, "seed": params.seed,
            "max_escalation": params.max_escalation, "budget_threshold": self.budget_threshold_,
            "budget_exceeded": self.budget_exceeded_, "data_hash": data_hash,
            "tuning": "split" if self.n_folds_ is None else "cross-fitted",
            "n_folds": self.n_folds_, "guarantee": guarantee, "shadow": shadow,
            "audit_rate": audit_rate, "alarm_alpha": alarm_alpha, **watch,
            "reference": reference, "options": None if self.options_ is None else list(self.options_),
            "per_answer_floor": params.per_answer_floor,
            "question": None if question is None else question.as_dict(),
        })


def _tuned_with(file: PolicyFile) -> TuneOptions:
    """The options a policy file was tuned with, as far as it records them (the split's
    calibration share is not: the default stands in)."""
    rule = file.rule
    return TuneOptions(
        calibrator=file.calibrator.kind, target_accuracy=file.target_accuracy, delta=file.delta,
        seed=file.seed, max_escalation=file.max_escalation,
        budget_window=rule.window if isinstance(rule, BudgetRuleSpec) else 1000,
        per_answer_floor=file.per_answer_floor)


def _inf(bar: float | None) -> float:
    return np.inf if bar is None else bar


def split_rows(n: int, *, calibration_fraction: float, seed: int
               ) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """A seeded shuffle of ``range(n)`` cut into (calibration rows, threshold rows)."""
    if not 0.0 < calibration_fraction < 1.0:
        raise ValueError(f"calibration_fraction must be in (0, 1), got {calibration_fraction!r}")
    order = np.random.default_rng(seed).permutation(n)
    cut = round(n * calibration_fraction)
    if cut < 1 or cut > n - 1:
        raise ValueError(f"{n} labelled rows are too few to split for calibration and threshold")
    return order[:cut], order[cut:]


def answer_confidence(proba: FloatArray, calibrated: FloatArray
                      ) -> tuple[NDArray[np.int64], FloatArray]:
    """The raw argmax of each read and the calibrated probability of that option."""
    answers = proba.argmax(axis=1)
    return answers, calibrated[np.arange(len(answers)), answers]
