"""The tuned policies the router serves, looked up per decision: by the name a request asks for,
else by (scope, backend fingerprint), else the configured default, always within the policy's
scope (``policies/scope.py``: the question, and options, it was tuned on). A decision no
policy covers is *unscoped*: ``lookup`` returns None and the plan follows ``policy.unscoped``
(``router.routing.plan``; the fixed bar on the uncalibrated read under ``unscoped:
threshold``). Every loaded file runs as one ``policies.policy.Policy``, one tier or several. Loaded at
start-up and again by ``reload`` (SIGHUP or a changed file, ``router/routing/reload.py``): a
reload swaps everything at once or, when any file is invalid, nothing."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from policies.policy import Policy
from policies.scope import UnscopedMode, request_scope
from policies.types import DecisionRequest
from router.errors import ConfigError, InvalidRequest
from router.routing.plan import Promise
from router.settings import PolicySettings

if TYPE_CHECKING:
    from policies.file import PolicyFile
    from router.routing.ports import CostAlarm, DecisionObserver

log = logging.getLogger("slotgate")


@dataclass(frozen=True, slots=True)
class LoadedPolicy:
    """A policy the registry serves: the ``file`` it was read from (what it is, what it answers,
    its mode) and the ``runtime`` policy built from that file once."""

    file: PolicyFile
    runtime: Policy
    path: Path | None = None
    # Why the file is served without its guarantee (edited after tuning or unsigned, under
    # ``policy.on_edited: unguaranteed``); None: its guarantee stands.
    unguaranteed: str | None = None

    @property
    def name(self) -> str:
        return self.file.name

    @property
    def scope(self) -> str | None:
        """What it answers: its scope signature (``policies.scope``), None when the file does not
        record its question (refused by the registry)."""
        return None if self.file.question_unrecorded else self.file.signature

    def covers(self, request: DecisionRequest) -> bool:
        """Its scope is the request's question over the request's options (or the one logged
        request it was tuned on): asked for by name or as the default, a policy still decides
        only the question it was tuned on."""
        return self.scope in (request.signature(), request_scope(request))


class PolicyRegistry:
    def __init__(
        self,
        policies: Sequence[LoadedPolicy] = (),
        *,
        default: str | None = None,
        fallback_threshold: float = 0.9,
        shadow: bool = False,
        unscoped: UnscopedMode = "threshold",
    ) -> None:
        # A registry built in code keeps the old fallback threshold (``unscoped: threshold``);
        # one loaded from settings follows ``policy.unscoped``, "escalate" unless configured.
        self.shadow_all = shadow
        self.unscoped: UnscopedMode = unscoped
        self._source: tuple[PolicySettings, str, DecisionObserver | None,
                            tuple[tuple[str, str], ...]] | None = None
        self._by_name: dict[str, LoadedPolicy] = {}
        self._by_signature: dict[tuple[str, str], LoadedPolicy] = {}
        for policy in policies:
            if policy.name in self._by_name:
                raise ConfigError(
                    f"two policy files are named {policy.name!r}: "
                    f"{self._by_name[policy.name].path} and {policy.path}")
            scope = policy.scope
            if scope is None:
                # Scoped by an option set (and perhaps an id) only: it would answer every
                # question over those options, any yes/no question for a yes/no policy.
                raise ConfigError(
                    f"policy file {policy.path} ({policy.name!r}): field 'question': the file "
                    "does not record the question it was tuned for (written before questions "
                    "were), so it would answer any question over its options; migrate it, "
                    f"naming the question: `slotgate migrate --policy {policy.path} --model "
                    "MODEL --question NAME` (docs/calibration.md, \"Scope\")",
                    field="question")
            self._by_name[policy.name] = policy
            self._by_signature[(scope, policy.file.backend_fingerprint)] = policy
        if default is not None and default not in self._by_name:
            raise ConfigError(
                f"policy.default names {default!r}, but no policy file has that name "
                f"(loaded: {sorted(self._by_name) or 'none'})")
        self._default = self._by_name[default] if default else None
        self.fallback_threshold = fallback_threshold
        self._modes = {p.runtime.policy_id: (
            self.shadow_all if p.file.shadow is None else p.file.shadow,
            None if p.unguaranteed else p.file.guarantee)
            for p in policies}

    @classmethod
    def load(cls, settings: PolicySettings, *, backend_fingerprint: str,
             monitor: DecisionObserver | None = None,
             tiers: Sequence[tuple[str, str]] = ()) -> PolicyRegistry:
        """Load ``settings.files``; refuse a policy tuned for another backend fingerprint unless
        ``allow_fingerprint_mismatch``: its thresholds would mean nothing for this backend.
        ``tiers``: (name, fingerprint) of every configured fast tier in order, the first
        (``fast``) included; a cascade policy's tiers must be among them, in that order (see
        ``check_cascade``). With a ``monitor``, every loaded policy is watched in production
        (its ``decide`` stays pure: the service reports to the monitor, ``gate`` asks it)."""

        loaded, missing = [], []
        for path in settings.files:
            if settings.shadow and not path.exists():
                # Cold start: nothing is tuned yet and every decision is shadowed; the file is
                # loaded once `slotgate tune` writes it (live reload).
                log.warning("policy file %s not found yet: shadow mode until it is tuned", path)
                missing.append(path)
                continue
            loaded.append(_checked(path, settings, backend_fingerprint, tiers))
        default = settings.default
        if missing and default is not None and default not in {p.name for p in loaded}:
            # Its file is one of those not written yet: the reload that loads it sets it.
            log.warning("policy.default names %r, not loaded yet (not written: %s): no default "
                        "policy until it is", default, ", ".join(map(str, missing)))
            default = None
        registry = cls(loaded, default=default,
                       fallback_threshold=settings.fallback_threshold, shadow=settings.shadow,
                       unscoped=settings.unscoped_mode)
        registry._source = (settings, backend_fingerprint, monitor, tuple(tiers))
        if monitor is not None:  # after all loaded: a refused reload changes no watch
            for policy in loaded:
                monitor.watch(policy.file)
            monitor.retire_others(p.file.policy_id for p in loaded)
        return registry

    def reload(self) -> bool:
        """Read the policy files again and swap them in at once. Any invalid file (unreadable,
        malformed, another backend's) is refused with an ERROR log line naming it, and the
        policies loaded before keep serving. False when nothing was swapped."""
        if self._source is None:
            return False
        settings, fingerprint, monitor, tiers = self._source
        try:
            fresh = PolicyRegistry.load(settings, backend_fingerprint=fingerprint, monitor=monitor,
                                        tiers=tiers)
        except ConfigError as exc:
            log.error("policy reload refused, the loaded policies keep serving: %s", exc.message)
            return False
        before = {p.runtime.policy_id for p in self._by_name.values()}
        # One assignment per attribute, no await in between: a decision sees old or new maps.
        self._by_name, self._by_signature = fresh._by_name, fresh._by_signature
        self._default, self._modes = fresh._default, fresh._modes
        after = {p.runtime.policy_id for p in self._by_name.values()}
        log.info("policies reloaded: %s (was %s)", sorted(after) or "none", sorted(before) or "none")
        return True

    def gate(self, policy: Policy) -> str | None:
        """The alarm gate, beside the mode: why an alarm on this policy escalates what it
        accepts (``on_alarm``, docs/monitoring.md); None while its verdicts stand."""
        monitor = self._source[2] if self._source is not None else None
        return None if monitor is None else monitor.gate(policy.policy_id)

    def cost_alarm(self, policy: Policy) -> CostAlarm | None:
        """The policy's broken cost promise and the operator's choice (None: it holds, it has
        none, or nothing watches it)."""
        monitor = self._source[2] if self._source is not None else None
        return None if monitor is None else monitor.cost_alarm(policy.policy_id)

    def watch_state(self, policy: Policy) -> str | None:
        """The policy's watch in one word ("clear", "suspect", "alarmed"; None: unwatched)."""
        monitor = self._source[2] if self._source is not None else None
        return None if monitor is None else monitor.watch_state(policy.policy_id)

    def promise(self, policy: Policy) -> Promise:
        """What ``policy`` promises, from its file (a policy built in code: its mode's)."""
        file = policy.file_
        guarantee = self.mode(policy)[1]
        loaded = self._by_name.get(file.name) if file is not None else None
        return Promise(
            policy_id=policy.policy_id, guarantee=guarantee,
            target_accuracy=policy.params_.target_accuracy, delta=policy.params_.delta,
            digest=None if file is None else file.digest,
            question=None if file is None else file.signature,
            unguaranteed=None if loaded is None else loaded.unguaranteed)

    def mode(self, policy: Policy) -> tuple[bool, str | None]:
        """(shadow, guarantee) of a policy ``lookup`` returned: its file's, else the server's."""
        return self._modes.get(policy.policy_id, (self.shadow_all, None))

    def paths(self) -> list[Path]:
        """The policy files to watch (those configured, loaded or not yet written)."""
        return list(self._source[0].files) if self._source is not None else []

    def lookup(self, request: DecisionRequest, *, fingerprint: str) -> Policy | None:
        """The policy that decides ``request``, or None when no loaded policy covers it (the
        plan then follows ``self.unscoped``). A policy asked for by name that does not cover
        the request leaves it unscoped too."""
        if request.policy is not None:
            named = self._by_name.get(request.policy)
            if named is None:
                raise InvalidRequest(
                    f"policy: no policy named {request.policy!r} "
                    f"(known: {sorted(self._by_name) or 'none'})", field="policy")
            return named.runtime if named.covers(request) else None
        # Most specific first: a file tuned on one logged request (its signature is that
        # request's hash), then the request's question over its options.
        for key in (request.signature(), request_scope(request)):
            match = self._by_signature.get((key, fingerprint))
            if match is not None:
                return match.runtime
        default = self._default
        if default is not None and default.covers(request):
            return default.runtime
        return None

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def loaded(self) -> list[LoadedPolicy]:
        """The policies serving now, by name (for /readyz and the start-up log)."""
        return [self._by_name[name] for name in sorted(self._by_name)]


# The files whose missing digest was said (once per file and process, not at every reload).
_UNSEALED_SAID: set[Path] = set()


def _checked(path: Path, settings: PolicySettings, backend_fingerprint: str,
             tiers: Sequence[tuple[str, str]]) -> LoadedPolicy:
    """One policy file, read and checked before it is trusted: readable and valid, tuned for
    the configured tiers' fingerprints, and sealed as tuning wrote it (``digest``, ``hmac``).
    Raises ConfigError naming the file and the field."""
    from policies.file import load_policy  # policies stays importable without the router

    try:
        policy_file = load_policy(path)
    except Exception as exc:  # any failure to read a file refuses it, naming the file
        raise ConfigError(f"policy file {path}: {exc}") from exc
    if (policy_file.backend_fingerprint != backend_fingerprint
            and not settings.allow_fingerprint_mismatch):
        raise ConfigError(
            f"policy file {path} ({policy_file.name!r}) was tuned for backend fingerprint "
            f"{policy_file.backend_fingerprint}, but the configured fast backend has "
            f"{backend_fingerprint}; tuned by an earlier slotgate on this same model file? "
            f"`slotgate migrate --policy {path} --model MODEL` re-signs it (it checks); else "
            "re-tune it on this backend's predictions, or set "
            "policy.allow_fingerprint_mismatch: true to serve it anyway")
    if policy_file.cascade is not None:
        check_cascade(policy_file, path, tiers or [("fast", backend_fingerprint)],
                      allow_mismatch=settings.allow_fingerprint_mismatch)
    problem = policy_file.integrity_problem(settings.signing_key_bytes)
    if problem is not None and settings.on_edited == "refuse":
        raise ConfigError(
            f"policy file {path} ({policy_file.name!r}): field 'digest': {problem}; re-tune it "
            "(`slotgate tune`), or set policy.on_edited: unguaranteed to serve it without its "
            "guarantee", field="digest")
    if problem is not None:
        log.warning("policy file %s (%r) is served WITHOUT its guarantee: %s "
                    "(policy.on_edited: unguaranteed)", path, policy_file.name, problem)
    elif policy_file.digest is None and path not in _UNSEALED_SAID:
        _UNSEALED_SAID.add(path)
        log.warning("policy file %s (%r) has no digest (written before policy files carried "
                    "one): an edit to it cannot be told; re-tune it to seal it", path,
                    policy_file.name)
    return LoadedPolicy(policy_file, Policy.from_file(policy_file), path, unguaranteed=problem)


def check_cascade(file: PolicyFile, path: Path, tiers: Sequence[tuple[str, str]], *,
                  allow_mismatch: bool) -> None:
    """A cascade policy serves only over the tiers it was tuned on: its first tier is the
    configured first (``fast.name``), every later one a configured tier (``tiers[].name``) in
    the configured order, each with the fingerprint it was tuned on (unless
    ``policy.allow_fingerprint_mismatch``). Raises ConfigError naming the file and the tier."""
    assert file.cascade is not None
    configured = dict(tiers)
    order = [name for name, _ in tiers]
    where = f"policy file {path} ({file.name!r})"
    names = [tier.name for tier in file.cascade.tiers]
    if names[0] != order[0]:
        raise ConfigError(f"{where}: field 'cascade.tiers': its first tier is {names[0]!r}, "
                          f"but the configured first tier (fast.name) is {order[0]!r}",
                          field="cascade.tiers")
    for tier in file.cascade.tiers:
        if tier.name not in configured:
            raise ConfigError(
                f"{where}: field 'cascade.tiers': tier {tier.name!r} is not configured "
                f"(configured: {', '.join(order)}); add it under `tiers:` in the settings",
                field="cascade.tiers")
        if configured[tier.name] != tier.backend_fingerprint and not allow_mismatch:
            raise ConfigError(
                f"{where}: tier {tier.name!r} was tuned for backend fingerprint "
                f"{tier.backend_fingerprint}, but the configured tier has "
                f"{configured[tier.name]}; re-tune it on this backend's predictions, or set "
                "policy.allow_fingerprint_mismatch: true", field="cascade.tiers")
    positions = [order.index(name) for name in names]
    if positions != sorted(positions):
        raise ConfigError(f"{where}: field 'cascade.tiers': the tiers {names} are not in the "
                          f"configured order {order}", field="cascade.tiers")
