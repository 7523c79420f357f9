"""PolicyRegistry on its own: the lookup order (the name a request asks for, then the policy's
scope with the backend fingerprint, then the configured default, then the fallback), scopes (a
policy decides only the question it was tuned on) and the configuration errors it refuses at
start-up. Loading policy files: tests/router/http/test_app_config.py."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from policies.file import PolicyFile
from policies.rules import ThresholdRule
from policies.types import DecisionRequest, Option, OptionScores, Verdict
from router.errors import ConfigError, InvalidRequest
from router.routing.registry import LoadedPolicy, PolicyRegistry

FINGERPRINT = "fp-current"


@dataclass(eq=False)
class Named:
    """A runtime policy that is only its id: lookups are checked by which one comes back."""

    policy_id: str

    def decide(self, scores: OptionScores, *, escalations: int = 0
               ) -> tuple[Verdict, list[float]]:
        raise AssertionError("lookups never decide")

    def escalation_window(self) -> None:
        return None


def request(question: str = "Which intent?", *, policy: str | None = None) -> DecisionRequest:
    return DecisionRequest("intent", question, (Option("a"), Option("b")), "some text",
                           policy=policy)


def loaded(name: str, *, signature: str | None = None, fingerprint: str = FINGERPRINT,
           options: tuple[str, ...] | None = ("a", "b")) -> LoadedPolicy:
    return LoadedPolicy(policy_file(name, signature=signature, fingerprint=fingerprint,
                                    options=options), Named(name))


def policy_file(name: str, *, signature: str | None = None, fingerprint: str = FINGERPRINT,
                options: tuple[str, ...] | None = ("a", "b"), **fields: Any) -> PolicyFile:
    """A valid policy file with what a lookup reads set: name, scope, fingerprint, mode."""
    return PolicyFile(name=name, signature=signature, backend_fingerprint=fingerprint,
                      calibrator={"kind": "none"}, rule=ThresholdRule(0.8).to_dict(),
                      target_accuracy=0.95, delta=0.05, bound=0.95, coverage=0.7, n_tune=100,
                      n_calibration=0, data_hash="0" * 64,
                      options=None if options is None else list(options), **fields)


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


# --- scope (issue 19.1): a policy answers only the question it was tuned on -------------------

INTENTS = tuple(f"intent_{i}" for i in range(77))


def intents_request(options: tuple[str, ...] = INTENTS, *, question: str = "intent",
                    policy: str | None = None) -> DecisionRequest:
    return DecisionRequest(question, question, tuple(Option(o) for o in options), "my card?",
                           policy=policy)


def test_a_default_policy_takes_only_decisions_over_its_own_options() -> None:
    """The README's case: a 2-option question (2 of the 77 intents) against the default 77-intent
    policy. Before scopes, the default answered it with the 77-option calibration and bar."""
    default = loaded("banking77", options=INTENTS)
    registry = PolicyRegistry([default], default="banking77", unscoped="escalate")
    full = registry.lookup(intents_request(question="anything"), fingerprint="another-backend")
    assert full is not None and full.policy_id == "banking77"
    subset = intents_request(("intent_11", "intent_41"))
    assert registry.lookup(subset, fingerprint=FINGERPRINT) is None  # unscoped: escalate
    # The same options in another order are the same question (a client's enum order is its
    # own; every calibrator is top-label or one temperature): covered, by scope or as default.
    reordered = intents_request(INTENTS[::-1])
    for fingerprint in (FINGERPRINT, "another-backend"):
        match = registry.lookup(reordered, fingerprint=fingerprint)
        assert match is not None and match.policy_id == "banking77"
    one_more = intents_request((*INTENTS, "intent_77"))
    assert registry.lookup(one_more, fingerprint="another-backend") is None
    threshold = PolicyRegistry([default], default="banking77", unscoped="threshold")
    assert threshold.lookup(subset, fingerprint=FINGERPRINT) is threshold.fallback


def test_a_policy_asked_for_by_name_outside_its_scope_leaves_the_decision_unscoped() -> None:
    registry = PolicyRegistry([loaded("banking77", options=INTENTS)], unscoped="shadow")
    named = registry.lookup(intents_request(policy="banking77"), fingerprint=FINGERPRINT)
    assert named is not None and named.policy_id == "banking77"
    subset = intents_request(INTENTS[:2], policy="banking77")
    assert registry.lookup(subset, fingerprint=FINGERPRINT) is None


def test_a_scope_with_a_question_name_covers_only_that_question() -> None:
    from policies.scope import scope_signature

    named = loaded("intent-only", options=INTENTS, signature=scope_signature(INTENTS, "intent"))
    registry = PolicyRegistry([named], unscoped="escalate")
    match = registry.lookup(intents_request(question="intent"), fingerprint=FINGERPRINT)
    assert match is not None and match.policy_id == "intent-only"
    assert registry.lookup(intents_request(question="queue"), fingerprint=FINGERPRINT) is None
    # Options only (a policy tuned on a CSV): any question over exactly those options.
    any_question = loaded("csv", options=INTENTS, signature=scope_signature(INTENTS))
    registry = PolicyRegistry([any_question], unscoped="escalate")
    match = registry.lookup(intents_request(question="queue"), fingerprint=FINGERPRINT)
    assert match is not None and match.policy_id == "csv"


def test_a_policy_of_unknown_scope_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match="'old'.*neither the question.*re-tune"):
        PolicyRegistry([loaded("old", options=None)])
    # A file tuned on one logged request keeps answering exactly that request's question.
    exact = PolicyRegistry([loaded("logged", options=None, signature=request().signature())],
                           unscoped="escalate")
    assert exact.lookup(request(), fingerprint=FINGERPRINT) is not None
    assert exact.lookup(request("Another?"), fingerprint=FINGERPRINT) is None


def test_files_written_before_scopes_are_scoped_by_their_recorded_options(tmp_path: Path) -> None:
    """A file with a null signature and an ``options`` list (tuned before scopes were recorded)
    answers any question over those options; the settings' default for the rest is escalate,
    and a configuration that set fallback_threshold keeps its threshold."""
    from policies.file import PolicyFile
    from policies.rules import ThresholdRule
    from router.settings import PolicySettings

    path = tmp_path / "old.json"
    PolicyFile(name="old", backend_fingerprint=FINGERPRINT, calibrator={"kind": "none"},
               rule=ThresholdRule(0.8).to_dict(), threshold=0.8, target_accuracy=0.95,
               delta=0.05, bound=0.95, coverage=0.7, n_tune=100, n_calibration=0,
               data_hash="0" * 64, options=["a", "b"]).write(path)
    registry = PolicyRegistry.load(PolicySettings(files=[path], default="old"),
                                   backend_fingerprint=FINGERPRINT)
    assert registry.unscoped == "escalate"
    match = registry.lookup(request("Any question?"), fingerprint=FINGERPRINT)
    assert match is not None and match.policy_id.startswith("old@")
    three = DecisionRequest("intent", "Which?", (Option("a"), Option("b"), Option("c")), "x")
    assert registry.lookup(three, fingerprint=FINGERPRINT) is None
    kept = PolicyRegistry.load(PolicySettings(files=[path], fallback_threshold=0.7),
                               backend_fingerprint=FINGERPRINT)
    assert kept.unscoped == "threshold" and kept.lookup(three, fingerprint=FINGERPRINT) is kept.fallback
    chosen = PolicySettings(files=[path], fallback_threshold=0.7, unscoped="unverified")
    assert PolicyRegistry.load(chosen, backend_fingerprint=FINGERPRINT).unscoped == "unverified"


@pytest.mark.parametrize(("in_file", "server", "shadowed"), [
    (None, True, True), (None, False, False), (False, True, False), (True, False, True)])
def test_a_file_that_leaves_shadow_unset_follows_the_servers_policy_shadow(
        in_file: bool | None, server: bool, shadowed: bool) -> None:
    """`slotgate tune` leaves ``shadow`` unset unless told, so SLOTGATE_POLICY__SHADOW=true shadows
    a freshly tuned policy; a file that says true or false keeps its word."""
    policy = LoadedPolicy(policy_file("p", shadow=in_file), Named("p"))
    registry = PolicyRegistry([policy], default="p", shadow=server)
    runtime = registry.lookup(request(), fingerprint=FINGERPRINT)
    assert runtime is not None and registry.mode(runtime)[0] is shadowed
