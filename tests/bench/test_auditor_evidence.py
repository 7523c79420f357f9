"""bench.two_phase and bench.auditor_evidence: the two-phase estimate is unbiased for the true
error whatever the auditor, its variance is the one the stakes are sized by, the stake cap keeps
every bet non-negative, the vectorised wealth is the library test's, and on a small synthetic
policy an auditor that contradicts right answers raises false alarms that the correction does
not."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from bench.auditor_data import Answers, agreement
from bench.auditor_evidence import (
    Method,
    simulate,
    stakes_of,
    stream_weights,
    summarise,
)
from bench.break_power import Reads, Setting, binomial_tolerance
from bench.many_runs import Jumpers
from bench.two_phase import (
    CAP_SHARE,
    TwoPhaseShortfallTest,
    trusted_only_scale,
    two_phase_estimate,
    two_phase_loss,
    two_phase_scale,
)
from calibration.weighted_audits import Q_CAP, RISK_EDGES, WEIGHTED_GAPS, AuditDesign

RNG = np.random.default_rng(0)
CONFIDENCE = np.concatenate([1.0 - 0.35 * RNG.beta(0.4, 4.0, 900), RNG.uniform(0.3, 0.6, 100)])
REFERENCE = tuple(float(c) for c in np.sort(1.0 - 0.35 * RNG.beta(0.4, 4.0, 2000)))
DESIGN = AuditDesign(REFERENCE)


def outcomes(q: float, pi: float, rho: float, p_wrong: float, p_flag: dict[int, float]
             ) -> list[tuple[float, float]]:
    """Every (probability, Z) of one decision: A, B, e and d drawn, ``d`` flagged with
    probability ``p_flag[e]`` given the true error ``e``."""
    out = []
    for a, b, e, d in itertools.product((0, 1), repeat=4):
        p = (pi if a else 1 - pi) * (rho if b else 1 - rho) * (p_wrong if e else 1 - p_wrong)
        p *= p_flag[e] if d else 1 - p_flag[e]
        out.append((p, float(two_phase_estimate(q, pi, a, d, a * b, e, rho=rho))))
    return out


@pytest.mark.parametrize("p_flag", [
    {0: 0.02, 1: 0.4},  # a good auditor that repeats most fast errors (correlated)
    {0: 0.3, 1: 0.9},  # a poor one that contradicts right answers
    {0: 1.0, 1: 0.0},  # an adversary: always the opposite of the truth
])
@pytest.mark.parametrize("rho", [0.05, 0.25, 1.0])
def test_the_two_phase_estimate_is_unbiased_whatever_the_auditor(p_flag: dict[int, float],
                                                                 rho: float) -> None:
    for q, pi, p_wrong in ((0.02, 0.06, 0.05), (0.3, 0.8, 0.5), (0.1, 0.25, 0.0)):
        law = outcomes(q, pi, rho, p_wrong, p_flag)
        mean = sum(p * z for p, z in law)
        assert mean == pytest.approx(p_wrong, abs=1e-12)
        # and its variance is the one two_phase_scale sizes the stakes by
        mismatch = p_wrong * (1 - p_flag[1]) + (1 - p_wrong) * p_flag[0]
        expected = (p_wrong * (1 - p_wrong) + (p_wrong * (1 - q) ** 2 + (1 - p_wrong) * q ** 2)
                    * (1 / pi - 1) + (1 / rho - 1) * mismatch / pi)
        assert sum(p * (z - mean) ** 2 for p, z in law) == pytest.approx(expected, rel=1e-9)


def test_a_biased_auditor_alone_is_biased_and_the_correction_removes_it() -> None:
    p_flag = {0: 0.3, 1: 0.9}
    audit_only = sum(p * z for p, z in outcomes(0.02, 0.06, 1.0, 0.05, {0: 0.0, 1: 1.0}))
    assert audit_only == pytest.approx(0.05)  # rho 1 with a perfect auditor: the label itself
    flagged = 0.05 * p_flag[1] + 0.95 * p_flag[0]
    assert flagged == pytest.approx(0.33)  # what audit labels alone would estimate
    assert sum(p * z for p, z in outcomes(0.02, 0.06, 0.1, 0.05, p_flag)) == pytest.approx(0.05)


@pytest.mark.parametrize("rho", [0.05, 0.1, 0.25, 1.0])
def test_the_stake_cap_keeps_every_bet_non_negative(rho: float) -> None:
    allowed = 0.05
    variance, loss = two_phase_scale(DESIGN, 0.25, rho=rho, mismatch=[0.05] * 9,
                                     allowed=allowed)
    at_cap, staked = [], []
    for b, p in enumerate(DESIGN.probabilities(0.25)):
        for q in (RISK_EDGES[b], min(Q_CAP, RISK_EDGES[b + 1])):
            own = float(two_phase_loss(q, p, rho=rho))
            assert own <= loss + 1e-12
            for a, t, e, d in itertools.product((0, 1), repeat=4):
                z = float(two_phase_estimate(q, p, a, d, a * t, e, rho=rho))
                assert z >= -own - 1e-9
                for cap in (variance / (allowed + loss), variance / (allowed + own)):
                    at_cap.append(1.0 + cap * (z - allowed) / variance)
                    staked += [1.0 + min(g, CAP_SHARE * cap) * (z - allowed) / variance
                               for g in WEIGHTED_GAPS]
    assert min(at_cap) == pytest.approx(0.0, abs=1e-9)  # the cap is the largest non-negative
    assert min(staked) >= 1.0 - CAP_SHARE - 1e-9  # a bet loses at most CAP_SHARE


def test_the_library_test_refuses_a_loss_below_the_decisions_own() -> None:
    test = TwoPhaseShortfallTest(0.95, alpha=0.0125, rho=0.1)
    p = DESIGN.probability(0.999, 0.25)
    own = float(two_phase_loss(0.001, p, rho=0.1))
    with pytest.raises(ValueError, match="possible loss"):
        test.update_two_phase(0.999, probability=p, audited=True, audit_error=1.0, trusted=True,
                              wrong=False, scale=(1.0, own * 0.99))
    with pytest.raises(ValueError, match="trusted must be False"):
        test.update_two_phase(0.999, probability=p, audited=False, audit_error=None,
                              trusted=True, wrong=None, scale=(1.0, own))
    # a smaller largest audit error allows a smaller loss
    assert test.update_two_phase(0.999, probability=p, audited=True, audit_error=0.1,
                                 trusted=True, wrong=False, scale=(1.0, own / 5),
                                 most_error=0.1) is False
    assert test.labels == 1 and test.trusted == 1


def test_at_rho_one_the_scales_are_the_designs() -> None:
    assert trusted_only_scale(DESIGN, 0.25, rho=1.0) == pytest.approx(DESIGN.scale(0.25))
    variance, loss = two_phase_scale(DESIGN, 0.25, rho=1.0, mismatch=[0.5] * 9)
    assert variance == pytest.approx(DESIGN.variance(0.25))
    assert loss == pytest.approx(DESIGN.bound(0.25))


def test_the_vectorised_wealth_is_the_library_tests_step_by_step() -> None:
    rho, allowed = 0.25, 0.05
    scale = two_phase_scale(DESIGN, 0.25, rho=rho, mismatch=[0.05] * 9)
    test = TwoPhaseShortfallTest(0.95, alpha=0.0125, rho=rho)
    jumpers = Jumpers(1, stakes_of(Method("two_phase", "a", rho), scale, allowed),
                      alpha=0.0125, jump=test.jump)
    draw = np.random.default_rng(2)
    for step in range(1, 400):
        c = float(draw.choice(CONFIDENCE[CONFIDENCE >= 0.65]))
        p = DESIGN.probability(c, 0.25)
        audited = bool(draw.random() < p)
        trusted = audited and bool(draw.random() < rho)
        wrong, flagged = bool(draw.random() < 1.2 - c), bool(draw.random() < 0.1)
        test.update_two_phase(c, probability=p, audited=audited, audit_error=float(flagged),
                              trusted=trusted, wrong=wrong, scale=scale)
        z = float(two_phase_estimate(min(Q_CAP, 1.0 - c), p, audited, flagged, trusted, wrong,
                                     rho=rho))
        jumpers.bet(np.array([(z - allowed) / scale[0]]), np.ones(1, dtype=bool), step)
        assert jumpers.log_scale[0] == pytest.approx(test.log_value, abs=1e-9)
    assert test.labels > test.trusted > 0


def synthetic(contradict: float, seed: int = 5) -> Answers:
    """A calibrated fast tier (wrong with probability 1 - c) and an auditor that knows the
    truth but gives another answer on ``contradict`` of the rows."""
    rng = np.random.default_rng(seed)
    accepted = CONFIDENCE >= 0.65
    wrong = rng.random(CONFIDENCE.size) < 1.0 - CONFIDENCE
    fast = np.where(wrong, "b", "a")
    auditor = np.where(rng.random(CONFIDENCE.size) < contradict, "c", "a")
    return Answers(Reads(CONFIDENCE, accepted, REFERENCE), fast,
                   np.full(CONFIDENCE.size, "a"), {"poor": auditor})


@pytest.mark.parametrize("profile", ["low", "even"])
def test_stream_weights_have_the_accuracy_they_claim(profile: str) -> None:
    answers = synthetic(0.05)
    probs = stream_weights(answers, 0.93, profile)
    got = agreement(answers, answers.reads.accepted, probs)
    assert got["accuracy"] == pytest.approx(0.93, abs=1e-4)
    assert probs.sum() == pytest.approx(1.0)


def test_a_contradicting_auditor_raises_false_alarms_the_correction_does_not() -> None:
    answers = synthetic(0.06)
    probs = stream_weights(answers, 0.95, "even")  # accepted accuracy exactly the target
    ms = [Method("true"), Method("audit", "poor"), Method("two_phase", "poor", 0.25),
          Method("trusted", rho=0.25)]
    scale = {"true": DESIGN.scale(0.25), "audit:poor": DESIGN.scale(0.25),
             "two_phase:poor:0.25": two_phase_scale(DESIGN, 0.25, rho=0.25, mismatch=[0.06] * 9),
             "trusted:0.25": trusted_only_scale(DESIGN, 0.25, rho=0.25)}
    setting = Setting(target=0.95, alpha=0.0125, rate=0.25, floor=0.25, horizon=2000,
                      runs=200)
    found = simulate(answers, probs, setting, ms, scale, seed=3)
    alarmed = {m: float((got["decision"] >= 0).mean()) for m, got in found.items()}
    assert alarmed["audit:poor"] > 0.5  # it counts about 0.05 + 0.06 of answers wrong
    for m in ("true", "two_phase:poor:0.25", "trusted:0.25"):
        assert alarmed[m] <= binomial_tolerance(0.0125, 200)
    done = summarise(found["two_phase:poor:0.25"], 2000)
    assert done["slow_median"] > done["trusted_median"] > 0
