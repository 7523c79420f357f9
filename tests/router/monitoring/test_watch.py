"""PolicyWatch: accuracy alarms from weighted audits and trusted labels, seeded audit draws by
risk, the accept share window."""

from __future__ import annotations

import numpy as np
import pytest

from router.monitoring.watch import ACCEPT_WINDOW, PolicyWatch, WatchSettings
from tests.router.monitoring.conftest import watched_policy


def audit(watch: PolicyWatch, confidence: float, correct: bool) -> object:
    """One counted accepted decision, its audit's verdict given at once when it is drawn."""
    draw, alarm = watch.draw(confidence)
    if draw is not None:
        alarm = watch.audited(draw.ticket, correct) or alarm
    return alarm


def test_trusted_labels_below_the_target_raise_the_accuracy_alarm() -> None:
    watch = PolicyWatch(WatchSettings.of(watched_policy()))
    alarm = None
    for i in range(400):
        alarm = watch.label(i % 4 != 0) or alarm  # 75% right against a 95% promise
        if alarm:
            break
    assert alarm is not None and alarm.kind == "accuracy" and watch.gate.escalate
    assert watch.shortfall.n < 60 and watch.report()["trusted_labels"] == watch.shortfall.n
    assert watch.shortfall.alpha == pytest.approx(watch.settings.alarm_alpha / 16)
    kept = PolicyWatch(WatchSettings.of(watched_policy()))
    for i in range(3000):  # 97% right: the promise holds, no alarm
        assert kept.label(i % 100 >= 3) is None


def test_audit_draws_are_seeded_at_the_rate_and_lean_to_the_risky() -> None:
    settings = WatchSettings.of(watched_policy(audit_rate=0.2))
    assert settings.accepted_reference is not None
    traffic = np.random.default_rng(1).choice(settings.accepted_reference, size=4000)
    first, second = PolicyWatch(settings), PolicyWatch(settings)
    a = [first.draw(float(c))[0] for c in traffic]
    assert a == [second.draw(float(c))[0] for c in traffic]
    drawn = np.array([d is not None for d in a])
    assert drawn.mean() == pytest.approx(0.2, abs=0.03)  # the rate stays the expected share
    risky = traffic < np.median(traffic)
    assert drawn[risky].mean() > 1.5 * drawn[~risky].mean()
    assert all(d.probability <= 1.0 for d in a if d is not None)
    assert not any(PolicyWatch(WatchSettings.of(watched_policy())).draw(0.9)[0]
                   for _ in range(100))  # audit rate 0: nothing drawn, nothing bet


def test_accept_share_covers_the_last_window() -> None:
    watch = PolicyWatch(WatchSettings.of(watched_policy()))
    for i in range(ACCEPT_WINDOW * 2):
        watch.observe(0.95, accepted=i >= ACCEPT_WINDOW)
    assert watch.accept_share == 1.0 and watch.n_accepted == ACCEPT_WINDOW


def test_an_input_counts_again_once_its_window_has_passed_or_it_was_forgotten() -> None:
    watch = PolicyWatch(WatchSettings.of(watched_policy()), dedupe_window_s=10.0,
                        dedupe_max_keys=2)
    assert watch.take(0.9, accepted=True, key="x", now=0.0)[0]
    assert not watch.take(0.9, accepted=True, key="x", now=9.0)[0]  # inside the window
    assert watch.take(0.9, accepted=True, key="x", now=10.0)[0]  # the window has passed
    watch.take(0.9, accepted=True, key="y", now=11.0)
    watch.take(0.9, accepted=True, key="z", now=11.0)  # "x" is forgotten (two keys kept)
    assert watch.take(0.9, accepted=True, key="x", now=12.0)[0]
    assert watch.n_decisions == 6 and watch.n_counted == 5


def test_a_clear_restarts_both_tests_and_refuses_older_alarms() -> None:
    watch = PolicyWatch(WatchSettings.of(watched_policy(audit_rate=0.5)))
    for i in range(400):
        watch.observe(0.81, accepted=True, key=str(i))  # accepted, less sure than the tuning rows
        audit(watch, 0.81, False)
    assert set(watch.alarms) == {"drift", "accuracy"}
    old = watch.alarms["drift"]
    assert watch.clear(old.time + 1.0) and not watch.alarms
    assert watch.drift is not None and not watch.drift.alarm and watch.accuracy().n == 0
    assert watch.weighted.whole.n == 0 and watch.weighted.suspect is None
    assert not watch.restore(old)  # raised before the clear: stays cleared
    assert not watch.clear(old.time)  # an older clear changes nothing


def test_after_a_trip_the_suspect_test_alarms_on_fewer_labels_than_the_whole_stream_test() -> None:
    """The weighted test started at the traffic trip (alarm_alpha / 16) owes nothing to the
    right answers audited before it, which the whole-stream test (3 alarm_alpha / 8) must earn
    back."""
    watch = PolicyWatch(WatchSettings.of(watched_policy(audit_rate=0.5)))
    weighted, alpha = watch.weighted, watch.settings.alarm_alpha
    assert weighted.whole.alpha == pytest.approx(3 * alpha / 8)
    for _ in range(3000):  # a clean prefix: every audit right
        assert audit(watch, 0.97, True) is None
    assert weighted.suspect is None
    watch._suspect()  # what a traffic trip or a drift alarm does
    assert weighted.suspect is not None and weighted.suspect.alpha == pytest.approx(alpha / 16)
    alarm = None
    for i in range(2000):  # then 80% right against a 95% promise
        alarm = audit(watch, 0.97, i % 5 != 0)
        if alarm is not None:
            break
    assert alarm is not None and "since the traffic turned suspect" in str(alarm)
    assert not weighted.whole.alarm  # the whole-stream test is still paying its prefix back
    assert weighted.suspect.n < weighted.whole.n


def test_a_rebuilt_watch_takes_no_label_of_an_audit_drawn_before() -> None:
    settings = WatchSettings.of(watched_policy(audit_rate=1.0))
    old = PolicyWatch(settings)
    draw, _ = old.draw(0.95)
    assert draw is not None
    fresh = old.rebuilt(WatchSettings.of(watched_policy(audit_rate=1.0, alarm_alpha=0.01)))
    assert fresh.weighted.next_ticket == old.weighted.next_ticket
    assert fresh.audited(draw.ticket, False) is None and fresh.weighted.whole.n == 0
    assert not fresh.weighted.labelled(draw.ticket, False)  # the ticket is not one of its own
