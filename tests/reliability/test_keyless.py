"""The README's no-API-key recipe, exactly as written: SLOTGATE_SLOW_MODEL=
openai/standin and SLOTGATE_SLOW_API_BASE pointing at the stand-in LLM, no key anywhere, real
litellm, the OpenAI SDK as the client. And /readyz tells the truth: a slow model litellm has no
credentials for is reported as unavailable, and escalations say why."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from router.backends.mock import MockBackend
from router.routing.credentials import KEYLESS_API_KEY
from router.routing.slow import LOADING
from router.settings import Settings
from standins.llm import StandinHandle
from tests.reliability.conftest import OPTIONS, LiveServer, Switch, decision


def escalation_available(url: str, *, settles_within_s: float = 60) -> bool:
    """/readyz's answer once litellm's background import (which checks credentials) is done."""
    deadline = time.monotonic() + settles_within_s
    body = httpx.get(f"{url}/readyz", timeout=10).json()
    while body["escalation"] == LOADING and time.monotonic() < deadline:
        time.sleep(0.2)
        body = httpx.get(f"{url}/readyz", timeout=10).json()
    return bool(body["escalation_available"])


def test_the_readme_recipe_works_without_a_key(monkeypatch: pytest.MonkeyPatch,
                                               fresh_standin: StandinHandle,
                                               tmp_path: Path) -> None:
    """Escalations and passthroughs are answered through the stand-in with no key set: litellm
    must not turn them into 503 'Missing credentials' while /readyz says escalation is
    available."""
    for name in ("OPENAI_API_KEY", "SLOTGATE_SLOW__API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLOTGATE_SLOW_MODEL", "openai/standin")
    monkeypatch.setenv("SLOTGATE_SLOW_API_BASE", fresh_standin.api_base)
    settings = Settings(log={"decision_log_path": tmp_path / "d.jsonl"},
                        policy={"fallback_threshold": 0.9})
    assert settings.slow.api_key is None
    with LiveServer(settings, backend=MockBackend(Switch())) as server:
        assert escalation_available(server.url)
        client = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        reply = client.chat.completions.create(  # 0.5 < 0.9: escalated to the stand-in
            model="any", messages=[{"role": "user", "content": "I lost_card yesterday"}],
            response_format=decision("x")["response_format"])
        chat = client.chat.completions.create(
            model="openai/standin", messages=[{"role": "user", "content": "hello"}])
    facts = reply.model_extra["slotgate"]  # type: ignore[index]
    assert facts["route"] == "slow" and reply.choices[0].message.content == '"lost_card"'
    assert chat.choices[0].message.content
    calls = fresh_standin.calls()
    assert len(calls) == 2
    assert {c["authorization"] for c in calls} == {f"Bearer {KEYLESS_API_KEY}"}


def test_readyz_says_so_when_the_slow_model_has_no_credentials(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    """A slow model litellm has no credentials for: /readyz reports escalation as unavailable
    rather than escalation_available: true with every escalation a 503 about missing
    credentials."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    settings = Settings(slow={"model": "openai/gpt-4o-mini"},
                        log={"decision_log_path": tmp_path / "d.jsonl"},
                        policy={"fallback_threshold": 0.9})
    with LiveServer(settings, backend=MockBackend(Switch())) as server:
        available = escalation_available(server.url)
        ready = httpx.get(f"{server.url}/readyz", timeout=10)
        refused = server.post("/v1/chat/completions", decision("lost_card, please"))
        accepted = server.post("/v1/chat/completions", decision("sure: card_arrival"))
    assert not available
    assert ready.status_code == 200  # the fast tier still serves what clears its threshold
    assert "OPENAI_API_KEY" in ready.json()["escalation"]
    assert refused.status_code == 503
    assert "OPENAI_API_KEY" in refused.json()["error"]["message"]
    assert accepted.status_code == 200 and accepted.json()["slotgate"]["route"] == "fast"
    assert OPTIONS[0] in accepted.text
