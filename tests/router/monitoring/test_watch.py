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
    assert alarm is not None and alarm.kind == "accuracy" and watch.escalate_all
    assert watch.snapshot()["accuracy_upper"] < 0.95


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
