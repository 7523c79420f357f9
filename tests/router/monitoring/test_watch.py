"""PolicyWatch: accuracy alarm from labels, seeded audit draws, the accept share window."""

from __future__ import annotations

import pytest

from router.monitoring.watch import ACCEPT_WINDOW, PolicyWatch, WatchSettings
from tests.router.monitoring.conftest import watched_policy


def test_labels_below_the_target_raise_the_accuracy_alarm() -> None:
    watch = PolicyWatch(WatchSettings.of(watched_policy()))
    alarm = None
    for i in range(400):
        alarm = watch.label(i % 4 != 0) or alarm  # 75% right against a 95% promise
        if alarm:
            break
    assert alarm is not None and alarm.kind == "accuracy" and watch.gate.escalate
    # the betting test needs far fewer labels than the empirical-Bernstein interval (gauges)
    assert watch.shortfall.n < 60 and watch.report()["accuracy_upper"] > 0.95
    kept = PolicyWatch(WatchSettings.of(watched_policy()))
    for i in range(3000):  # 97% right: the promise holds, no alarm
        assert kept.label(i % 100 >= 3) is None


def test_audit_draws_are_seeded_and_at_the_rate() -> None:
    settings = WatchSettings.of(watched_policy(audit_rate=0.2))
    first, second = PolicyWatch(settings), PolicyWatch(settings)
    a = [first.wants_audit() for _ in range(2000)]
    assert a == [second.wants_audit() for _ in range(2000)]
    assert sum(a) / 2000 == pytest.approx(0.2, abs=0.03)
    assert not any(PolicyWatch(WatchSettings.of(watched_policy())).wants_audit()
                   for _ in range(100))


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
    watch = PolicyWatch(WatchSettings.of(watched_policy()))
    for i in range(400):
        watch.observe(0.81, accepted=True, key=str(i))  # accepted, less sure than the tuning rows
        watch.label(False)
    assert set(watch.alarms) == {"drift", "accuracy"}
    old = watch.alarms["drift"]
    assert watch.clear(old.time + 1.0) and not watch.alarms
    assert watch.drift is not None and not watch.drift.alarm and watch.accuracy.n == 0
    assert not watch.restore(old)  # raised before the clear: stays cleared
    assert not watch.clear(old.time)  # an older clear changes nothing


def test_after_a_trip_the_suspect_test_alarms_on_fewer_labels_than_the_whole_stream_test() -> None:
    """Both accuracy tests bet at alarm_alpha / 4; the one started at the traffic trip owes
    nothing to the right answers labelled before it, which the whole-stream test must earn
    back."""
    watch = PolicyWatch(WatchSettings.of(watched_policy()))
    assert watch.shortfall.alpha == pytest.approx(watch.settings.alarm_alpha / 4)
    for i in range(300):  # a clean prefix: 99% right
        assert watch.label(i % 100 != 0) is None
    assert watch.suspect_shortfall is None
    watch._suspect()  # what a traffic trip or a drift alarm does
    assert watch.suspect_shortfall is not None
    assert watch.suspect_shortfall.alpha == pytest.approx(watch.settings.alarm_alpha / 4)
    alarm = None
    for i in range(400):  # then 80% right against a 95% promise
        alarm = watch.label(i % 5 != 0)
        if alarm is not None:
            break
    assert alarm is not None and "since the traffic turned suspect" in alarm.detail
    assert not watch.shortfall.alarm  # the whole-stream test is still paying its prefix back
    assert watch.suspect_shortfall.n < 120
