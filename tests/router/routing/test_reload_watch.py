"""The policy reload boundary: a wrong-typed file through the watch or SIGHUP
is refused with one ERROR line naming the file and the field, the watch lives on and loads the
next valid file; a Kubernetes ConfigMap's ``..data`` symlink swap reloads every time; reloads are
counted by result; a ``policy.shadow`` a file overrides is logged."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from router.routing.registry import PolicyRegistry
from router.routing.reload import live_reload, log_shadow_precedence, reload_now
from router.settings import PolicySettings
from router.store.metrics import Metrics
from tests.reliability.conftest import metric_value
from tests.router.routing.test_shadow_reload import FINGERPRINT, write_policy


def wrong_typed(path: Path) -> Path:
    """A valid policy file whose temperature calibrator's fitted state is null."""
    write_policy(path, shadow=False)
    data = json.loads(path.read_text())
    data["calibrator"] = {"kind": "temperature", "options": {}, "state": {"temperature_": None}}
    path.write_text(json.dumps(data))
    return path


def policy_id(registry: PolicyRegistry) -> str:
    [policy] = registry.loaded()
    return policy.runtime.policy_id


async def until(predicate: Callable[[], bool], within_s: float = 8.0) -> bool:
    for _ in range(int(within_s / 0.05)):
        if predicate():
            return True
        await asyncio.sleep(0.05)
    return predicate()


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_wrong_typed_file_is_refused_once_and_the_watch_loads_the_next(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A TypeError in a file is logged once and the watch task survives it: a watch that died
    without a line would never load the next file."""
    path = write_policy(tmp_path / "p.json", shadow=False, threshold=0.9)
    registry = PolicyRegistry.load(PolicySettings(files=[path]), backend_fingerprint=FINGERPRINT)
    first, metrics = policy_id(registry), Metrics()
    with caplog.at_level(logging.INFO, logger="slotgate"):
        async with live_reload(registry, watch=True, metrics=metrics):
            await asyncio.sleep(0.3)
            wrong_typed(tmp_path / "bad.json").replace(path)
            assert await until(lambda: len(refusals(caplog)) >= 1)
            await asyncio.sleep(1.5)  # more events or rescans must not log it again
            write_policy(path, shadow=False, threshold=0.8)
            assert await until(lambda: policy_id(registry) != first)
    [line] = refusals(caplog)
    assert str(path) in line and "calibrator" in line and "keep serving" in line
    text = metrics.render().decode()
    assert metric_value(text, "slotgate_policy_reloads_total", result="refused") == 1
    assert metric_value(text, "slotgate_policy_reloads_total", result="loaded") == 1


async def test_sighup_on_a_wrong_typed_file_logs_a_refusal_not_a_traceback(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write_policy(tmp_path / "p.json", shadow=False)
    registry = PolicyRegistry.load(PolicySettings(files=[path]), backend_fingerprint=FINGERPRINT)
    wrong_typed(path)
    with caplog.at_level(logging.INFO, logger="slotgate"):
        async with live_reload(registry, watch=False):
            os.kill(os.getpid(), signal.SIGHUP)
            assert await until(lambda: len(refusals(caplog)) >= 1)
    [line] = refusals(caplog)
    assert str(path) in line and "calibrator" in line
    assert not any(r.exc_info for r in caplog.records)


async def test_anything_a_reload_raises_is_one_refusal(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(PolicyRegistry):
        def reload(self) -> bool:
            raise RuntimeError("disk on fire")

    metrics = Metrics()
    with caplog.at_level(logging.ERROR, logger="slotgate"):
        assert reload_now(Broken(), "SIGHUP", metrics) is False
    [line] = refusals(caplog)
    assert "RuntimeError: disk on fire" in line
    assert metric_value(metrics.render().decode(), "slotgate_policy_reloads_total",
                        result="refused") == 1


def configmap_revision(mount: Path, revision: int, *, threshold: float) -> None:
    """What the kubelet does on a ConfigMap update: the files in a new revision folder, a
    ``..data_tmp`` symlink to it renamed over ``..data``, the old revision folder removed."""
    folder = mount / f"..2026_12_03_{revision:02d}"
    folder.mkdir()
    write_policy(folder / "policy.json", shadow=False, threshold=threshold)
    old = os.readlink(mount / "..data") if (mount / "..data").is_symlink() else None
    os.symlink(folder.name, mount / "..data_tmp")
    os.replace(mount / "..data_tmp", mount / "..data")
    if not (mount / "policy.json").is_symlink():
        os.symlink("..data/policy.json", mount / "policy.json")
    if old is not None:
        shutil.rmtree(mount / old)


async def test_every_configmap_symlink_swap_reloads(tmp_path: Path) -> None:
    """The watch follows the ``..data`` symlink, not the revision folder it resolves to: the
    first swap deletes that folder, so a watch on it would never see the second swap."""
    mount = tmp_path / "config"
    mount.mkdir()
    configmap_revision(mount, 0, threshold=0.9)
    registry = PolicyRegistry.load(PolicySettings(files=[mount / "policy.json"]),
                                   backend_fingerprint=FINGERPRINT)
    seen = [policy_id(registry)]
    async with live_reload(registry, watch=True):
        await asyncio.sleep(0.3)
        for revision, threshold in enumerate((0.8, 0.7, 0.6, 0.5), start=1):
            configmap_revision(mount, revision, threshold=threshold)
            assert await until(lambda: policy_id(registry) != seen[-1]), f"swap {revision}"
            seen.append(policy_id(registry))
    assert len(set(seen)) == 5


async def test_a_file_overriding_policy_shadow_is_logged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """SLOTGATE_POLICY__SHADOW=true and a file saying "shadow": false: the file wins (it is what
    moves a policy to routing, live), and a WARNING says so at start-up and at reloads."""
    path = write_policy(tmp_path / "p.json", shadow=False)
    settings = PolicySettings.model_validate({"files": [path], "shadow": True})
    registry = PolicyRegistry.load(settings, backend_fingerprint=FINGERPRINT)
    with caplog.at_level(logging.WARNING, logger="slotgate"):
        async with live_reload(registry, watch=False, settings=settings):
            pass
    [line] = [r.getMessage() for r in caplog.records
              if r.levelno == logging.WARNING and "wins over policy.shadow" in r.getMessage()]
    assert "'intents'" in line and "wins over policy.shadow = true" in line
    assert registry.mode(registry.loaded()[0].runtime)[0] is False
    # Not set explicitly (the default), or agreeing: nothing to say.
    quiet = PolicySettings.model_validate({"files": [path]})
    assert log_shadow_precedence(PolicyRegistry.load(quiet, backend_fingerprint=FINGERPRINT),
                                 quiet) == []
