"""Start-up configuration: the policy registry (lookup order, fingerprint refusal), the backend
factory (lazy imports, errors naming the kind), and the app's lifespan messages."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from policies.file import PolicyFile
from policies.rules import ThresholdRule
from policies.scope import Question, scope_signature
from policies.types import DecisionRequest, Option
from router.backends import factory
from router.backends.factory import build_backend
from router.backends.mock import MockBackend
from router.errors import ConfigError
from router.http.app import create_app
from router.http.state import app_state
from router.routing.registry import PolicyRegistry
from router.settings import FastBackendSettings, PolicySettings, Settings

FINGERPRINT = "f" * 16


def request(instructions: str = "Which?", policy: str | None = None) -> DecisionRequest:
    return DecisionRequest("q", instructions, (Option("a"), Option("b")), "text", policy=policy)


def policy_file(tmp_path: Path, name: str, *, signature: str | None = None,
                fingerprint: str = FINGERPRINT, threshold: float = 0.8,
                question: Question | None = None) -> Path:
    """A policy file scoped to ``question`` over options a, b (or, ``signature`` given, to
    that one logged request)."""
    question = question or Question.of(request())
    scope: dict[str, Any] = ({"signature": signature} if signature is not None else
                             {"signature": scope_signature(["a", "b"], question),
                              "question": question.as_dict()})
    policy = PolicyFile(
        name=name, backend_fingerprint=fingerprint,
        calibrator={"kind": "none"}, rule=ThresholdRule(threshold).to_dict(), threshold=threshold,
        target_accuracy=0.95, delta=0.05, bound=0.95, coverage=0.7, n_tune=100, n_calibration=0,
        data_hash="0" * 64, options=["a", "b"], **scope)
    path = tmp_path / f"{name}.json"
    policy.write(path)
    return path


def test_lookup_order_name_then_signature_then_default_then_fallback(tmp_path: Path) -> None:
    by_sig = policy_file(tmp_path, "by-sig", signature=request("Signed?").signature())
    default = policy_file(tmp_path, "default", question=Question.of(request("Other?")))
    settings = PolicySettings(files=[by_sig, default], default="default")
    registry = PolicyRegistry.load(settings, backend_fingerprint=FINGERPRINT)

    def pid(r: DecisionRequest, fingerprint: str = FINGERPRINT) -> str | None:
        found = registry.lookup(r, fingerprint=fingerprint)
        return None if found is None else found.policy_id

    assert (pid(request("Signed?")) or "").startswith("by-sig@")
    assert (pid(request("Other?")) or "").startswith("default@")
    assert (pid(request("Other?"), fingerprint="another") or "").startswith("default@")
    # Asked for by name, a policy still decides only its own question.
    assert (pid(request("Signed?", policy="by-sig")) or "").startswith("by-sig@")
    assert pid(request("Other?", policy="by-sig")) is None
    assert pid(request("Third?")) is None
    bare = PolicyRegistry.load(PolicySettings(files=[by_sig]), backend_fingerprint=FINGERPRINT)
    assert bare.lookup(request("Other?"), fingerprint=FINGERPRINT) is None  # unscoped: escalate


def test_a_policy_tuned_for_another_backend_is_refused_unless_allowed(tmp_path: Path) -> None:
    path = policy_file(tmp_path, "old", fingerprint="0123456789abcdef")
    with pytest.raises(ConfigError) as info:
        PolicyRegistry.load(PolicySettings(files=[path]), backend_fingerprint=FINGERPRINT)
    message = info.value.message
    assert "0123456789abcdef" in message and FINGERPRINT in message
    assert "allow_fingerprint_mismatch" in message and str(path) in message
    allowed = PolicySettings(files=[path], allow_fingerprint_mismatch=True)
    assert PolicyRegistry.load(allowed, backend_fingerprint=FINGERPRINT).names() == ["old"]


@pytest.mark.parametrize(("files", "default", "match"), [
    (["a", "a"], None, "two policy files are named 'a'"),
    (["a"], "b", "policy.default names 'b'"),
])
def test_bad_registry_configs(tmp_path: Path, files: list[str], default: str | None,
                              match: str) -> None:
    paths = []
    for i, name in enumerate(files):
        sub = tmp_path / str(i)
        sub.mkdir()
        paths.append(policy_file(sub, name))
    with pytest.raises(ConfigError, match=match):
        PolicyRegistry.load(PolicySettings(files=paths, default=default),
                            backend_fingerprint=FINGERPRINT)


def test_unreadable_policy_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text("{")
    with pytest.raises(ConfigError, match="broken.json"):
        PolicyRegistry.load(PolicySettings(files=[path]), backend_fingerprint=FINGERPRINT)


def test_factory_errors_name_the_kind(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="kind 'sklearn'.*not found"):
        build_backend(FastBackendSettings(kind="sklearn", model_path=tmp_path / "missing.joblib"))
    monkeypatch.setitem(factory._BACKENDS, "vllm", ("router.backends.not_written_yet", "X"))
    with pytest.raises(ConfigError, match="kind 'vllm': cannot import router.backends.not_wri"):
        build_backend(FastBackendSettings(kind="vllm"))


def test_mock_kind_from_config() -> None:
    backend = build_backend(FastBackendSettings(kind="mock", options={"top_proba": 0.7}))
    assert isinstance(backend, MockBackend)


async def test_lifespan_warns_when_escalation_is_unavailable(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(log={"decision_log_path": tmp_path / "log.jsonl"})
    app = create_app(settings, backend=MockBackend(lambda r: [0.5, 0.5]))
    with caplog.at_level(logging.WARNING, logger="slotgate"):
        async with app.router.lifespan_context(app):
            assert app_state(app).service.escalation_available is False
    assert "ESCALATION UNAVAILABLE" in caplog.text and "SLOTGATE_SLOW_MODEL" in caplog.text


async def test_lifespan_refuses_a_mismatched_policy(tmp_path: Path) -> None:
    path = policy_file(tmp_path, "other", fingerprint="0123456789abcdef")
    settings = Settings(log={"decision_log_path": tmp_path / "log.jsonl"},
                        policy={"files": [path]})
    app = create_app(settings, backend=MockBackend(lambda r: [0.5, 0.5]))
    with pytest.raises(ConfigError, match="tuned for backend fingerprint"):
        async with app.router.lifespan_context(app):
            pass


def test_two_apps_keep_separate_metrics() -> None:
    first: Any = create_app(Settings())
    second: Any = create_app(Settings())
    app_state(first).metrics.decision(route="fast", escalated=False)
    assert b'slotgate_decisions_total{route="fast"} 1.0' in app_state(first).metrics.render()
    assert b'slotgate_decisions_total{route="fast"}' not in app_state(second).metrics.render()


async def test_factory_builds_a_network_backend_without_touching_the_network() -> None:
    from router.backends.systemone import SystemOneBackend

    backend = build_backend(FastBackendSettings(kind="systemone", url="http://127.0.0.1:9"))
    try:
        assert isinstance(backend, SystemOneBackend) and len(backend.fingerprint) == 16
    finally:
        await backend.aclose()


async def test_lifespan_refuses_an_unwritable_decision_log(tmp_path: Path) -> None:
    (tmp_path / "blocker").write_text("a file where the log's folder should be")
    settings = Settings(log={"decision_log_path": tmp_path / "blocker" / "log.jsonl"})
    app = create_app(settings, backend=MockBackend(lambda r: [0.5, 0.5]))
    with pytest.raises(ConfigError, match="log.decision_log_path"):
        async with app.router.lifespan_context(app):
            pass


async def test_readyz_reports_a_decision_log_that_can_no_longer_be_written(tmp_path: Path) -> None:
    import shutil

    import httpx

    folder = tmp_path / "logs"
    settings = Settings(log={"decision_log_path": folder / "log.jsonl"})
    app = create_app(settings, backend=MockBackend(lambda r: [0.5, 0.5]))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            ready = await client.get("/readyz")
            assert ready.status_code == 200 and ready.json()["checks"]["decision_log"] is True
            shutil.rmtree(folder)
            folder.write_text("the folder was replaced by a file")
            gone = await client.get("/readyz")
    assert gone.status_code == 503 and gone.json()["checks"]["decision_log"] is False
