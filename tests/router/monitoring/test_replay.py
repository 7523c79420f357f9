"""The replay's library pieces: the policy's own verdict on a logged read (None for a read its
calibrator cannot take) and the running accuracy the plot draws."""

from __future__ import annotations

from policies.policy import Policy
from policies.rules import ThresholdRule
from router.monitoring.replay import Series, verdict_on
from router.store.records import DecisionRecord
from tests.router.monitoring.conftest import watched_policy


def test_verdict_on_asks_the_rule_and_skips_what_does_not_fit() -> None:
    runtime = Policy.from_file(
        watched_policy(rule=ThresholdRule(0.8, {"b": 1.0}).to_dict()))
    read = DecisionRecord(decision_id="d", options=["a", "b", "c"], proba=[0.98, 0.01, 0.01])
    judged = verdict_on(runtime, read)
    assert judged is not None and judged[0].accept and judged[0].index == 0
    assert judged[1] == judged[0].probability  # the confidence is the answer's calibrated one
    on_b = read.model_copy(update={"proba": [0.01, 0.98, 0.01]})
    assert verdict_on(runtime, on_b)[0].accept is False  # type: ignore[index]  # b's own bar
    assert verdict_on(runtime, read.model_copy(update={"proba": None})) is None


def test_running_accuracy_is_the_mean_of_the_labels_so_far() -> None:
    series = Series("p", 0.9, None, None)
    series.labels = [(i, c, 0.0, 1.0) for i, c in enumerate([True, False, True, True])]
    assert series.running_accuracy().tolist() == [1.0, 0.5, 2 / 3, 0.75]
