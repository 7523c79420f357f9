"""No caller trips the traffic detector for the others alone: each caller's share of its
evidence is capped (``CallerEvidence``), a deployment with one caller keeps the whole detector,
and an unsure stretch spread over many callers still trips it. Over real HTTP with two API keys
(the OpenAI SDK, a real Redis): one key's unsure campaign leaves the other's routes alone."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import openai
import pytest

from calibration.state import DamagedState
from policies.file import PolicyFile
from policies.policy import Policy
from policies.types import DecisionRequest
from router.backends.mock import MockBackend
from router.http.state import app_state
from router.monitoring.caller_evidence import CallerEvidence
from router.monitoring.monitor import Monitor
from router.monitoring.watch import PolicyWatch
from router.routing.ports import Observation
from router.settings import Settings
from standins.llm import StandinHandle
from tests.live import LiveServer
from tests.router.monitoring.conftest import spelled, watched_policy
from tests.router.monitoring.test_live import body
from tests.router.monitoring.test_monitor import request, scores


def watching() -> tuple[Monitor, PolicyFile, PolicyWatch]:
    monitor = Monitor()
    policy = watched_policy(on_alarm="audit_then_escalate", audit_rate=0.0, audit_boost=0.5)
    monitor.watch(policy)
    return monitor, policy, monitor.watches[policy.policy_id]


def decide(monitor: Monitor, policy: PolicyFile, p: float, text: str, caller: str) -> None:
    verdict, calibrated = Policy.from_file(policy).decide(scores(p))
    monitor.decided(Observation(request(text), text, policy.policy_id, calibrated[0],
                                verdict.accept, "a", verdict.accept, caller=caller))


def campaign(callers: list[str], n: int = 300) -> PolicyWatch:
    """A victim's ordinary traffic, one decision for each of ``n`` distinct unsure messages
    (never accepted) sent in turn by ``callers``; stops at the trip."""
    monitor, policy, watch = watching()
    decide(monitor, policy, 0.98, "hello", "victim")
    for i in range(n):
        decide(monitor, policy, 0.55, f"unsure {spelled(i)}", callers[i % len(callers)])
        decide(monitor, policy, 0.98, f"ordinary {spelled(i)}", "victim")
        if watch.traffic_tripped:
            break
    return watch


def test_one_key_s_unsure_campaign_cannot_trip_the_detector_for_the_others() -> None:
    watch = campaign(["hostile"])
    assert not watch.traffic_tripped and watch.audit_rate == 0.0
    report = watch.report()
    assert report["traffic_spent_callers"] == ["hostile"]
    assert report["traffic_capped"] > 250  # its flood is not even ranked
    assert watch.traffic is not None and watch.traffic.log_value < watch.traffic.threshold / 2


def test_the_same_unsure_share_spread_over_ten_keys_trips_it_as_fast_as_one_caller() -> None:
    spread = campaign([f"tenant-{j}" for j in range(10)])
    alone = campaign(["victim"])  # a deployment without API keys is one caller: no cap
    assert spread.traffic_tripped and alone.traffic_tripped
    assert spread.traffic_tripped_at == alone.traffic_tripped_at
    assert spread.report()["traffic_capped"] == 0


def test_a_caller_never_wins_past_its_cap_and_its_budget_renews() -> None:
    evidence = CallerEvidence(2, cap=1.0, budget_ranked=10)
    assert evidence.most("only", 0, now=0.0) == [math.inf, math.inf]  # one caller: no cap
    evidence.took("only", [5.0, 5.0])
    most = evidence.most("other", 1, now=1.0)
    assert most == [math.e, math.e]
    evidence.took("other", [min(9.0, most[0]), 0.5])
    assert evidence.state()["other"]["evidence"] == pytest.approx([1.0, 0.0])
    assert evidence.most("other", 2, now=2.0) == pytest.approx([1.0, math.e])
    evidence.took("other", [1.0, 100.0 ** 0.5])  # clipped by the caller: e, not 10
    assert evidence.state()["other"]["evidence"] == [1.0, 1.0]
    assert evidence.most("other", 3, now=3.0) is None and evidence.capped == 1
    assert evidence.spent() == ["only", "other"]
    assert evidence.most("other", 12, now=4.0) == [math.e, math.e]  # 10 ranked later: renewed


def test_callers_silent_for_the_memory_are_forgotten_and_one_caller_is_uncapped_again() -> None:
    evidence = CallerEvidence(1, cap=1.0, memory_s=100.0)
    evidence.most("a", 0, now=0.0)
    evidence.most("b", 0, now=1.0)
    evidence.took("b", [math.e])
    assert evidence.most("b", 1, now=2.0) is None
    assert evidence.most("a", 1, now=50.0) == [math.e]
    assert evidence.most("b", 1, now=90.0) is None
    assert evidence.most("b", 1, now=140.0) is None  # still spent while "a" is remembered
    assert evidence.most("b", 1, now=151.0) == [math.inf]  # "a" forgotten: "b" is everyone


def test_the_budgets_survive_a_checkpoint_and_a_damaged_one_is_refused_naming_the_field() -> None:
    spent = campaign(["hostile"], n=40)
    state = spent.state()
    assert state["traffic_callers"]["hostile"]["evidence"]
    _, _, fresh = watching()
    assert fresh.resume(state) and fresh.callers is not None
    assert fresh.callers.spent() == ["hostile"]
    state["traffic_callers"]["hostile"]["evidence"][0] = 99.0
    with pytest.raises(DamagedState, match="traffic_callers.hostile.evidence"):
        watching()[2].resume(state)
    del state["traffic_callers"]  # a checkpoint written before callers were kept: no budgets
    assert watching()[2].resume(state)


HOSTILE, VICTIM = "hostile-key-5e21", "victim-key-07ab"
KEY_HASHES = {key: hashlib.sha256(key.encode()).hexdigest() for key in (HOSTILE, VICTIM)}


def unsure_or_sure(request: DecisionRequest) -> Sequence[float]:
    """Turned down (escalated) when the message says "unsure", a confident "a" otherwise."""
    return (0.55, 0.25, 0.2) if "unsure" in request.state else (0.98, 0.01, 0.01)


def ask(client: openai.OpenAI, text: str) -> dict[str, Any]:
    reply = client.chat.completions.create(
        model="any", messages=[{"role": "user", "content": text}],
        response_format=body(text)["response_format"])
    facts: dict[str, Any] = reply.model_extra["slotgate"]  # type: ignore[index]
    return facts


def test_over_http_one_key_s_unsure_messages_leave_the_other_key_s_routes_alone(
        tmp_path: Path, standin: StandinHandle, redis_url: str) -> None:
    """Two API keys through the OpenAI SDK on loopback, a real Redis cache: the hostile key's
    36 distinct unsure messages (escalated, unlabelled) neither trip the traffic detector nor
    raise the victim's audit rate; its confident decisions stay fast under a clear watch."""
    backend = MockBackend(unsure_or_sure)
    policy = watched_policy(backend_fingerprint=backend.fingerprint,
                            on_alarm="audit_then_escalate", audit_rate=0.0, audit_boost=1.0)
    policy.write(tmp_path / "policy.json")
    settings = Settings(
        policy={"files": [tmp_path / "policy.json"], "default": policy.name},
        slow={"model": "openai/standin", "api_base": standin.api_base, "api_key": "sk-test"},
        log={"decision_log_path": tmp_path / "log.jsonl"}, cache={"redis_url": redis_url},
        api_key_hashes=list(KEY_HASHES.values()))
    with LiveServer(settings, backend=backend) as server, \
            openai.OpenAI(base_url=f"{server.url}/v1", api_key=HOSTILE, max_retries=0) as hostile, \
            openai.OpenAI(base_url=f"{server.url}/v1", api_key=VICTIM, max_retries=0) as victim:
        watch = app_state(server.app).service.monitor.watches[policy.policy_id]
        assert ask(victim, "where is my card")["route"] == "fast"
        for i in range(36):  # one caller alone trips it with a third of these
            assert ask(hostile, f"unsure about {spelled(i)}")["route"] == "slow"
        assert not watch.traffic_tripped and watch.audit_rate == 0.0
        assert watch.report()["traffic_spent_callers"] == [
            f"key-{KEY_HASHES[HOSTILE][:16]}"]
        standin.clear()
        for i in range(10):
            facts = ask(victim, f"my card {spelled(i)} has not arrived")
            assert facts["route"] == "fast" and facts["receipt"]["watch"] == "clear"
        assert standin.calls() == []  # no audit, no escalation for the victim
