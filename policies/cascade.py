"""A policy over several fast tiers with one guarantee, in ``GuaranteedPolicy``'s shape:
``CascadePolicy(**options)`` (``CascadeOptions``), ``fit(probas, y_true, tiers=...)`` on labelled
reads of every tier over the same rows, ``decide_tier(k, scores)`` on one tier's read,
``to_file`` / ``from_file`` for the policy file (a ``PolicyFile`` with a ``cascade`` block).

The labelled rows are split with a fixed seed: one part fits each tier's calibrator and orders
the candidate threshold vectors, the other tests them (``calibration.cascade``, whose walks give
the joint guarantee: the answers every tier accepts are together at least ``target_accuracy``
accurate with probability at least 1 - delta). docs/cascade.md has the proof sketch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Self

import numpy as np
from numpy.typing import ArrayLike, NDArray

from calibration.calibrators import make_calibrator
from calibration.cascade import CascadeThresholds
from policies.guaranteed import GuaranteeOptions, answer_confidence, split_rows
from policies.rules import ThresholdRule
from policies.specs import Unit
from policies.types import OptionScores, Verdict

if TYPE_CHECKING:
    from calibration.base import Calibrator
    from policies.file import PolicyFile
    from policies.rules import EscalationWindow
    from policies.scope import Question

__all__ = ["CascadeOptions", "CascadePolicy", "Tier", "TierCost"]


class CascadeOptions(GuaranteeOptions):
    """A cascade's parameters: the one-tier ones, and a cap on the share of decisions that reach
    the slow model (held at 1 - delta / 2, the other half of delta going to the accuracy)."""

    max_slow_share: Unit | None = None


@dataclass(frozen=True, slots=True)
class TierCost:
    """A fast tier as tuning sees it: its name (``fast.name`` / ``tiers[].name`` in the
    settings) and what one read of it costs (any unit, the slow model's cost in the same)."""

    name: str
    cost: float


@dataclass(frozen=True, slots=True)
class Tier:
    """A fast tier as a decision meets it: its calibrator and rule (``threshold`` None: the
    tier is not read), and the backend fingerprint it was tuned on."""

    name: str
    calibrator: Calibrator
    threshold: float | None
    backend_fingerprint: str
    cost: float
    rule: ThresholdRule = field(init=False)  # its threshold as a rule, built once

    def __post_init__(self) -> None:
        object.__setattr__(self, "rule", ThresholdRule(self.threshold))

    @property
    def read(self) -> bool:
        return self.threshold is not None


class CascadePolicy:
    """Calibrators and thresholds for an ordered list of fast tiers, fit jointly.

    ``fit`` learns ``params_``, ``options_`` (the option names), ``tiers_`` (``Tier``, in order),
    ``thresholds_`` (the fitted ``CascadeThresholds``: bound, coverage by tier, expected cost),
    ``slow_cost_``, ``n_calibration_``, ``n_tune_``, ``tier_confidence_`` (every tier's
    calibrated top probability on each threshold row), ``answered_`` (the tier that answered
    each, ``len(tiers_)`` for the slow model) and ``confidence_`` (the confidence that decided
    each threshold row: the answering tier's, or the last read tier's when it escalated: what
    the drift watch compares live decisions with). ``from_file`` gives ``params_``,
    ``options_``, ``tiers_`` and ``file_``. ``policy_id``: the file's id, "unsaved" before."""

    policy_id = "unsaved"
    file_: PolicyFile | None = None
    options_: tuple[str, ...] | None

    def __init__(self, **params: Any) -> None:
        self.params = params

    def check_params(self) -> CascadeOptions:
        return CascadeOptions.model_validate(self.params)

    def fit(self, probas: Sequence[ArrayLike], y_true: ArrayLike, *, tiers: Sequence[TierCost],
            slow_cost: float, options: Sequence[str] | None = None,
            fingerprints: Sequence[str] | None = None) -> Self:
        """``probas``: one (n_samples, n_options) array of raw reads per tier, the same rows in
        the same order; ``tiers``: their names and costs, cheapest first as they are to read;
        ``fingerprints``: each tier's backend fingerprint (default "unknown")."""
        params = self.params_ = self.check_params()
        if len(probas) != len(tiers) or len(tiers) < 2:
            raise ValueError(f"a cascade needs reads of at least 2 tiers, one per tier: got "
                             f"{len(probas)} reads for {len(tiers)} tiers")
        if fingerprints is not None and len(fingerprints) != len(tiers):
            raise ValueError(f"{len(fingerprints)} fingerprints for {len(tiers)} tiers")
        labels = np.asarray(y_true, dtype=np.int64)
        reads = [np.asarray(p, dtype=np.float64) for p in probas]
        for tier, read in zip(tiers, reads, strict=True):
            if read.ndim != 2 or read.shape[0] != len(labels):
                raise ValueError(f"tier {tier.name!r}: reads must be (n_samples, n_options) with "
                                 f"{len(labels)} rows, got shape {read.shape}")
            if read.shape[1] != reads[0].shape[1]:
                raise ValueError(f"tier {tier.name!r}: {read.shape[1]} options, the first tier "
                                 f"has {reads[0].shape[1]}")
        self.options_ = tuple(options) if options is not None else tuple(
            str(j) for j in range(reads[0].shape[1]))
        cal, tune = split_rows(len(labels), seed=params.seed,
                               calibration_fraction=params.calibration_fraction)
        calibrators = [make_calibrator(params.calibrator).fit(read[cal], labels[cal])
                       for read in reads]
        conf_cal, hits_cal = _confidence(reads, calibrators, labels, cal)
        conf, hits = _confidence(reads, calibrators, labels, tune)
        self.thresholds_ = CascadeThresholds(
            target_accuracy=params.target_accuracy, delta=params.delta,
            tier_costs=[t.cost for t in tiers], slow_cost=slow_cost,
            max_slow_share=params.max_slow_share,
        ).fit(conf, hits, order_confidence=conf_cal, order_correct=hits_cal)
        prints = fingerprints or ["unknown"] * len(tiers)
        self.tiers_ = tuple(
            Tier(t.name, c, threshold, fingerprint, t.cost)
            for t, c, threshold, fingerprint in zip(tiers, calibrators,
                                                    self.thresholds_.thresholds_, prints,
                                                    strict=True))
        self.slow_cost_ = float(slow_cost)
        self.n_calibration_, self.n_tune_ = len(cal), len(tune)
        self.tier_confidence_, self.answered_ = conf, self.thresholds_.route(conf)
        self.confidence_ = _deciding(conf, self.answered_, [t.read for t in self.tiers_])
        return self

    def decide_tier(self, k: int, scores: OptionScores) -> tuple[Verdict, list[float]]:
        """Tier ``k``'s verdict on its read (on the raw argmax, as one tier's), and the
        calibrated probabilities of every option."""
        tier = self.tiers_[k]
        calibrated = [float(p) for p in tier.calibrator.transform(
            np.asarray([scores.proba], dtype=np.float64))[0]]
        verdict = tier.rule.verdict(scores.options, calibrated, scores.top_index)
        return verdict, calibrated

    def tier_index(self, name: str) -> int:
        """The position of the tier named ``name`` (ValueError when the cascade has none)."""
        for k, tier in enumerate(self.tiers_):
            if tier.name == name:
                return k
        raise ValueError(f"cascade {self.policy_id!r} has no tier {name!r}")

    def decide(self, scores: OptionScores, *, escalations: int = 0
               ) -> tuple[Verdict, list[float]]:
        """The first tier's verdict (``RuntimePolicy``): the routing service reads the later
        tiers itself, through ``decide_tier``."""
        return self.decide_tier(0, scores)

    def escalation_window(self) -> EscalationWindow | None:
        return None  # a cascade has no escalation budget

    def next_tier(self, after: int) -> int | None:
        """The index of the first tier read after tier ``after`` (-1: the first read at all);
        None when none is left (the slow model answers)."""
        return next((k for k in range(after + 1, len(self.tiers_)) if self.tiers_[k].read),
                    None)

    def __repr__(self) -> str:
        tiers = getattr(self, "tiers_", ())
        return (f"CascadePolicy({self.policy_id!r}, "
                f"{[(t.name, t.threshold) for t in tiers]!r})")

    @classmethod
    def from_file(cls, file: PolicyFile) -> CascadePolicy:
        """The runnable cascade a policy file with a ``cascade`` block holds."""
        cascade = file.cascade
        if cascade is None:
            raise ValueError(f"policy {file.name!r} has no cascade block: it is one tier's "
                             "(GuaranteedPolicy.from_file)")
        policy = cls()
        policy.params_ = CascadeOptions(
            calibrator=file.calibrator.kind, target_accuracy=file.target_accuracy,
            delta=file.delta, seed=file.seed, max_slow_share=cascade.max_slow_share)
        policy.options_ = None if file.options is None else tuple(file.options)
        policy.tiers_ = tuple(Tier(t.name, t.calibrator.build(), t.threshold,
                                   t.backend_fingerprint, t.cost) for t in cascade.tiers)
        policy.slow_cost_ = cascade.slow_cost
        policy.policy_id, policy.file_ = file.policy_id, file
        return policy

    def to_file(self, *, name: str, data_hash: str, question: Question | None = None,
                logged_signature: str | None = None, guarantee: str = "accuracy",
                shadow: bool | None = None, audit_rate: float = 0.0, alarm_alpha: float = 0.05,
                **watch: Any) -> PolicyFile:
        """The policy file of this fitted cascade, scoped to ``question`` (or to the one logged
        question the rows came from): the first tier at the top level, every tier in
        ``cascade``, the joint bound and coverage, and the drift reference of the deciding
        confidences."""
        from calibration.monitoring import reference_summary
        from policies.file import PolicyFile
        from policies.scope import scope_signature

        if (question is None) == (logged_signature is None):
            raise ValueError("a policy file is scoped to one question: pass question or "
                             "logged_signature (exactly one)")
        params, fitted, first = self.params_, self.thresholds_, self.tiers_[0]
        assert self.options_ is not None  # set by fit
        coverage = 1.0 - fitted.coverage_by_tier_[-1]
        reference = reference_summary(self.confidence_, threshold=None, seed=params.seed)
        reference["accept_share"] = coverage
        return PolicyFile.model_validate({
            "name": name,
            "signature": (logged_signature if question is None
                          else scope_signature(self.options_, question)),
            "backend_fingerprint": first.backend_fingerprint,
            "calibrator": first.calibrator.to_dict(),
            "rule": ThresholdRule(first.threshold).to_dict(),
            "target_accuracy": params.target_accuracy, "delta": params.delta,
            "bound": fitted.bound_, "coverage": coverage, "n_tune": self.n_tune_,
            "n_calibration": self.n_calibration_, "seed": params.seed, "data_hash": data_hash,
            "tuning": "split", "guarantee": guarantee, "shadow": shadow,
            "audit_rate": audit_rate,
            "alarm_alpha": alarm_alpha, **watch, "reference": reference,
            "options": list(self.options_),
            "question": None if question is None else question.as_dict(),
            "cascade": {
                "tiers": [{"name": t.name, "backend_fingerprint": t.backend_fingerprint,
                           "calibrator": t.calibrator.to_dict(), "threshold": t.threshold,
                           "cost": t.cost, "coverage": share,
                           "reference": self._tier_reference(k)}
                          for k, (t, share) in enumerate(zip(
                              self.tiers_, fitted.coverage_by_tier_, strict=False))],
                "slow_cost": self.slow_cost_, "slow_coverage": fitted.coverage_by_tier_[-1],
                "expected_cost": fitted.expected_cost_,
                "max_slow_share": params.max_slow_share,
                "slow_share_bound": (None if params.max_slow_share is None
                                     else fitted.slow_share_bound_),
            },
        })


    def _tier_reference(self, k: int) -> dict[str, Any] | None:
        """Tier ``k``'s drift reference: its confidences on the threshold rows it read (those
        the earlier tiers turned down) and the share of them it accepted; None when it is not
        read or read no row."""
        from calibration.monitoring import reference_summary

        tier = self.tiers_[k]
        reached = self.answered_ >= k
        if tier.threshold is None or not reached.any():
            return None
        return reference_summary(self.tier_confidence_[reached, k], threshold=tier.threshold,
                                 seed=self.params_.seed)


def _confidence(reads: Sequence[NDArray[np.float64]], calibrators: Sequence[Calibrator],
                labels: NDArray[np.int64], rows: NDArray[np.int64]
                ) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    """(n_rows, n_tiers) calibrated top probability of each tier's answer, and its hits."""
    conf = np.empty((len(rows), len(reads)))
    hits = np.empty(conf.shape, dtype=bool)
    for k, (read, calibrator) in enumerate(zip(reads, calibrators, strict=True)):
        answers, conf[:, k] = answer_confidence(read[rows], calibrator.transform(read[rows]))
        hits[:, k] = answers == labels[rows]
    return conf, hits


def _deciding(conf: NDArray[np.float64], answered: NDArray[np.int64],
              read: Sequence[bool]) -> NDArray[np.float64]:
    """The confidence that decided each row: the answering tier's, or, for a row no tier
    accepted, the last tier read (every tier's last when none is read)."""
    last = max((k for k, r in enumerate(read) if r), default=len(read) - 1)
    column = np.where(answered < len(read), answered, last)
    return conf[np.arange(len(conf)), column]
