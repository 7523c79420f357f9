"""The one policy object, for one fast tier or a cascade of several, in the shape of MAPIE's
risk controllers: ``Policy(**options)`` (``PolicyOptions``, validated at ``fit``),
``fit(proba, y_true)`` on labelled reads (one array, or one per tier with ``tiers=``),
``to_file`` / ``from_file`` for the policy file.

Running it is two functions, both pure. ``step(k, scores)``: tier ``k``'s read of one decision
gives a ``Step``: accept here, climb to the next tier read, or escalate (the routing service
calls it, tier by tier). ``judge(probas)``: the same steps over labelled rows at once, giving
each row's answering tier (``eval``, ``monitor``'s replay, the benchmarks call it). A one-tier
policy is the cascade of one: its tier has no name of its own (it is the first configured
tier, whatever its name) and it may carry an escalation budget or per-answer bars."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self

import numpy as np
from numpy.typing import ArrayLike, NDArray

from policies.options import PolicyOptions, TierCost
from policies.rules import BudgetRule, EscalationWindow, Rule, ThresholdRule
from policies.types import OptionScores, Verdict

if TYPE_CHECKING:
    from pathlib import Path

    from calibration.base import Calibrator
    from policies.file import PolicyFile
    from policies.scope import Question

FloatArray = NDArray[np.float64]
__all__ = ["Judged", "Policy", "Step", "Tier", "TierCost"]


@dataclass(frozen=True, slots=True)
class Tier:
    """A fast tier as a decision meets it: its calibrator and acceptance rule, the backend
    fingerprint it was tuned on, the cost of one read, and whether it is read at all (a
    cascade's tier whose threshold search passed nothing is skipped). ``name`` is "" for a
    one-tier policy's tier: the first configured tier."""

    name: str
    calibrator: Calibrator
    rule: Rule
    backend_fingerprint: str = "unknown"
    cost: float = 0.0
    read: bool = True

    @property
    def threshold(self) -> float | None:
        """The rule's single bar (None: none passed, or the rule has no single bar)."""
        rule = self.rule.base if isinstance(self.rule, BudgetRule) else self.rule
        return rule.threshold if isinstance(rule, ThresholdRule) else None

    def calibrate(self, proba: Sequence[float]) -> list[float]:
        calibrated = self.calibrator.transform(np.asarray([proba], dtype=np.float64))
        return [float(p) for p in calibrated[0]]


@dataclass(frozen=True, slots=True)
class Step:
    """One tier's verdict on its read of a decision, the calibrated probabilities of every
    option, and where the decision goes next: ``climb`` is the index of the next tier to read
    (None: accepted here, or no tier is left and the slow model answers)."""

    verdict: Verdict
    calibrated: list[float]
    climb: int | None


@dataclass(frozen=True, slots=True)
class Judged:
    """A policy's steps over labelled rows (``Policy.judge``). Per tier (column ``k``):
    ``answers`` (raw argmax), ``confidence`` (its calibrated probability), ``accepted`` (that
    tier's own verdict), ``read`` (whether the row reached it). Per row: ``answered`` (the tier
    that answered, ``n_tiers`` for the slow model) and ``cost`` (every tier read, plus the slow
    model's when it escalated). ``calibrated``: every option's calibrated probability, per tier."""

    answers: NDArray[np.int64]
    confidence: FloatArray
    accepted: NDArray[np.bool_]
    read: NDArray[np.bool_]
    answered: NDArray[np.int64]
    cost: FloatArray
    calibrated: tuple[FloatArray, ...]

    @property
    def escalated(self) -> NDArray[np.bool_]:
        return np.asarray(self.answered == self.accepted.shape[1], dtype=bool)

    @property
    def answer(self) -> NDArray[np.int64]:
        """The served fast answer of each accepted row (-1 where the slow model answers)."""
        rows = np.arange(len(self.answered))
        column = np.minimum(self.answered, self.accepted.shape[1] - 1)
        return np.where(self.escalated, -1, self.answers[rows, column])

    @property
    def deciding(self) -> NDArray[np.int64]:
        """The tier whose verdict settled each row: the answering one, else the last read."""
        last = np.where(self.read, np.arange(self.read.shape[1]), -1).max(axis=1)
        return np.where(self.escalated, np.maximum(last, 0), self.answered)


class Policy:
    """Calibrators and acceptance rules for an ordered tuple of fast tiers, fit jointly, with
    one finite-sample guarantee on the accuracy of every answer any tier accepts.

    ``fit`` learns, into attributes ending in ``_``: ``params_`` (validated options),
    ``options_`` (option names), ``tiers_`` (``Tier``, in read order), ``n_calibration_``,
    ``n_tune_``, ``n_folds_`` (None when split), ``confidence_`` (the confidence that decided
    each threshold row), ``coverage_`` and ``escalation_rate_``. One tier besides:
    ``calibrator_`` and ``rule_`` (its tier's), ``risk_`` (the threshold search's result),
    ``answer_bars_``, ``proba_before_``, ``proba_after_``, ``y_true_``, ``answers_``,
    ``correct_``, ``accepted_``, ``budget_threshold_``, ``budget_exceeded_``. Several:
    ``thresholds_`` (``calibration.cascade.CascadeThresholds``), ``slow_cost_``,
    ``tier_confidence_``, ``answered_``. Any shape: ``cost_bound_`` (the cost promise's bound,
None without one) and ``coverage_alone_`` (the accuracy promise's alone). ``from_file`` gives ``params_``, ``options_``,
    ``tiers_``, ``slow_cost_`` and ``file_``; ``policy_id`` names it in decision logs (the
    file's id, "unsaved" before one is written)."""

    policy_id = "unsaved"
    file_: PolicyFile | None = None
    options_: tuple[str, ...] | None = None
    slow_cost_: float | None = None
    tiers_: tuple[Tier, ...]
    # What ``fit`` learns (``policies.fitting`` writes them), declared for the type checker.
    params_: PolicyOptions
    n_calibration_: int
    n_tune_: int
    n_folds_: int | None
    confidence_: FloatArray
    coverage_: float
    escalation_rate_: float
    calibrator_: Calibrator
    rule_: Rule
    risk_: Any
    answer_bars_: list[Any] | None
    proba_before_: FloatArray
    proba_after_: FloatArray
    y_true_: NDArray[np.int64]
    answers_: NDArray[np.int64]
    correct_: NDArray[np.bool_]
    accepted_: NDArray[np.bool_]
    budget_threshold_: float | None
    budget_exceeded_: bool
    thresholds_: Any
    tier_confidence_: FloatArray
    answered_: NDArray[np.int64]
    cost_bound_: Any  # calibration.block_cost.CostBound, None without a cost promise
    coverage_alone_: float

    def __init__(self, **params: Any) -> None:
        self.params = params

    def get_params(self) -> dict[str, Any]:
        return dict(self.params)

    def check_params(self) -> PolicyOptions:
        """The parameters, validated (pydantic ValidationError naming the field); ``fit`` calls
        it first, a caller may call it before reading any data."""
        return PolicyOptions.model_validate(self.params)

    # -- fitting ------------------------------------------------------------------------------

    def fit(self, proba: ArrayLike | Sequence[ArrayLike], y_true: ArrayLike, *,
            options: Sequence[str] | None = None, folds: ArrayLike | None = None,
            tiers: Sequence[TierCost] | None = None, slow_cost: float | None = None,
            fingerprints: Sequence[str] | None = None) -> Self:
        """Fit the calibrator(s) and choose the rule(s). ``proba``: one (n_samples,
        n_options) array of raw reads, or with ``tiers`` (names and costs, in read order) one
        such array per tier over the same rows; ``slow_cost``: one slow-model call in the
        tiers' unit (several tiers); ``options`` names the columns (default "0", "1", ...);
        ``folds``: the rows are out-of-fold reads, cross-fit over these folds (one tier);
        ``fingerprints``: each tier's backend fingerprint (default "unknown")."""
        from policies.fitting import fit_cascade, fit_one_tier

        params = self.params_ = self.check_params()
        labels = np.asarray(y_true, dtype=np.int64)
        reads, tiers = _reads_of(proba, tiers, n_rows=len(labels))
        params.check_shape(len(tiers))
        if fingerprints is not None and len(fingerprints) != len(tiers):
            raise ValueError(f"{len(fingerprints)} fingerprints for {len(tiers)} tiers")
        prints = list(fingerprints or ["unknown"] * len(tiers))
        self.options_ = names = tuple(options) if options is not None else tuple(
            str(j) for j in range(reads[0].shape[1]))
        if len(names) != reads[0].shape[1]:
            raise ValueError(f"options names {len(names)} options but proba has "
                             f"{reads[0].shape[1]} columns")
        if len(tiers) == 1:
            fold_ids = None if folds is None else np.asarray(folds, dtype=np.int64)
            self.rule_ = fit_one_tier(self, reads[0], labels, params, fold_ids)
            self.tiers_ = (Tier(tiers[0].name, self.calibrator_, self.rule_, prints[0],
                                tiers[0].cost),)
            return self
        if folds is not None:
            raise ValueError("folds: a cascade splits its rows (out-of-fold reads are fine, "
                             "their folds are not used)")
        if slow_cost is None:
            raise ValueError("slow_cost: a cascade needs the cost of one slow-model call")
        calibrators, thresholds = fit_cascade(self, reads, labels, params, tiers, slow_cost)
        self.slow_cost_ = float(slow_cost)
        self.tiers_ = tuple(
            Tier(t.name, c, ThresholdRule(threshold), fingerprint, t.cost,
                 read=threshold is not None)
            for t, c, threshold, fingerprint in zip(tiers, calibrators, thresholds, prints,
                                                    strict=True))
        return self

    # -- running ------------------------------------------------------------------------------

    def next_tier(self, after: int) -> int | None:
        """The index of the first tier read after tier ``after`` (-1: the first read at all);
        None when none is left (the slow model answers)."""
        return next((k for k in range(after + 1, len(self.tiers_)) if self.tiers_[k].read),
                    None)

    @property
    def reads_first_tier(self) -> bool:
        """Whether a decision of this policy starts with the first tier's read (a cascade whose
        first tier passed no threshold starts higher; a policy reading no tier still has its
        first tier judge, and escalate, the decision)."""
        return self.next_tier(-1) in (0, None)

    def tier_index(self, name: str) -> int:
        """The position of the tier named ``name`` (ValueError when the policy has none)."""
        for k, tier in enumerate(self.tiers_):
            if tier.name == name:
                return k
        raise ValueError(f"policy {self.policy_id!r} has no tier {name!r}")

    def step(self, k: int, scores: OptionScores, *, escalations: int = 0) -> Step:
        """Tier ``k``'s verdict on its read (on the raw argmax, the fast answer), the
        calibrated probabilities, and the next tier to read when it turns the read down.
        ``escalations``: the caller's ``EscalationWindow`` count (a budget rule reads it)."""
        tier = self.tiers_[k]
        calibrated = tier.calibrate(scores.proba)
        verdict = tier.rule.verdict(scores.options, calibrated, scores.top_index,
                                    escalations=escalations)
        return Step(verdict, calibrated, None if verdict.accept else self.next_tier(k))

    def decide(self, scores: OptionScores, *, escalations: int = 0
               ) -> tuple[Verdict, list[float]]:
        """The first tier's verdict and calibrated probabilities (``step(0, ...)``)."""
        step = self.step(0, scores, escalations=escalations)
        return step.verdict, step.calibrated

    def calibrate(self, scores: OptionScores) -> list[float]:
        return self.tiers_[0].calibrate(scores.proba)

    def escalation_window(self) -> EscalationWindow | None:
        """A fresh window for a caller that runs this policy on a stream of decisions (None: no
        tier has a budget, nothing to count)."""
        rule = self.tiers_[0].rule
        return EscalationWindow(rule.window) if isinstance(rule, BudgetRule) else None

    def judge(self, probas: Sequence[ArrayLike]) -> Judged:
        """Every tier's steps over ``probas`` (one (n_rows, n_options) array of raw reads per
        tier, in tier order, the same rows), as the router would take them one by one: a
        budget rule counts the rows as a stream, in order."""
        reads = [np.asarray(p, dtype=np.float64) for p in probas]
        if len(reads) != len(self.tiers_):
            raise ValueError(f"{len(reads)} reads for a policy of {len(self.tiers_)} tiers")
        n, n_tiers = len(reads[0]), len(self.tiers_)
        calibrated = tuple(t.calibrator.transform(r) for t, r in zip(self.tiers_, reads,
                                                                       strict=True))
        answers = np.stack([r.argmax(axis=1) for r in reads], axis=1)
        confidence = np.stack([c[np.arange(n), answers[:, k]]
                               for k, c in enumerate(calibrated)], axis=1)
        accepted = np.stack([self._accepts(k, answers[:, k], confidence[:, k], calibrated[k])
                             for k in range(n_tiers)], axis=1)
        answered = np.full(n, n_tiers, dtype=np.int64)
        read = np.zeros((n, n_tiers), dtype=bool)
        cost = np.zeros(n)
        k = self.next_tier(-1)
        while k is not None:
            waiting = answered == n_tiers
            read[:, k] = waiting
            cost[waiting] += self.tiers_[k].cost
            answered[waiting & accepted[:, k]] = k
            k = self.next_tier(k)
        if self.next_tier(-1) is None:  # no tier passed: the first judges (and escalates)
            read[:, 0] = True
        cost[answered == n_tiers] += self.slow_cost_ or 0.0
        return Judged(answers, confidence, accepted, read, answered, cost, calibrated)

    def _accepts(self, k: int, answers: NDArray[np.int64], confidence: FloatArray,
                 calibrated: FloatArray) -> NDArray[np.bool_]:
        tier = self.tiers_[k]
        assert self.options_ is not None
        if isinstance(tier.rule, ThresholdRule):
            bars = np.array([np.inf if (bar := tier.rule.bar(name)) is None else bar
                             for name in self.options_])
            return np.asarray(confidence >= bars[answers], dtype=bool)
        window = self.escalation_window() if k == 0 else None
        out = np.zeros(len(answers), dtype=bool)
        for i, (answer, row) in enumerate(zip(answers, calibrated, strict=True)):
            verdict = tier.rule.verdict(self.options_, row, int(answer),
                                        escalations=0 if window is None else window.escalations)
            if window is not None:
                window.record(verdict)
            out[i] = verdict.accept
        return out

    def __repr__(self) -> str:
        tiers = getattr(self, "tiers_", ())
        return (f"Policy({self.policy_id!r}, "
                f"{[(t.name, t.rule.to_dict()) for t in tiers]!r})")

    # -- the policy file ----------------------------------------------------------------------

    @classmethod
    def from_parts(cls, calibrator: Calibrator, rule: Rule, *, policy_id: str,
                   backend_fingerprint: str = "unknown") -> Policy:
        """A runnable one-tier policy from a fitted calibrator and a rule (no guarantee behind
        it unless they came from ``fit``)."""
        policy = cls()
        policy.params_ = PolicyOptions()
        policy.calibrator_, policy.rule_ = calibrator, rule
        policy.tiers_ = (Tier("", calibrator, rule, backend_fingerprint),)
        policy.policy_id = policy_id
        return policy

    @classmethod
    def from_file(cls, source: PolicyFile | Path) -> Policy:
        """The policy a file holds (a path is read with ``load_policy``: errors name the field),
        every tier's calibrator and rule built once."""
        from policies.file import PolicyFile, load_policy

        file = source if isinstance(source, PolicyFile) else load_policy(source)
        policy = cls()
        policy.params_ = _tuned_with(file)
        policy.options_ = None if file.options is None else tuple(file.options)
        policy.policy_id, policy.file_ = file.policy_id, file
        cascade = file.cascade
        if cascade is None:
            policy.calibrator_, policy.rule_ = file.calibrator.build(), file.rule.build()
            policy.tiers_ = (Tier("", policy.calibrator_, policy.rule_,
                                  file.backend_fingerprint),)
            return policy
        policy.tiers_ = tuple(Tier(t.name, t.calibrator.build(), ThresholdRule(t.threshold),
                                   t.backend_fingerprint, t.cost, read=t.threshold is not None)
                              for t in cascade.tiers)
        policy.slow_cost_ = cascade.slow_cost
        return policy

    def to_file(self, *, name: str, data_hash: str, question: Question | None = None,
                logged_signature: str | None = None, backend_fingerprint: str | None = None,
                guarantee: str = "accuracy", shadow: bool | None = None,
                audit_rate: float = 0.0, alarm_alpha: float = 0.05,
                signing_key: bytes | None = None, **watch: Any) -> PolicyFile:
        """The policy file of this fitted policy, scoped to ``question`` over its options (or,
        tuned on rows exported from the decision log, to that ``logged_signature``; one of the
        two), with the monitoring settings given here (``watch``: further monitoring fields,
        ``on_alarm``, ``audit_boost``; left out, the file's defaults), sealed with its digest
        (and signed, given ``signing_key``). ``backend_fingerprint`` replaces a one-tier
        policy's fitted one."""
        from policies.scope import scope_signature
        from policies.writing import policy_file

        if (question is None) == (logged_signature is None):
            raise ValueError("a policy file is scoped to one question: pass question or "
                             "logged_signature (exactly one)")
        assert self.options_ is not None  # set by fit
        if backend_fingerprint is not None and len(self.tiers_) == 1:
            self.tiers_ = (_with_fingerprint(self.tiers_[0], backend_fingerprint),)
        signature = (logged_signature if question is None
                     else scope_signature(self.options_, question))
        assert signature is not None  # one of the two, checked above
        return policy_file(self, signature=signature, content={
            "name": name, "data_hash": data_hash, "guarantee": guarantee, "shadow": shadow,
            "audit_rate": audit_rate, "alarm_alpha": alarm_alpha, **watch,
            "question": None if question is None else question.as_dict()}).sealed(signing_key)


def _with_fingerprint(tier: Tier, fingerprint: str) -> Tier:
    return Tier(tier.name, tier.calibrator, tier.rule, fingerprint, tier.cost, tier.read)


def _reads_of(proba: ArrayLike | Sequence[ArrayLike], tiers: Sequence[TierCost] | None, *,
              n_rows: int) -> tuple[list[FloatArray], list[TierCost]]:
    """The reads ``fit`` was given, one 2-D array per tier, checked against ``tiers`` (one
    unnamed tier when none are given) and the labels' ``n_rows``."""
    if tiers is None:
        array = np.asarray(proba, dtype=np.float64)
        if array.ndim == 3 and len(array) == 1:  # one tier's reads, given as a list of one
            array = array[0]
        if array.ndim != 2:
            raise ValueError(f"proba must be 2-D (n_samples, n_options), got shape {array.shape}")
        reads, tiers = [array], [TierCost("", 0.0)]
    else:
        reads = [np.asarray(p, dtype=np.float64) for p in proba]  # type: ignore[union-attr]
        if len(reads) != len(tiers) or not tiers:
            raise ValueError(f"one read per tier: got {len(reads)} reads for {len(tiers)} "
                             "tiers")
    for tier, read in zip(tiers, reads, strict=True):
        where = f"tier {tier.name!r}: " if tier.name else ""
        if read.ndim != 2 or read.shape[0] != n_rows:
            raise ValueError(f"{where}reads must be (n_samples, n_options) with {n_rows} rows, "
                             f"got shape {read.shape}")
        if read.shape[1] != reads[0].shape[1]:
            raise ValueError(f"{where}{read.shape[1]} options, the first tier has "
                             f"{reads[0].shape[1]}")
    return reads, list(tiers)


def _tuned_with(file: PolicyFile) -> PolicyOptions:
    """The options a policy file was tuned with, as far as it records them (the split's
    calibration share is not: the default stands in)."""
    from policies.specs import BudgetRuleSpec

    rule = file.rule
    cascade = file.cascade
    return PolicyOptions(
        calibrator=file.calibrator.kind, target_accuracy=file.target_accuracy, delta=file.delta,
        seed=file.seed, max_escalation=file.max_escalation,
        budget_window=rule.window if isinstance(rule, BudgetRuleSpec) else 1000,
        per_answer_floor=file.per_answer_floor,
        max_slow_share=None if cascade is None else cascade.max_slow_share,
        **({} if file.cost_promise is None else file.cost_promise.options()))
