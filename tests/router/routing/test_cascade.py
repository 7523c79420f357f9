"""A cascade policy through the routing service: each tier reads only what the tiers before it
turned down, a tier that accepts answers, what none accepts escalates, every reply and log
record shows the tiers read, and the registry refuses a cascade whose tiers are not configured."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from policies.file import PolicyFile
from policies.scope import Question, scope_signature
from policies.types import DecisionRequest, Option
from router.backends.mock import MockBackend
from router.errors import BackendUnavailable, ConfigError
from router.routing.registry import PolicyRegistry
from router.routing.service import RoutingService
from router.settings import PolicySettings, Settings
from router.store.cache import MemoryCache
from router.store.metrics import Metrics
from tests.router.routing.test_service import ListLog, RecordingSlow

OPTIONS = ("a", "b", "c")
QUESTION = Question.asked("intent", instructions="Which intent?")
IDENTITY = {"kind": "none"}


def request(state: str) -> DecisionRequest:
    return DecisionRequest("intent", "Which intent?", tuple(Option(o) for o in OPTIONS), state)


def cheap(req: DecisionRequest) -> list[float]:
    """Sure of 'a' on 'easy' texts; unsure otherwise."""
    return [0.95, 0.03, 0.02] if "easy" in req.state else [0.4, 0.35, 0.25]


def deep(req: DecisionRequest) -> list[float]:
    """Sure of 'b' on 'medium' texts; unsure otherwise; fails on 'broken'."""
    if "broken" in req.state:
        raise BackendUnavailable("the deep tier is down")
    return [0.05, 0.9, 0.05] if "medium" in req.state else [0.34, 0.33, 0.33]


def cascade_file(tmp_path: Path, *, thresholds: tuple[float | None, float | None] = (0.9, 0.8),
                 names: tuple[str, str] = ("fast", "deep"),
                 fingerprints: tuple[str, str] | None = None,
                 references: dict[str, Any] | None = None) -> Path:
    prints = fingerprints or (MockBackend(cheap, label="cheap").fingerprint,
                              MockBackend(deep, label="deep").fingerprint)
    tiers = [{"name": name, "backend_fingerprint": fp, "calibrator": IDENTITY,
              "threshold": t, "cost": cost, "coverage": 0.4,
              "reference": (references or {}).get(name)}
             for name, fp, t, cost in zip(names, prints, thresholds, (0.2, 1.4), strict=True)]
    file = PolicyFile.model_validate({
        "name": "intents", "signature": scope_signature(OPTIONS, QUESTION),
        "backend_fingerprint": prints[0], "calibrator": IDENTITY,
        "rule": {"kind": "threshold", "threshold": thresholds[0]},
        "target_accuracy": 0.9, "delta": 0.05, "bound": 0.91, "coverage": 0.8, "n_tune": 500,
        "n_calibration": 500, "data_hash": "0" * 64, "options": list(OPTIONS),
        "question": QUESTION.as_dict(),
        "cascade": {"tiers": tiers, "slow_cost": 500.0, "slow_coverage": 0.2,
                    "expected_cost": 101.0},
    })
    path = tmp_path / "intents.json"
    file.write(path)
    return path


def make(tmp_path: Path, **file_options: Any) -> tuple[RoutingService, ListLog, RecordingSlow,
                                                       dict[str, MockBackend]]:
    calls: dict[str, list[str]] = {"fast": [], "deep": []}

    def counted(name: str, handler: Any) -> Any:
        def read(req: DecisionRequest) -> Any:
            calls[name].append(req.state)
            return handler(req)
        return read

    backends = {"fast": MockBackend(counted("fast", cheap), label="cheap"),
                "deep": MockBackend(counted("deep", deep), label="deep")}
    for name, backend in backends.items():
        backend.calls = calls[name]  # type: ignore[attr-defined]
    settings = Settings(tiers=[{"name": "fast", "kind": "mock"}, {"name": "deep", "kind": "mock"}])
    registry = PolicyRegistry.load(
        PolicySettings(files=[cascade_file(tmp_path, **file_options)]),
        backend_fingerprint=backends["fast"].fingerprint,
        tiers=[(n, b.fingerprint) for n, b in backends.items()])
    log, slow = ListLog(), RecordingSlow()
    service = RoutingService(
        backend=backends["fast"], tiers={"deep": backends["deep"]},
        cache=MemoryCache(max_entries=100, ttl_s=60), registry=registry,
        slow=slow, log=log, metrics=Metrics(), settings=settings)  # type: ignore[arg-type]
    return service, log, slow, backends


async def test_each_tier_reads_only_what_the_tiers_before_it_turned_down(tmp_path: Path) -> None:
    service, log, slow, backends = make(tmp_path)
    easy, medium, hard = await service.route(
        [request("easy one"), request("medium one"), request("hard one")], namespace="t")
    assert (easy.answer, easy.route, easy.tier) == ("a", "fast", "fast")
    assert (medium.answer, medium.route, medium.tier) == ("b", "fast", "deep")
    assert (hard.answer, hard.route, hard.tier) == ("c", "slow", None)  # the slow model's
    assert backends["fast"].calls == ["easy one", "medium one", "hard one"]  # type: ignore[attr-defined]
    assert backends["deep"].calls == ["medium one", "hard one"]  # type: ignore[attr-defined]
    assert slow.calls == ["hard one"]
    # The served tier's own threshold and calibrated probability stand for the decision.
    assert (medium.probability, medium.threshold) == (pytest.approx(0.9), 0.8)
    assert [(t.tier, t.answer, t.accepted) for t in medium.tiers or ()] == [
        ("fast", "a", False), ("deep", "b", True)]
    assert [t["tier"] for t in hard.facts()["tiers"]] == ["fast", "deep"]
    assert easy.facts()["tiers"] == [{"tier": "fast", "answer": "a", "probability": 0.95,
                                      "threshold": 0.9, "accepted": True, "cached": False}]
    logged = {r["decision_id"]: r for r in log.records}
    assert logged[medium.decision_id]["tier"] == "deep"
    assert [t["accepted"] for t in logged[hard.decision_id]["tiers"]] == [False, False]
    shown = service.metrics.render()
    assert b'slotgate_tier_reads_total{accepted="true",tier="deep"} 1.0' in shown
    assert b'slotgate_tier_reads_total{accepted="false",tier="fast"} 2.0' in shown


async def test_later_tier_reads_are_cached_under_that_tiers_fingerprint(tmp_path: Path) -> None:
    service, _, _, backends = make(tmp_path)
    await service.route([request("medium two")], namespace="t")
    [again] = await service.route([request("medium two")], namespace="t")
    assert (again.route, again.tier) == ("cache", "deep")
    assert [t.cached for t in again.tiers or ()] == [True, True]
    assert backends["deep"].calls == ["medium two"]  # type: ignore[attr-defined]


async def test_a_tier_tuned_off_is_never_read(tmp_path: Path) -> None:
    service, _, _, backends = make(tmp_path, thresholds=(None, 0.8))
    [d] = await service.route([request("easy but only deep reads")], namespace="t")
    assert backends["fast"].calls == []  # type: ignore[attr-defined]
    assert d.route == "slow" and [t.tier for t in d.tiers or ()] == ["deep"]


async def test_a_failed_later_read_escalates_saying_why(tmp_path: Path) -> None:
    service, _, slow, _ = make(tmp_path)
    [d] = await service.route([request("broken")], namespace="t")
    assert d.route == "slow" and slow.calls == ["broken"]
    assert d.note is not None and "the deep tier is down" in d.note
    assert [t.tier for t in d.tiers or ()] == ["fast"]


def test_a_cascade_over_tiers_not_configured_is_refused_naming_the_tier(tmp_path: Path) -> None:
    path = cascade_file(tmp_path, names=("fast", "embedding"))
    with pytest.raises(ConfigError, match="tier 'embedding' is not configured"):
        PolicyRegistry.load(PolicySettings(files=[path]),
                            backend_fingerprint=MockBackend(cheap, label="cheap").fingerprint,
                            tiers=[("fast", MockBackend(cheap, label="cheap").fingerprint),
                                   ("deep", "x")])


def test_a_cascade_tuned_on_another_tier_backend_is_refused(tmp_path: Path) -> None:
    path = cascade_file(tmp_path)
    first = MockBackend(cheap, label="cheap").fingerprint
    with pytest.raises(ConfigError, match="tier 'deep' was tuned for backend fingerprint"):
        PolicyRegistry.load(PolicySettings(files=[path]), backend_fingerprint=first,
                            tiers=[("fast", first), ("deep", "another")])


def test_settings_refuse_a_tier_name_used_twice() -> None:
    with pytest.raises(ValueError, match="tier name 'fast' is used twice"):
        Settings(tiers=[{"name": "fast", "kind": "mock"}, {"name": "fast", "kind": "mock"}])
    with pytest.raises(ValueError, match="tier name 'fast' is used twice"):
        Settings(fast={"name": "fast", "kind": "mock"}, tiers=[{"name": "fast", "kind": "mock"}])


def test_tiers_alone_list_every_tier_and_the_split_form_is_read_and_said(
        caplog: pytest.LogCaptureFixture) -> None:
    from router.settings import load_settings

    listed = load_settings(tiers=[{"name": "cheap", "kind": "mock"},
                                  {"name": "deep", "kind": "mock"}])
    split = load_settings(fast={"name": "cheap", "kind": "mock"},
                          tiers=[{"name": "deep", "kind": "mock"}])
    for settings in (listed, split):
        assert [t.name for t in settings.all_tiers] == ["cheap", "deep"]
        assert settings.fast.name == "cheap" and [t.name for t in settings.tiers] == ["deep"]
    assert not listed.split_tier_form and split.split_tier_form
    said = [r.getMessage() for r in caplog.records if "`tiers:` alone" in r.getMessage()]
    assert len(said) == 1 and "cheap, deep" in said[0]
