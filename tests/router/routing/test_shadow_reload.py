"""Shadow mode and live reload: a shadowed decision is read and judged by the fast tier but
answered by the slow model, both logged; a policy file switched from shadow to routing, or
re-tuned, is served without a restart (reload on demand and on a file change); an invalid new
file is refused with a log line naming it while the old policy keeps serving."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from policies.file import PolicyFile
from policies.rules import ThresholdRule
from policies.scope import Question, scope_signature
from router.backends.mock import MockBackend
from router.routing.registry import PolicyRegistry
from router.routing.reload import live_reload
from router.routing.service import RoutingService
from router.settings import PolicySettings, Settings
from router.store.cache import MemoryCache
from router.store.metrics import Metrics
from tests.router.routing.test_service import ListLog, RecordingSlow, request

FINGERPRINT = MockBackend(lambda r: [0.98, 0.01, 0.01]).fingerprint
QUESTION, OPTIONS = Question.of(request("x")), ["a", "b", "c"]


def write_policy(path: Path, *, shadow: bool | None, threshold: float = 0.9,
                 guarantee: str = "accuracy") -> Path:
    PolicyFile(
        name="intents", backend_fingerprint=FINGERPRINT, calibrator={"kind": "none"},
        rule=ThresholdRule(threshold).to_dict(), threshold=threshold, target_accuracy=0.95,
        delta=0.05, bound=0.95, coverage=0.7, n_tune=100, n_calibration=0, data_hash="0" * 64,
        shadow=shadow, guarantee=guarantee, options=OPTIONS, question=QUESTION.as_dict(),
        signature=scope_signature(OPTIONS, QUESTION),  # its scope: test_service's question
    ).write(path)  # type: ignore[arg-type]
    return path


def service_with(registry: PolicyRegistry) -> tuple[RoutingService, RecordingSlow, ListLog]:
    slow, log = RecordingSlow(), ListLog()
    service = RoutingService(
        backend=MockBackend(lambda r: [0.98, 0.01, 0.01]),
        cache=MemoryCache(max_entries=100, ttl_s=60), registry=registry,
        slow=slow, log=log, metrics=Metrics(), settings=Settings())  # type: ignore[arg-type]
    return service, slow, log


def load(path: Path, **settings: Any) -> PolicyRegistry:
    return PolicyRegistry.load(PolicySettings(files=[path], default="intents", **settings),
                               backend_fingerprint=FINGERPRINT)


async def test_shadow_serves_the_slow_answer_and_logs_the_fast_read(tmp_path: Path) -> None:
    registry = load(write_policy(tmp_path / "p.json", shadow=True,
                                 guarantee="agreement_with_slow"))
    service, slow, log = service_with(registry)
    [d] = await service.route([request("I am sure")], namespace="t")
    # The fast read (0.98 on 'a') clears the 0.9 bar, yet the slow model's 'c' is served.
    assert (d.answer, d.route, d.shadow, d.escalated) == ("c", "slow", True, True)
    # The slow model's answer is served: the policy's guarantee is not claimed for it.
    assert d.guarantee is None and slow.calls == ["I am sure"]
    assert d.receipt is not None and d.receipt.why.startswith("shadow mode")
    assert "shadow mode" in (d.note or "") and "would have accepted" in (d.note or "")
    [record] = log.records
    assert record["proba"] == pytest.approx([0.98, 0.01, 0.01])  # the fast read, logged
    assert record["answer"] == "c" and record["shadow"] is True


async def test_switching_shadow_off_routes_without_a_restart(tmp_path: Path) -> None:
    path = write_policy(tmp_path / "p.json", shadow=True)
    registry = load(path)
    service, slow, _ = service_with(registry)
    [before] = await service.route([request("I am sure")], namespace="t")
    write_policy(path, shadow=False)
    assert registry.reload()
    [after] = await service.route([request("I am sure too")], namespace="t")
    assert (before.route, after.route, after.shadow) == ("slow", "fast", False)
    assert after.answer == "a" and len(slow.calls) == 1
    assert after.policy_id == before.policy_id  # same tuned policy, only the mode changed


async def test_invalid_new_file_is_refused_and_the_old_policy_keeps_serving(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write_policy(tmp_path / "p.json", shadow=False, threshold=0.9)
    registry = load(path)
    service, _, _ = service_with(registry)
    data = json.loads(path.read_text())
    data["threshold"] = 1.7
    path.write_text(json.dumps(data))
    with caplog.at_level(logging.ERROR, logger="slotgate"):
        assert registry.reload() is False
    assert str(path) in caplog.text and "'threshold'" in caplog.text
    assert "keep serving" in caplog.text
    [d] = await service.route([request("I am sure")], namespace="t")
    assert (d.route, d.threshold) == ("fast", 0.9)


async def test_server_wide_shadow_covers_untuned_decisions_and_missing_files(
        tmp_path: Path) -> None:
    missing = tmp_path / "not-yet.json"
    registry = PolicyRegistry.load(PolicySettings(files=[missing], shadow=True),
                                   backend_fingerprint=FINGERPRINT)
    service, slow, _ = service_with(registry)
    [d] = await service.route([request("I am sure")], namespace="t")
    assert (d.policy_id, d.shadow, d.route, d.guarantee) == ("fallback", True, "slow", None)
    assert slow.calls == ["I am sure"]
    write_policy(missing, shadow=False)  # the first tuning: the file now routes
    assert registry.reload()
    [d] = await service.route([request("I am sure now", policy="intents")], namespace="t")
    assert (d.shadow, d.route) == (False, "fast")
    with pytest.raises(Exception, match="not found"):  # outside shadow mode a missing file is an error
        PolicyRegistry.load(PolicySettings(files=[tmp_path / "nope.json"]),
                            backend_fingerprint=FINGERPRINT)


async def test_a_changed_file_is_reloaded_by_the_watch(tmp_path: Path) -> None:
    path = write_policy(tmp_path / "p.json", shadow=True)
    registry = load(path)
    policy = registry.lookup(request("x"), fingerprint=FINGERPRINT)
    async with live_reload(registry, watch=True):
        await asyncio.sleep(0.3)  # the watch is up
        write_policy(path, shadow=False)  # written atomically (renamed over), as tune does
        for _ in range(100):
            if registry.mode(policy) == (False, "accuracy"):
                break
            await asyncio.sleep(0.05)
    assert registry.mode(policy) == (False, "accuracy")
