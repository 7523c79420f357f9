"""Decisions no loaded policy covers: they follow ``policy.unscoped``, never carry a
guarantee and never reach a policy (so no policy's watch sees them). Real service, MockBackend,
MemoryCache and a tuned-file policy; a recording slow path and log."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from policies.file import PolicyFile
from policies.options import PolicyOptions
from policies.policy import Policy, Step, Tier
from policies.rules import EscalationWindow, ThresholdRule
from policies.scope import Question, UnscopedMode
from policies.types import DecisionRequest, Option, OptionScores, StagedQuestion
from router.backends.mock import MockBackend
from router.errors import NoSlowModel
from router.routing.ports import Label, Observation
from router.routing.registry import LoadedPolicy, PolicyRegistry
from router.routing.service import RoutingService
from router.routing.stages import answer_stages
from router.settings import Settings
from router.store.cache import MemoryCache
from router.store.metrics import Metrics
from tests.router.routing.test_registry import policy_file
from tests.router.routing.test_service import ListLog, RecordingSlow

INTENTS = ("card_arrival", "lost_or_stolen_card", "card_linking")


@dataclass(eq=False)
class Observed:
    """A tuned policy that counts its decisions: what a watched policy reports to its watch."""

    inner: Policy
    calls: list[OptionScores] = field(default_factory=list)

    @property
    def policy_id(self) -> str:
        return self.inner.policy_id

    @property
    def tiers_(self) -> tuple[Tier, ...]:
        return self.inner.tiers_

    @property
    def file_(self) -> PolicyFile | None:
        return self.inner.file_

    @property
    def params_(self) -> PolicyOptions:
        return self.inner.params_

    @property
    def reads_first_tier(self) -> bool:
        return self.inner.reads_first_tier

    def next_tier(self, after: int) -> int | None:
        return self.inner.next_tier(after)

    def step(self, k: int, scores: OptionScores, *, escalations: int = 0) -> Step:
        self.calls.append(scores)
        return self.inner.step(k, scores, escalations=escalations)

    def escalation_window(self) -> EscalationWindow | None:
        return self.inner.escalation_window()


def confident(req: DecisionRequest) -> list[float]:
    n = len(req.options)
    return [0.97] + [0.03 / (n - 1)] * (n - 1)


@dataclass
class Watching:
    """Production monitoring as routing sees it (``ports.DecisionObserver``), recording what it
    is told: the watch of each policy is fed from ``decided``."""

    decided_ids: list[str] = field(default_factory=list)

    def watch(self, policy_file: object) -> None: ...

    def retire_others(self, policy_ids: object) -> None: ...

    def gate(self, policy_id: str) -> str | None:
        return None

    def decided(self, observation: Observation) -> None:
        self.decided_ids.append(observation.policy_id)

    async def labelled(self, label: Label) -> None: ...


@dataclass
class CountingReads:
    """The test backend's handler: a confident read of each question, each one recorded."""

    calls: list[tuple[str, ...]] = field(default_factory=list)

    def __call__(self, request: DecisionRequest) -> list[float]:
        self.calls.append(request.option_names)
        return confident(request)


class StagedBackend(MockBackend):
    """A MockBackend whose server runs staged bodies itself (``read_staged``), counting them."""

    def __init__(self, reads: CountingReads) -> None:
        super().__init__(reads)
        self.reads = reads
        self.staged: list[list[str]] = []

    def reads_staged(self, questions: Sequence[StagedQuestion]) -> bool:
        return True

    async def read_staged(self, questions: Sequence[StagedQuestion]
                          ) -> list[OptionScores | None]:
        self.staged.append([q.request.question_id for q in questions])
        return list(await self.read([q.request for q in questions]))


def setup(mode: UnscopedMode, *, slow_path: RecordingSlow | None = None,
          monitor: Watching | None = None, reads: CountingReads | None = None,
          backend: MockBackend | None = None, **settings: object
          ) -> tuple[RoutingService, Observed, RecordingSlow, ListLog]:
    from calibration.calibrators import IdentityCalibrator

    if backend is None:
        backend = MockBackend(confident if reads is None else reads)
    policy = Observed(Policy.from_parts(IdentityCalibrator(), ThresholdRule(0.9),
                                                  policy_id="intents@abc"))
    registry = PolicyRegistry([LoadedPolicy(
        policy_file("intents", fingerprint=backend.fingerprint, options=INTENTS,
                    question=Question.asked("intent")), policy)],
        default="intents",
        unscoped=mode)
    slow = slow_path if slow_path is not None else RecordingSlow()
    log = ListLog()
    service = RoutingService(backend=backend, cache=MemoryCache(max_entries=100, ttl_s=60),
                             registry=registry, slow=slow, log=log,  # type: ignore[arg-type]
                             metrics=Metrics(), settings=Settings(**settings),  # type: ignore[arg-type]
                             monitor=monitor)
    return service, policy, slow, log


def question(options: tuple[str, ...]) -> DecisionRequest:
    return DecisionRequest("intent", "intent", tuple(Option(o) for o in options),
                           "I still have not received my new card")


async def test_in_scope_decisions_are_judged_by_the_policy_and_carry_its_guarantee() -> None:
    service, policy, slow, _ = setup("escalate")
    [d] = await service.route([question(INTENTS)], namespace="t")
    assert (d.route, d.guarantee, d.policy_id, d.answer) == ("fast", "accuracy", "intents@abc",
                                                             "card_arrival")
    assert len(policy.calls) == 1 and slow.calls == []


@pytest.mark.parametrize("mode", ["escalate", "shadow"])
async def test_a_subset_question_is_answered_by_the_slow_model_untouched_by_the_policy(
        mode: UnscopedMode) -> None:
    service, policy, slow, log = setup(mode)
    [d] = await service.route([question(INTENTS[:2])], namespace="t")
    # RecordingSlow answers the last option; the fast read said the first.
    assert (d.answer, d.route, d.guarantee, d.policy_id) == (
        "lost_or_stolen_card", "slow", None, "fallback")
    assert d.escalated and d.shadow == (mode == "shadow") and d.probability is None
    assert d.note is not None and "unscoped" in d.note and "2 options" in d.note
    assert policy.calls == [] and len(slow.calls) == 1
    [record] = log.records
    assert record["guarantee"] is None
    if mode == "shadow":  # the fast read, logged to tune on; escalate makes none
        assert record["proba"] == pytest.approx([0.97, 0.03])
    else:
        assert record["proba"] is None and d.raw_probability is None


async def test_unverified_serves_the_fast_answer_marked_so_without_the_slow_model() -> None:
    service, policy, slow, _ = setup("unverified")
    [d] = await service.route([question(INTENTS[:2])], namespace="t")
    assert (d.answer, d.route, d.guarantee, d.escalated) == ("card_arrival", "unverified", None,
                                                             False)
    assert d.raw_probability == pytest.approx(0.97) and d.probability is None
    assert policy.calls == [] and slow.calls == []


async def test_with_no_slow_model_escalate_fails_unless_unverified_answers_are_allowed() -> None:
    down = RecordingSlow(fail=NoSlowModel())
    service, policy, _, _ = setup("escalate", slow_path=down)
    with pytest.raises(NoSlowModel) as info:
        await service.route([question(INTENTS[:2])], namespace="t")
    # The 503 says why a question was escalated at all: no policy covers it.
    assert "unscoped: no loaded policy was tuned on" in info.value.message
    assert "policy.unscoped: escalate" in str(info.value)
    with pytest.raises(NoSlowModel) as again:  # the shared error object is never rewritten
        await service.route([question(INTENTS[:2])], namespace="t")
    assert again.value.message.count("no loaded policy") == 1
    reads = CountingReads()
    service, policy, _, log = setup("escalate", slow_path=RecordingSlow(
        fail=NoSlowModel()), reads=reads,
        slow={"serve_unverified_on_failure": True})
    [d] = await service.route([question(INTENTS[:2])], namespace="t")
    assert (d.route, d.answer, d.guarantee) == ("unverified", "card_arrival", None)
    assert policy.calls == []
    # No read was made up front: the slow path failed, and the fallback read it then (logged).
    assert reads.calls == [INTENTS[:2]] and d.raw_probability == pytest.approx(0.97)
    assert log.records[0]["proba"] == pytest.approx([0.97, 0.03])


@pytest.mark.parametrize("mode", ["escalate", "shadow", "unverified"])
async def test_no_policy_watch_is_told_of_an_unscoped_decision(mode: UnscopedMode) -> None:
    """The watch of the default 3-option policy sees its own decisions only: an unscoped
    2-option decision can neither raise its drift alarm nor be counted in its accuracy."""
    monitor = Watching()
    service, _, _, _ = setup(mode, monitor=monitor)
    await service.route([question(INTENTS[:2]), question(INTENTS)], namespace="t")
    assert monitor.decided_ids == ["intents@abc"]


async def test_escalate_makes_no_fast_read_of_an_unscoped_decision() -> None:
    """Only the in-scope decision is read: under ``escalate`` nothing would route on an unscoped
    one's fast read (a GPU or HTTP call), so it is not made. The unscoped one is still routed,
    counted and logged, its reply with no raw probability."""
    reads = CountingReads()
    service, _, slow, log = setup("escalate", reads=reads)
    unscoped, scoped = await service.route([question(INTENTS[:2]), question(INTENTS)],
                                            namespace="t")
    assert reads.calls == [INTENTS]  # the in-scope question only
    assert (unscoped.route, unscoped.answer, unscoped.policy_id) == (
        "slow", "lost_or_stolen_card", "fallback")
    assert unscoped.raw_probability is None and unscoped.probability is None
    assert unscoped.note is not None and "no fast read was made" in unscoped.note
    assert (scoped.route, scoped.raw_probability) == ("fast", pytest.approx(0.97))
    assert len(slow.calls) == 1
    assert [r["proba"] is None for r in log.records] == [True, False]
    text = service.metrics.render().decode()
    assert 'slotgate_decisions_total{route="slow"} 1.0' in text
    assert 'slotgate_decisions_total{route="fast"} 1.0' in text
    assert 'slotgate_cache_lookups_total{result="miss",store="read"} 1.0' in text
    # A batch of unscoped questions only: no read, no read-cache lookup at all.
    [again] = await service.route([question(INTENTS[1:])], namespace="t")
    assert again.route == "slow" and reads.calls == [INTENTS]


@pytest.mark.parametrize("mode", ["shadow", "unverified", "threshold"])
async def test_the_modes_that_use_the_fast_read_still_make_it(mode: UnscopedMode) -> None:
    reads = CountingReads()
    service, _, _, log = setup(mode, reads=reads)
    [d] = await service.route([question(INTENTS[:2])], namespace="t")
    assert reads.calls == [INTENTS[:2]] and log.records[0]["proba"] == pytest.approx([0.97, 0.03])
    # the served answer's raw probability: the fast one's, or (shadow) the slow one's, 0.03
    assert d.raw_probability == pytest.approx(0.03 if mode == "shadow" else 0.97)


async def test_server_wide_shadow_reads_unscoped_decisions_under_escalate() -> None:
    reads = CountingReads()
    service, _, _, _ = setup("escalate", reads=reads)
    service.registry.shadow_all = True  # policy.shadow: every decision's read is logged
    [d] = await service.route([question(INTENTS[:2])], namespace="t")
    assert d.shadow and reads.calls == [INTENTS[:2]]


@pytest.mark.parametrize("mode", ["escalate", "shadow"])
async def test_a_staged_body_of_unscoped_questions_is_read_upstream_only_when_used(
        mode: UnscopedMode) -> None:
    """A body whose server runs its stages is read whole (one upstream call) unless no question
    of it would route on a read: every one unscoped under ``escalate``."""
    reads = CountingReads()
    backend = StagedBackend(reads)
    service, _, slow, _ = setup(mode, backend=backend)
    first = DecisionRequest("first", "first?", (Option("yes"), Option("no")), "a state")
    second = DecisionRequest("second", "second?", (Option("x"), Option("y")), "a state")
    body = [StagedQuestion(first), StagedQuestion(second,
                                                  ask_if=(("first", ("no",)),))]
    outcome = await answer_stages(service, body, namespace="t")
    assert outcome.stages == [["first"], ["second"]]  # the slow model answered "no"
    assert len(slow.calls) == 2
    if mode == "escalate":
        assert backend.staged == [] and reads.calls == []
    else:
        assert backend.staged == [["first", "second"]] and outcome.conditioning == "prefill"


async def test_a_staged_body_looks_each_policy_up_once() -> None:
    reads = CountingReads()
    service, _, _, _ = setup("escalate", backend=StagedBackend(reads))
    looked_up: list[str] = []
    lookup = service.registry.lookup

    def counted(request: DecisionRequest, *, fingerprint: str) -> object:
        looked_up.append(request.question_id)
        return lookup(request, fingerprint=fingerprint)

    service.registry.lookup = counted  # type: ignore[assignment,method-assign]
    first = DecisionRequest("first", "intent", tuple(Option(o) for o in INTENTS), "a state")
    second = DecisionRequest("second", "intent", tuple(Option(o) for o in INTENTS), "a state")
    body = [StagedQuestion(first), StagedQuestion(second, depends_on=("first",))]
    outcome = await answer_stages(service, body, namespace="t")
    assert outcome.stages == [["first"], ["second"]]
    assert looked_up == ["first", "second"]
