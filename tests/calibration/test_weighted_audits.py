"""Audits drawn by risk (``AuditDesign``) and the prediction-powered betting test that weighs them
back (``WeightedShortfallTest``)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from calibration.state import DamagedState
from calibration.weighted_audits import PI_MIN, AuditDesign, WeightedShortfallTest

# Accepted confidences shaped like a tuned policy's: most answers sure, a tail down to the bar.
REFERENCE = tuple(float(c) for c in 1.0 - 0.35 * np.random.default_rng(0).beta(0.4, 4.0, 3000))


def shares(design: AuditDesign) -> list[float]:
    total = sum(design.counts)
    return [n / total for n in design.counts]


@pytest.mark.parametrize("rate", [0.05, 0.25, 0.75])
def test_the_design_audits_the_rate_on_average_riskier_answers_more(rate: float) -> None:
    design = AuditDesign(REFERENCE, floor=0.25)
    probs = design.probabilities(rate)
    assert sum(w * p for w, p in zip(shares(design), probs, strict=True)) == pytest.approx(
        rate, rel=1e-6)
    assert all(max(PI_MIN, 0.25 * rate) - 1e-12 <= p <= 1.0 for p in probs)
    assert design.probability(0.999, rate) < design.probability(0.7, rate)


def test_before_any_traffic_and_at_rate_one_every_decision_is_drawn_alike() -> None:
    assert AuditDesign().probabilities(0.3) == [0.3] * len(AuditDesign().counts)
    assert set(AuditDesign(REFERENCE).probabilities(1.0)) == {1.0}


def test_traffic_seen_whole_resets_the_strata_so_the_budget_holds_on_it() -> None:
    design = AuditDesign(REFERENCE)
    unsure = [0.7 + 0.2 * i / 999 for i in range(1000)]
    for _ in range(5):  # traffic far less sure than the tuning rows, five times as many
        for c in unsure:
            design.see(c)
    traffic = AuditDesign(unsure * 5 + list(REFERENCE))
    assert design.probabilities(0.25) == pytest.approx(traffic.probabilities(0.25))
    seen = np.mean([design.probability(c, 0.25) for c in [*unsure * 5, *REFERENCE]])
    assert seen == pytest.approx(0.25, rel=1e-6)


def test_a_design_resumes_its_strata_and_refuses_sums_no_count_could_add_up_to() -> None:
    design = AuditDesign(REFERENCE)
    again = AuditDesign()
    again.resume(design.state())
    assert again.probabilities(0.25) == design.probabilities(0.25)
    state = design.state()
    state["sums"][0] = 1e6  # far more risk than its count of sure answers can hold
    with pytest.raises(DamagedState, match=r"sums\[0\]"):
        AuditDesign().resume(state)
    state = design.state()
    state["counts"][2] = 1.5
    with pytest.raises(DamagedState, match=r"counts\[2\]"):
        AuditDesign().resume(state)


def test_labels_that_show_errors_where_the_model_is_sure_move_the_draws_there() -> None:
    design = AuditDesign(REFERENCE)
    before = design.probabilities(0.25)
    sure = 0.9995  # the surest stratum: calibrated, about one answer in 2,000 wrong
    b = design.stratum(sure)
    for i in range(200):  # its audits find one answer in five wrong
        design.learn(sure, wrong=i % 5 == 0)
    after = design.probabilities(0.25)
    assert after[b] > 2 * before[b]
    assert sum(n * p for n, p in zip(design.counts, after, strict=True)) / sum(
        design.counts) == pytest.approx(0.25, rel=1e-6)  # the budget holds


def test_labels_that_match_the_calibrated_risk_leave_the_draws_close_to_where_they_were() -> None:
    design = AuditDesign(REFERENCE)
    before = design.probabilities(0.25)
    draw = random.Random(3)
    for c in REFERENCE * 10:
        if draw.random() < design.probability(c, 0.25):
            design.learn(c, wrong=draw.random() < 1.0 - c)
    # Where errors are common enough to be seen (risk 0.04 and up); in the surest strata a few
    # hundred labels mostly show none, and those sit at the floor until one does.
    assert design.probabilities(0.25)[5:] == pytest.approx(before[5:], rel=0.2)


def test_a_design_resumes_what_it_learnt_and_refuses_squares_past_its_labels() -> None:
    design = AuditDesign(REFERENCE)
    for _ in range(30):
        design.learn(0.7, wrong=True)
    again = AuditDesign()
    again.resume(design.state())
    assert again.probabilities(0.25) == design.probabilities(0.25)
    b = design.stratum(0.7)
    state = design.state()
    state["squares"][b] = state["labelled"][b] + 5.0  # each label adds at most 1
    with pytest.raises(DamagedState, match=rf"squares\[{b}\]"):
        AuditDesign().resume(state)
    state = design.state()
    state["labelled"][b] = 2.5
    with pytest.raises(DamagedState, match=rf"labelled\[{b}\]"):
        AuditDesign().resume(state)


def run_stream(accuracy_at: float, *, decisions: int, seed: int, alpha: float) -> int | None:
    """Accepted decisions of REFERENCE's confidences, each wrong with its calibrated risk shifted
    so the mean accuracy is ``accuracy_at``; audits drawn by the design at rate 0.25."""
    design = AuditDesign(REFERENCE)
    scale = design.scale(0.25, allowed=0.05)
    test = WeightedShortfallTest(0.95, alpha=alpha)
    shift = (1.0 - accuracy_at) - float(np.mean([1.0 - c for c in REFERENCE]))
    draw = random.Random(seed)
    for n in range(1, decisions + 1):
        c = REFERENCE[draw.randrange(len(REFERENCE))]
        wrong = draw.random() < min(1.0, max(0.0, 1.0 - c + shift))
        pi = design.probability(c, 0.25)
        audited = draw.random() < pi
        if test.update(c, probability=pi, audited=audited, correct=not wrong, scale=scale):
            return n
    return None


def test_a_gross_break_alarms_within_a_few_hundred_decisions_and_a_kept_promise_does_not() -> None:
    gross = [run_stream(0.75, decisions=600, seed=s, alpha=0.0125) for s in range(5)]
    assert all(n is not None for n in gross)
    assert all(run_stream(0.99, decisions=2000, seed=s, alpha=0.0125) is None for s in range(3))


def test_at_the_edge_of_the_promise_false_alarms_stay_near_alpha() -> None:
    """A small version of bench.break_power's edge check, at a large alpha so a test that did not
    weigh its labels back (they come mostly from the least sure answers) would show at once."""
    alarms = [run_stream(0.95, decisions=500, seed=s, alpha=0.2) is not None for s in range(30)]
    assert np.mean(alarms) <= 0.2 + 3 * np.sqrt(0.2 * 0.8 / 30)


def test_a_drawn_audit_whose_label_never_came_counts_as_a_right_answer() -> None:
    design = AuditDesign(REFERENCE)
    scale, pi = design.scale(0.25), design.probability(0.8, 0.25)
    missing, right = WeightedShortfallTest(0.95, alpha=0.05), WeightedShortfallTest(0.95, alpha=0.05)
    missing.update(0.8, probability=pi, audited=True, correct=None, scale=scale)
    right.update(0.8, probability=pi, audited=True, correct=True, scale=scale)
    assert missing.log_value == right.log_value and missing.labels == 1


def test_a_bet_that_could_go_negative_is_refused_naming_what_is_wrong() -> None:
    test = WeightedShortfallTest(0.95, alpha=0.05)
    with pytest.raises(ValueError, match="loss"):  # pi 0.01 at risk 0.3 can lose 29.7
        test.update(0.7, probability=0.01, audited=False, correct=None, scale=(0.1, 1.0))
    with pytest.raises(ValueError, match="probability"):
        test.update(0.9, probability=0.0, audited=False, correct=None, scale=(0.1, 1.0))
    with pytest.raises(ValueError, match="variance"):
        test.update(0.9, probability=0.5, audited=False, correct=None, scale=(0.01, 1.0))


def test_a_resumed_test_goes_on_exactly_where_it_stopped() -> None:
    design = AuditDesign(REFERENCE)
    scale = design.scale(0.25)
    first, whole = WeightedShortfallTest(0.95, alpha=0.05), WeightedShortfallTest(0.95, alpha=0.05)
    steps = [(0.9, True, False), (0.97, False, None), (0.8, True, True), (0.75, True, False)]
    for c, audited, correct in steps[:2]:
        for test in (first, whole):
            test.update(c, probability=design.probability(c, 0.25), audited=audited,
                        correct=correct, scale=scale)
    resumed = WeightedShortfallTest(0.95, alpha=0.05)
    resumed.resume(first.state())
    for c, audited, correct in steps[2:]:
        for test in (resumed, whole):
            test.update(c, probability=design.probability(c, 0.25), audited=audited,
                        correct=correct, scale=scale)
    assert resumed.log_value == pytest.approx(whole.log_value) and resumed.n == whole.n
    assert resumed.labels == whole.labels == 3


def test_a_saved_test_with_more_labels_than_decisions_is_refused() -> None:
    test = WeightedShortfallTest(0.95, alpha=0.05)
    test.update(0.9, probability=0.5, audited=True, correct=True,
                scale=AuditDesign(REFERENCE).scale(0.25))
    state = {**test.state(), "labels": 2}
    with pytest.raises(DamagedState, match="labels"):
        WeightedShortfallTest(0.95, alpha=0.05).resume(state)
