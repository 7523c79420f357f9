"""Which key the slow path sends, decided with litellm's own environment check (real litellm)."""

from __future__ import annotations

import pytest

from router.routing.credentials import KEYLESS_API_KEY, resolve
from router.routing.slow import _litellm


@pytest.fixture
def check(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    return _litellm().validate_environment


def test_a_configured_key_is_used_as_it_is(check) -> None:  # type: ignore[no-untyped-def]
    assert resolve("openai/x", api_base=None, api_key="sk-mine", check_environment=check).api_key \
        == "sk-mine"


def test_the_providers_key_from_the_environment_is_left_to_litellm(
        check, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env-0123456789")
    found = resolve("openai/gpt-4o-mini", api_base="http://127.0.0.1:9/v1", api_key=None,
                    check_environment=check)
    assert found.api_key is None and found.problem is None


def test_an_api_base_without_a_key_is_a_keyless_upstream(check) -> None:  # type: ignore[no-untyped-def]
    found = resolve("openai/standin", api_base="http://127.0.0.1:9/v1", api_key=None,
                    check_environment=check)
    assert found.api_key == KEYLESS_API_KEY and found.problem is None


def test_no_key_and_no_api_base_is_a_named_problem(check) -> None:  # type: ignore[no-untyped-def]
    found = resolve("anthropic/claude-3-haiku", api_base=None, api_key=None,
                    check_environment=check)
    assert found.problem is not None and "ANTHROPIC_API_KEY" in found.problem
    assert "slow.api_base" in found.problem
