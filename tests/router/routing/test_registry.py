"""PolicyRegistry on its own: the lookup order (the name a request asks for, then the policy's
scope with the backend fingerprint, then the configured default, then the fallback), scopes (a
policy decides only the question it was tuned on: its id, text, context and kind over its
options) and the configuration errors it refuses at start-up. Loading policy files: tests/router/http/test_app_config.py."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from policies.file import PolicyFile
from policies.rules import ThresholdRule
from policies.scope import UNRECORDED_PREFIX, Question, scope_signature
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


ASKED = Question.of(request())  # the question request() asks


def loaded(name: str, *, signature: str | None = None, fingerprint: str = FINGERPRINT,
           options: tuple[str, ...] | None = ("a", "b"),
           question: Question | None = ASKED) -> LoadedPolicy:
    return LoadedPolicy(policy_file(name, signature=signature, fingerprint=fingerprint,
                                    options=options, question=question), Named(name))


def policy_file(name: str, *, signature: str | None = None, fingerprint: str = FINGERPRINT,
                options: tuple[str, ...] | None = ("a", "b"), question: Question | None = ASKED,
                **fields: Any) -> PolicyFile:
    """A valid policy file with what a lookup reads set: name, scope, fingerprint, mode. Its
    scope: ``question`` over ``options``, or (``signature`` given) that logged request's."""
    recorded = None
    if signature is None and question is not None and options is not None:
        signature, recorded = scope_signature(options, question), question.as_dict()
    return PolicyFile(name=name, signature=signature, backend_fingerprint=fingerprint,
                      calibrator={"kind": "none"}, rule=ThresholdRule(0.8).to_dict(),
                      target_accuracy=0.95, delta=0.05, bound=0.95, coverage=0.7, n_tune=100,
                      n_calibration=0, data_hash="0" * 64, question=recorded,
                      options=None if options is None else list(options), **fields)


def test_lookup_order_name_then_signature_then_default_then_unscoped() -> None:
    signed = loaded("signed", signature=request().signature())
    registry = PolicyRegistry([signed, loaded("general")], default="general",
                              fallback_threshold=0.8)
    assert registry.lookup(request(policy="general"), fingerprint=FINGERPRINT).policy_id == "general"
    assert registry.lookup(request(), fingerprint=FINGERPRINT).policy_id == "signed"
    # The default decides its own question when no lookup by (scope, fingerprint) matched.
    assert registry.lookup(request(), fingerprint="another-backend").policy_id == "general"
    # No policy covers it: unscoped, whatever the mode (the plan applies policy.unscoped).
    assert registry.lookup(request("Another question?"), fingerprint=FINGERPRINT) is None
    assert registry.names() == ["general", "signed"]


def test_a_signature_match_needs_the_same_backend_fingerprint() -> None:
    """Thresholds tuned on another backend's reads mean nothing for this one."""
    other = loaded("other-backend", signature=request().signature(), fingerprint="fp-old")
    registry = PolicyRegistry([other])
    assert registry.lookup(request(), fingerprint=FINGERPRINT) is None
    assert registry.lookup(request(), fingerprint="fp-old").policy_id == "other-backend"


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


# --- scope: a policy answers only the question it was tuned on ------------------------------

INTENTS = tuple(f"intent_{i}" for i in range(77))
INTENT = Question.asked("intent")  # the README's: the json_schema named "intent", no description


def intents_request(options: tuple[str, ...] = INTENTS, *, question: str = "intent",
                    policy: str | None = None) -> DecisionRequest:
    return DecisionRequest(question, question, tuple(Option(o) for o in options), "my card?",
                           policy=policy)


def test_a_default_policy_takes_only_its_own_question_over_its_own_options() -> None:
    """The default decides its question whatever the fingerprint lookup found; a subset of its
    options (2 of the 77 intents), a superset, or another question over the same options is
    unscoped."""
    default = loaded("banking77", options=INTENTS, question=INTENT)
    registry = PolicyRegistry([default], default="banking77", unscoped="escalate")
    full = registry.lookup(intents_request(), fingerprint="another-backend")
    assert full is not None and full.policy_id == "banking77"
    assert registry.lookup(intents_request(question="anything"), fingerprint=FINGERPRINT) is None
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
    assert threshold.lookup(subset, fingerprint=FINGERPRINT) is None


def test_a_policy_asked_for_by_name_outside_its_scope_leaves_the_decision_unscoped() -> None:
    registry = PolicyRegistry([loaded("banking77", options=INTENTS, question=INTENT)],
                              unscoped="shadow")
    named = registry.lookup(intents_request(policy="banking77"), fingerprint=FINGERPRINT)
    assert named is not None and named.policy_id == "banking77"
    subset = intents_request(INTENTS[:2], policy="banking77")
    assert registry.lookup(subset, fingerprint=FINGERPRINT) is None
    other = intents_request(question="not_intent", policy="banking77")
    assert registry.lookup(other, fingerprint=FINGERPRINT) is None


def test_a_question_is_its_id_text_context_and_kind_not_its_options() -> None:
    yes_no = ("yes", "no")
    card = Question.asked("about_card", instructions="Is this message about a card?")
    registry = PolicyRegistry([loaded("card", options=yes_no, question=card),
                               loaded("intents", options=INTENTS, question=INTENT)],
                              unscoped="escalate")

    def covered(request: DecisionRequest) -> str | None:
        match = registry.lookup(request, fingerprint=FINGERPRINT)
        return None if match is None else match.policy_id

    yes_no_options = (Option("yes"), Option("no"))
    asked = DecisionRequest("about_card", "Is this message about a card?", yes_no_options, "x")
    assert covered(asked) == "card"
    assert covered(DecisionRequest("about_card", "Is this message about a card?",
                                   yes_no_options[::-1], "x")) == "card"
    for other in (
        DecisionRequest("about_card", "Is the customer angry?", yes_no_options, "x"),  # text
        DecisionRequest("is_french", "is_french", yes_no_options, "x"),  # id
        DecisionRequest("about_card", "Is this message about a card?", yes_no_options, "x",
                        context="Answer for the fraud team."),  # system message
        DecisionRequest("about_card", "Is this message about a card?", yes_no_options, "x",
                        kind="noul"),  # kind
        DecisionRequest("about_card", "Is this message about a card?",
                        (Option("yes", "it names a card"), Option("no")), "x"),  # criteria
    ):
        assert covered(other) is None, other
    # An OpenAI schema with no description is asked by its name (instructions = the name), a
    # System One question with no instructions by its id: the same question.
    assert covered(intents_request()) == "intents"
    assert covered(DecisionRequest("intent", "", tuple(Option(o) for o in INTENTS), "x")) == (
        "intents")


def test_files_that_do_not_record_their_question_are_refused_naming_the_field(
        tmp_path: Path) -> None:
    """Files written before questions were recorded (a null signature with an ``options`` list,
    or a ``scope-v1`` option-set scope) would answer any question over their options: the
    router refuses them at load, saying how to re-tune. ``slotgate eval`` still reads them."""
    from router.settings import PolicySettings

    with pytest.raises(ConfigError, match="'old'.*does not record the question") as info:
        PolicyRegistry([loaded("old", question=None)])
    assert info.value.field == "question" and "--question" in info.value.message
    with pytest.raises(ConfigError, match="'unknown'"):
        PolicyRegistry([loaded("unknown", options=None, question=None)])
    path = tmp_path / "old.json"
    policy_file("old", question=None, signature=UNRECORDED_PREFIX + "0" * 64).write(path)
    with pytest.raises(ConfigError, match="field 'question'"):
        PolicyRegistry.load(PolicySettings(files=[path]), backend_fingerprint=FINGERPRINT)
    # A file tuned on one logged request keeps answering exactly that request's question.
    exact = PolicyRegistry([loaded("logged", options=None, signature=request().signature())],
                           unscoped="escalate")
    assert exact.lookup(request(), fingerprint=FINGERPRINT) is not None
    assert exact.lookup(request("Another?"), fingerprint=FINGERPRINT) is None


def test_settings_without_unscoped_escalate_unless_they_set_a_fallback_threshold(
        tmp_path: Path) -> None:
    from router.settings import PolicySettings

    path = tmp_path / "intents.json"
    policy_file("intents").write(path)
    registry = PolicyRegistry.load(PolicySettings(files=[path], default="intents"),
                                   backend_fingerprint=FINGERPRINT)
    assert registry.unscoped == "escalate"
    match = registry.lookup(request(), fingerprint=FINGERPRINT)
    assert match is not None and match.policy_id.startswith("intents@")
    three = DecisionRequest("intent", "Which intent?", (Option("a"), Option("b"), Option("c")),
                            "x")
    assert registry.lookup(three, fingerprint=FINGERPRINT) is None
    kept = PolicyRegistry.load(PolicySettings(files=[path], fallback_threshold=0.7),
                               backend_fingerprint=FINGERPRINT)
    assert kept.unscoped == "threshold" and kept.fallback_threshold == 0.7
    assert kept.lookup(three, fingerprint=FINGERPRINT) is None
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
