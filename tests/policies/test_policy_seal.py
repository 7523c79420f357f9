"""A tuned policy file is sealed with a digest over what tuning produced (and signed, given a
key): an edit after tuning is refused at load, naming the file and field, or served without
its guarantee (``policy.on_edited: unguaranteed``); the operator's own fields stay editable."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from policies.file import load_policy
from policies.policy import Policy
from policies.scope import Question
from policies.types import DecisionRequest, Option
from router.errors import ConfigError
from router.routing.registry import PolicyRegistry
from router.settings import PolicySettings

OPTIONS = ("a", "b", "c")


def tuned(path: Path, *, key: bytes | None = None) -> Path:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, size=600)
    logits = rng.normal(0, 1, size=(600, 3))
    logits[np.arange(600), labels] += 3.0
    proba = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    fitted = Policy(target_accuracy=0.8).fit(proba, labels, options=OPTIONS)
    fitted.to_file(name="p", data_hash="0" * 64, question=Question("q"),
                   backend_fingerprint="fp", signing_key=key).write(path)
    return path


def edited(path: Path, **changes: object) -> Path:
    data = json.loads(path.read_text())
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = data
        for part in parents:
            node = node[part]
        node[last] = value
    path.write_text(json.dumps(data))
    return path


def request() -> DecisionRequest:
    return DecisionRequest("q", "", tuple(Option(o) for o in OPTIONS), "x")


def test_a_tuned_file_is_sealed_and_loads(tmp_path: Path) -> None:
    path = tuned(tmp_path / "p.json")
    file = load_policy(path)
    assert file.digest == file.content_digest() and file.integrity_problem() is None
    registry = PolicyRegistry.load(PolicySettings(files=[path]), backend_fingerprint="fp")
    policy = registry.lookup(request(), fingerprint="fp")
    assert policy is not None and registry.mode(policy)[1] == "accuracy"


def test_a_hand_edited_threshold_is_refused_naming_the_file_and_field(tmp_path: Path) -> None:
    path = edited(tuned(tmp_path / "p.json"), rule__threshold=0.0)
    with pytest.raises(ConfigError) as info:
        PolicyRegistry.load(PolicySettings(files=[path]), backend_fingerprint="fp")
    assert str(path) in info.value.message and "field 'digest'" in info.value.message
    assert "edited after tuning" in info.value.message


def test_served_unguaranteed_when_the_operator_says_so(tmp_path: Path) -> None:
    path = edited(tuned(tmp_path / "p.json"), rule__threshold=0.0)
    registry = PolicyRegistry.load(PolicySettings(files=[path], on_edited="unguaranteed"),
                                   backend_fingerprint="fp")
    policy = registry.lookup(request(), fingerprint="fp")
    assert policy is not None and registry.mode(policy)[1] is None


def test_the_operators_fields_stay_editable(tmp_path: Path) -> None:
    path = edited(tuned(tmp_path / "p.json"), shadow=True, audit_rate=0.2,
                  on_alarm="escalate_all")
    registry = PolicyRegistry.load(PolicySettings(files=[path]), backend_fingerprint="fp")
    policy = registry.lookup(request(), fingerprint="fp")
    assert policy is not None and registry.mode(policy) == (True, "accuracy")


def test_signed_policies_need_the_configured_key(tmp_path: Path) -> None:
    signed = tuned(tmp_path / "signed.json", key=b"k1")
    unsigned = tuned(tmp_path / "unsigned.json")
    PolicyRegistry.load(PolicySettings(files=[signed], signing_key="k1"),
                        backend_fingerprint="fp")
    for path, key in ((signed, "k2"), (unsigned, "k1")):
        with pytest.raises(ConfigError, match="field 'digest'"):
            PolicyRegistry.load(PolicySettings(files=[path], signing_key=key),
                                backend_fingerprint="fp")


def test_a_file_written_before_digests_still_loads_and_keeps_its_id(tmp_path: Path) -> None:
    path = tuned(tmp_path / "p.json")
    sealed = load_policy(path)
    data = json.loads(path.read_text())
    del data["digest"], data["hmac"]
    path.write_text(json.dumps(data))
    old = load_policy(path)
    assert old.digest is None and old.policy_id == sealed.policy_id
    PolicyRegistry.load(PolicySettings(files=[path]), backend_fingerprint="fp")
