"""A fitted ``policies.policy.Policy`` (typed ``Any`` here: that module imports this one) as
its policy file (``policies.file.PolicyFile``): one tier's file, or a cascade's (the first tier
at the top level, every tier in ``cascade``). Serialisation only:
what the file means is ``PolicyFile``'s, what it runs as is ``Policy.from_file``'s."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from policies.rules import ThresholdRule

if TYPE_CHECKING:
    from policies.file import PolicyFile

__all__ = ["policy_file"]


def policy_file(policy: Any, *, signature: str, content: dict[str, Any]) -> PolicyFile:
    """The file of a fitted ``policy`` scoped to ``signature``; ``content``: the fields the
    caller decides (name, data hash, question, guarantee, mode and monitoring settings)."""
    from policies.file import PolicyFile

    fitted = _cascade_fields(policy) if len(policy.tiers_) > 1 else _one_tier_fields(policy)
    return PolicyFile.model_validate({"signature": signature, **content, **fitted,
                                      "cost_promise": _cost_promise(policy)})


def _cost_promise(policy: Any) -> dict[str, Any] | None:
    """The cost promise's record (None: the policy was tuned without one)."""
    from policies.fitting import cost_promise_of

    bound, promise = getattr(policy, "cost_bound_", None), cost_promise_of(policy.params_)
    if bound is None or promise is None:
        return None
    return {"share": promise.share, "block": promise.block, "delta": promise.delta,
            "n": bound.n, "n_escalated": bound.n_escalated,
            "escalation_upper": bound.escalation_upper, "block_bound": bound.block_bound,
            "live_cap": promise.live_cap, "coverage_alone": policy.coverage_alone_}


def _one_tier_fields(policy: Any) -> dict[str, Any]:
    from calibration.monitoring import reference_summary

    params, tier = policy.params_, policy.tiers_[0]
    reference = reference_summary(policy.confidence_, threshold=policy.risk_.threshold,
                                  seed=params.seed)
    reference["accept_share"] = policy.coverage_  # the rule's, per-answer bars included
    return {
        "backend_fingerprint": tier.backend_fingerprint,
        "calibrator": tier.calibrator.to_dict(), "rule": tier.rule.to_dict(),
        "target_accuracy": params.target_accuracy, "delta": params.delta,
        "bound": policy.risk_.bound, "coverage": policy.coverage_, "n_tune": policy.risk_.n,
        "n_calibration": policy.n_calibration_, "seed": params.seed,
        "max_escalation": params.max_escalation, "budget_threshold": policy.budget_threshold_,
        "budget_exceeded": policy.budget_exceeded_,
        "tuning": "split" if policy.n_folds_ is None else "cross-fitted",
        "n_folds": policy.n_folds_, "reference": reference,
        "options": None if policy.options_ is None else list(policy.options_),
        "per_answer_floor": params.per_answer_floor,
    }


def _cascade_fields(policy: Any) -> dict[str, Any]:
    from calibration.monitoring import reference_summary

    params, fitted, first = policy.params_, policy.thresholds_, policy.tiers_[0]
    assert policy.options_ is not None  # set by fit
    reference = reference_summary(policy.confidence_, threshold=None, seed=params.seed)
    reference["accept_share"] = policy.coverage_
    return {
        "backend_fingerprint": first.backend_fingerprint,
        "calibrator": first.calibrator.to_dict(),
        "rule": ThresholdRule(first.threshold).to_dict(),
        "target_accuracy": params.target_accuracy, "delta": params.delta,
        "bound": fitted.bound_, "coverage": policy.coverage_, "n_tune": policy.n_tune_,
        "n_calibration": policy.n_calibration_, "seed": params.seed, "tuning": "split",
        "reference": reference, "options": list(policy.options_),
        "cascade": {
            "tiers": [{"name": t.name, "backend_fingerprint": t.backend_fingerprint,
                       "calibrator": t.calibrator.to_dict(), "threshold": t.threshold,
                       "cost": t.cost, "coverage": share,
                       "reference": _tier_reference(policy, k)}
                      for k, (t, share) in enumerate(zip(
                          policy.tiers_, fitted.coverage_by_tier_, strict=False))],
            "slow_cost": policy.slow_cost_, "slow_coverage": fitted.coverage_by_tier_[-1],
            "expected_cost": fitted.expected_cost_,
            "max_slow_share": params.max_slow_share,
            "slow_share_bound": (None if params.max_slow_share is None
                                 else fitted.slow_share_bound_),
        },
    }


def _tier_reference(policy: Any, k: int) -> dict[str, Any] | None:
    """Tier ``k``'s drift reference: its confidences on the threshold rows it read (those the
    earlier tiers turned down) and the share of them it accepted; None when it is not read or
    read no row."""
    from calibration.monitoring import reference_summary

    tier = policy.tiers_[k]
    reached = policy.answered_ >= k
    if tier.threshold is None or not reached.any():
        return None
    return reference_summary(policy.tier_confidence_[reached, k], threshold=tier.threshold,
                             seed=policy.params_.seed)
