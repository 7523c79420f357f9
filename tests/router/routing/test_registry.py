"""PolicyRegistry on its own: the lookup order (the name a request asks for, then the decision
signature with the backend fingerprint, then the configured default, then the fallback) and the
configuration errors it refuses at start-up. Loading policy files: tests/router/http/test_app_config.py."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from policies.types import DecisionRequest, Option, OptionScores, Verdict
from router.errors import ConfigError, InvalidRequest
from router.routing.registry import LoadedPolicy, PolicyRegistry

FINGERPRINT = "fp-current"


@dataclass
class Named:
    """A runtime policy that is only its id: lookups are checked by which one comes back."""

    policy_id: str

    def decide(self, scores: OptionScores) -> tuple[Verdict, list[float]]:
        raise AssertionError("lookups never decide")


def request(question: str = "Which intent?", *, policy: str | None = None) -> DecisionRequest:
    return DecisionRequest("intent", question, (Option("a"), Option("b")), "some text",
                           policy=policy)


def loaded(name: str, *, signature: str | None = None,
           fingerprint: str = FINGERPRINT) -> LoadedPolicy:
    return LoadedPolicy(name=name, signature=signature, backend_fingerprint=fingerprint,
                        path=None, runtime=Named(name))


def test_lookup_order_name_then_signature_then_default_then_fallback() -> None:
    signed = loaded("signed", signature=request().signature())
    registry = PolicyRegistry([signed, loaded("general")], default="general",
                              fallback_threshold=0.8)
    assert registry.lookup(request(policy="general"), fingerprint=FINGERPRINT).policy_id == "general"
    assert registry.lookup(request(), fingerprint=FINGERPRINT).policy_id == "signed"
    assert registry.lookup(request("Another question?"),
                           fingerprint=FINGERPRINT).policy_id == "general"
    no_default = PolicyRegistry([signed], fallback_threshold=0.8)
    fallback = no_default.lookup(request("Another question?"), fingerprint=FINGERPRINT)
    assert fallback is no_default.fallback and fallback.policy_id == "fallback"
    assert registry.names() == ["general", "signed"]


def test_a_signature_match_needs_the_same_backend_fingerprint() -> None:
    """Thresholds tuned on another backend's reads mean nothing for this one."""
    other = loaded("other-backend", signature=request().signature(), fingerprint="fp-old")
    registry = PolicyRegistry([other])
    assert registry.lookup(request(), fingerprint=FINGERPRINT) is registry.fallback
    assert registry.lookup(request(), fingerprint="fp-old").policy_id == "other-backend"


def test_the_fallback_holds_reads_to_its_threshold_on_the_raw_probability() -> None:
    registry = PolicyRegistry(fallback_threshold=0.8)
    verdict, calibrated = registry.fallback.decide(OptionScores(("a", "b"), (0.79, 0.21)))
    assert not verdict.accept and verdict.threshold == 0.8 and calibrated == pytest.approx([0.79, 0.21])
    verdict, _ = registry.fallback.decide(OptionScores(("a", "b"), (0.81, 0.19)))
    assert verdict.accept and verdict.index == 0


def test_an_unknown_policy_name_is_the_callers_error_naming_the_field() -> None:
    registry = PolicyRegistry([loaded("known")])
    with pytest.raises(InvalidRequest) as info:
        registry.lookup(request(policy="nope"), fingerprint=FINGERPRINT)
    assert info.value.field == "policy" and "'nope'" in info.value.message
    assert "known" in info.value.message


def test_configuration_errors_are_refused_at_start_up() -> None:
    with pytest.raises(ConfigError, match="two policy files are named 'twin'"):
        PolicyRegistry([loaded("twin"), loaded("twin")])
    with pytest.raises(ConfigError, match="policy.default names 'missing'"):
        PolicyRegistry([loaded("present")], default="missing")
