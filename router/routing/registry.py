"""The tuned policies the router serves, loaded once at start-up and looked up per decision: by the
name a request asks for, else by (decision signature, backend fingerprint), else the configured
default, else a fallback threshold on the uncalibrated read."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from policies.types import DecisionRequest, OptionScores, Verdict
from router.errors import ConfigError, InvalidRequest
from router.settings import PolicySettings

if TYPE_CHECKING:
    from router.monitoring.monitor import Monitor


class RuntimePolicy(Protocol):
    """What the service needs of a policy (``policies.file.TunedPolicy`` is one)."""

    policy_id: str

    def decide(self, scores: OptionScores) -> tuple[Verdict, list[float]]: ...


def fallback_policy(*, threshold: float) -> RuntimePolicy:
    """Identity calibration and one threshold: for decisions no tuned policy covers. Its
    confidence is the backend's own, which nothing has checked."""
    from calibration.calibrators import IdentityCalibrator
    from policies.rules import ThresholdRule
    from policies.tuned import TunedPolicy

    return TunedPolicy(IdentityCalibrator(), ThresholdRule(threshold), policy_id="fallback")


@dataclass(frozen=True, slots=True)
class LoadedPolicy:
    name: str
    signature: str | None
    backend_fingerprint: str
    path: Path | None
    runtime: RuntimePolicy


class PolicyRegistry:
    def __init__(
        self,
        policies: Sequence[LoadedPolicy] = (),
        *,
        default: str | None = None,
        fallback_threshold: float = 0.9,
    ) -> None:
        self._by_name: dict[str, LoadedPolicy] = {}
        self._by_signature: dict[tuple[str, str], LoadedPolicy] = {}
        for policy in policies:
            if policy.name in self._by_name:
                raise ConfigError(
                    f"two policy files are named {policy.name!r}: "
                    f"{self._by_name[policy.name].path} and {policy.path}")
            self._by_name[policy.name] = policy
            if policy.signature:
                self._by_signature[(policy.signature, policy.backend_fingerprint)] = policy
        if default is not None and default not in self._by_name:
            raise ConfigError(
                f"policy.default names {default!r}, but no policy file has that name "
                f"(loaded: {sorted(self._by_name) or 'none'})")
        self._default = self._by_name[default].runtime if default else None
        self.fallback = fallback_policy(threshold=fallback_threshold)

    @classmethod
    def load(cls, settings: PolicySettings, *, backend_fingerprint: str,
             monitor: Monitor | None = None) -> PolicyRegistry:
        """Load ``settings.files``; refuse a policy tuned for another backend fingerprint unless
        ``allow_fingerprint_mismatch``: its thresholds would mean nothing for this backend.
        With a ``monitor``, every loaded policy is watched (and acted on) in production."""
        from policies.file import load_policy  # policies stays importable without the router

        loaded = []
        for path in settings.files:
            try:
                policy_file: Any = load_policy(path)
            except (OSError, ValueError) as exc:
                raise ConfigError(f"policy file {path}: {exc}") from exc
            if (policy_file.backend_fingerprint != backend_fingerprint
                    and not settings.allow_fingerprint_mismatch):
                raise ConfigError(
                    f"policy file {path} ({policy_file.name!r}) was tuned for backend fingerprint "
                    f"{policy_file.backend_fingerprint}, but the configured fast backend has "
                    f"{backend_fingerprint}; re-tune it on this backend's predictions, or set "
                    "policy.allow_fingerprint_mismatch: true to serve it anyway")
            runtime = policy_file.runtime()
            loaded.append(LoadedPolicy(
                name=policy_file.name,
                signature=getattr(policy_file, "signature", None),
                backend_fingerprint=policy_file.backend_fingerprint,
                path=path,
                runtime=runtime if monitor is None else monitor.wrap(runtime, policy_file),
            ))
        return cls(loaded, default=settings.default, fallback_threshold=settings.fallback_threshold)

    def lookup(self, request: DecisionRequest, *, fingerprint: str) -> RuntimePolicy:
        if request.policy is not None:
            named = self._by_name.get(request.policy)
            if named is None:
                raise InvalidRequest(
                    f"policy: no policy named {request.policy!r} "
                    f"(known: {sorted(self._by_name) or 'none'})", field="policy")
            return named.runtime
        match = self._by_signature.get((request.signature(), fingerprint))
        if match is not None:
            return match.runtime
        return self._default or self.fallback

    def names(self) -> list[str]:
        return sorted(self._by_name)
