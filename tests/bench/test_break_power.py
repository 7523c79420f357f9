"""bench.break_power: its vectorised wealth is the library tests' own, its break profiles have the
accuracy they claim, and on a small synthetic policy every test keeps its false-alarm bound at
the edge of the promise while the weighted one finds a break sooner."""

from __future__ import annotations

import numpy as np
import pytest

from bench.break_power import (
    METHODS,
    Reads,
    Setting,
    binomial_tolerance,
    simulate,
    summarise,
    wrong_probability,
)
from bench.many_runs import Designs, Jumpers
from calibration.monitoring import SHORTFALL_FRACTIONS, AccuracyShortfallTest
from calibration.weighted_audits import WEIGHTED_GAPS, AuditDesign, WeightedShortfallTest

RNG = np.random.default_rng(0)
CONFIDENCE = np.concatenate([1.0 - 0.35 * RNG.beta(0.4, 4.0, 900), RNG.uniform(0.3, 0.6, 100)])
READS = Reads(CONFIDENCE, CONFIDENCE >= 0.65,
              tuple(float(c) for c in np.sort(1.0 - 0.35 * RNG.beta(0.4, 4.0, 2000))))


def test_the_vectorised_wealth_is_the_per_label_tests_step_by_step() -> None:
    test = AccuracyShortfallTest(0.95, alpha=0.0125)
    jumpers = Jumpers(1, [f / 0.05 for f in SHORTFALL_FRACTIONS], alpha=0.0125)
    draw = np.random.default_rng(1)
    for step in range(1, 300):
        right = bool(draw.random() < 0.8)
        test.update(right)
        jumpers.bet(np.array([0.95 - float(right)]), np.ones(1, dtype=bool), step)
        assert jumpers.log_scale[0] == pytest.approx(test.log_value, abs=1e-9)
    assert test.alarm and jumpers.alarm_at[0] == test.alarm_at


def test_the_vectorised_wealth_is_the_weighted_tests_step_by_step() -> None:
    design = AuditDesign(READS.accepted_reference)
    variance, loss = design.scale(0.25)
    test = WeightedShortfallTest(0.95, alpha=0.0125)
    stakes = np.minimum(WEIGHTED_GAPS, variance / (0.05 + loss))
    jumpers = Jumpers(1, stakes, alpha=0.0125, jump=test.jump)
    draw = np.random.default_rng(2)
    for step in range(1, 400):
        c = float(draw.choice(CONFIDENCE[READS.accepted]))
        pi = design.probability(c, 0.25)
        audited, right = bool(draw.random() < pi), bool(draw.random() < c - 0.1)
        test.update(c, probability=pi, audited=audited, correct=right, scale=(variance, loss))
        z = (1.0 - c) + audited * (float(not right) - (1.0 - c)) / pi
        jumpers.bet(np.array([(z - 0.05) / variance]), np.ones(1, dtype=bool), step)
        assert jumpers.log_scale[0] == pytest.approx(test.log_value, abs=1e-9)


def test_the_vectorised_designs_learn_and_draw_as_the_library_design_does() -> None:
    reference = AuditDesign(READS.accepted_reference, floor=0.25)
    runs = Designs(reference, 3)
    singles = [AuditDesign(READS.accepted_reference, floor=0.25) for _ in range(3)]
    draw = np.random.default_rng(5)
    confidences = CONFIDENCE[READS.accepted]
    for _ in range(150):  # labels for each run, errors where the model is unsure more often
        run = int(draw.integers(3))
        c = float(draw.choice(confidences))
        wrong = bool(draw.random() < (1.0 - c) * (1 + 3 * run))
        singles[run].learn(c, wrong=wrong)
        runs.learn(np.array([run]), np.array([AuditDesign.stratum(c)]), np.array([wrong]),
                   np.array([1.0 - c]))
    probs = runs.probabilities(0.25)
    for run, single in enumerate(singles):
        assert probs[run] == pytest.approx(single.probabilities(0.25), rel=1e-6)
        variance, loss = runs.scale(probs, eta=1.0, allowed=0.05)
        assert (variance[run], loss[run]) == pytest.approx(single.scale(0.25, allowed=0.05),
                                                           rel=1e-6)
    assert not np.allclose(probs[0], probs[2])  # the runs learnt apart


@pytest.mark.parametrize("profile", ["low", "even"])
@pytest.mark.parametrize("accuracy", [0.96, 0.95, 0.90])
def test_each_profile_has_the_accepted_accuracy_it_claims(profile: str, accuracy: float) -> None:
    p = wrong_probability(READS, accuracy, profile)
    assert p[READS.accepted].mean() == pytest.approx(1.0 - accuracy, abs=1e-9)
    moved = ~np.isclose(p, 1.0 - CONFIDENCE)
    if profile == "low":  # only the least sure quarter of the accepted answers take the break
        cut = np.quantile(CONFIDENCE[READS.accepted], 0.25)
        assert not moved[READS.accepted & (CONFIDENCE > cut)].any()


def test_at_the_edge_every_test_keeps_its_bound_and_a_break_is_found_sooner_weighted() -> None:
    setting = Setting(target=0.95, alpha=0.0125, rate=0.25, floor=0.25, horizon=1000, runs=200)
    for profile in ("low", "even"):
        found = simulate(READS, wrong_probability(READS, 0.95, profile), setting, seed=3)
        for method in METHODS:
            assert (found[method]["decision"] >= 0).mean() <= binomial_tolerance(0.0125, 200)
    small = Setting(target=0.95, alpha=0.0125, rate=0.25, floor=0.25, horizon=2000, runs=40)
    broken = simulate(READS, wrong_probability(READS, 0.88, "low"), small, seed=4)
    uniform, weighted = (summarise(broken[m], 2000) for m in ("uniform", "ppi_weighted"))
    assert weighted["labels_median"] < uniform["labels_median"]
