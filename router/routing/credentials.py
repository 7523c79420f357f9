"""Which key the slow path sends upstream, and whether escalation can work at all: the configured
``slow.api_key``; else the provider's key from the environment (litellm reads it); else, when
``slow.api_base`` is set, none is needed (a keyless upstream: a local vLLM, the stand-in LLM), but
litellm's OpenAI client refuses to send a request without one, so a placeholder goes instead."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

# Sent as the bearer token to an api_base configured without a key. Not a secret: a keyless
# upstream ignores it, one that wants a key answers 401 (reported as a slow-path failure).
KEYLESS_API_KEY = "slotgate-keyless"

# litellm.validate_environment(model=..., api_base=...) -> {"keys_in_environment", "missing_keys"}
EnvironmentCheck = Callable[..., dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Credentials:
    api_key: str | None  # for litellm; None: litellm takes the provider's key from the environment
    problem: str | None = None  # why no call can succeed (escalation is then unavailable)


def resolve(model: str, *, api_base: str | None, api_key: str | None,
            check_environment: EnvironmentCheck) -> Credentials:
    """The credentials a call to ``model`` uses (see the module docstring)."""
    if api_key:
        return Credentials(api_key)
    try:
        found = check_environment(model=model, api_base=api_base)
    except Exception as exc:  # noqa: BLE001 - litellm's check is advisory; the call itself reports
        logger.debug("litellm could not check the environment for %s: %s", model, exc)
        return Credentials(None)
    if found.get("keys_in_environment"):
        return Credentials(None)
    if api_base:
        return Credentials(KEYLESS_API_KEY)
    missing = ", ".join(str(k) for k in found.get("missing_keys") or []) or "the provider's key"
    return Credentials(None, problem=(
        f"escalation unavailable: no credentials for slow model {model} (set {missing} or "
        "slow.api_key; set slow.api_base alone for an upstream that needs no key)"))
