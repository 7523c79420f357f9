"""Value types shared by the calibration-free layers above: what a decision asks, what a fast read
returns, and what the router decided. Immutable, hashable where it matters, cheap to build."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

QuestionKind = Literal["choice", "noul", "score"]
Route = Literal["fast", "slow", "cache", "unverified", "none"]
Turn = tuple[str, str]  # (role, text) of one message of a conversation
# The least verified route first: a summary of several decisions names the weakest one, so a
# reader of the summary alone never mistakes an unverified answer for a checked one.
ROUTES_LEAST_VERIFIED_FIRST: tuple[Route, ...] = ("unverified", "slow", "fast", "cache", "none")


@dataclass(frozen=True, slots=True)
class Option:
    """One allowed answer: its name (what the caller gets back) and an optional description."""

    name: str
    description: str | None = None


@dataclass(frozen=True, slots=True)
class ReadExtension:
    """Base of the knobs a request may carry for one fast-backend family
    (``DecisionRequest.extension``). Routing, policies and the slow path never look inside; a
    backend reads only its own subclass and ignores the others, and says in its ``read_inputs``
    what of it a read depends on. Subclasses are frozen dataclasses: requests that differ in
    their knobs must compare unequal, so they are never read as one."""

    def identity(self) -> dict[str, Any]:
        """What of the knobs changes the question itself (part of ``signature()``, so of the
        policy that covers it and of every cache key); nothing by default."""
        return {}


@dataclass(frozen=True, slots=True)
class DecisionRequest:
    """One question with a fixed set of options about one state.

    ``instructions`` is the question text, ``context`` the shared instructions that precede every
    question of a request (System One's top-level ``instructions``; the system message of a chat
    request). ``state`` is the canonical text of what is being decided about.

    ``turns`` is the conversation the request came as, (role, text) per message with system turns
    included, when it came as one (a chat request); the slow path shows the slow model those
    turns rather than ``state``. It is the same input as ``context`` and ``state`` in another
    form, so it takes no part in equality, hashing or the signature.
    """

    question_id: str
    instructions: str
    options: tuple[Option, ...]
    state: str
    context: str = ""
    kind: QuestionKind = "choice"
    samples: int = 1
    seed: int = 42
    policy: str | None = None  # a policy name the caller asked for, else looked up by signature
    # What the caller asked of one fast-backend family beyond the question (System One's samples
    # "auto" and engine knobs): carried through routing unread; the backend it is for reads it.
    extension: ReadExtension | None = None
    # Images shown ahead of the state, as data URLs: part of the state (every cache key holds
    # their digests), read only by a fast tier that reads images, and shown to the slow model.
    images: tuple[str, ...] = field(default=(), repr=False)
    turns: tuple[Turn, ...] = field(default=(), compare=False, repr=False)
    # signature() memoised: the registry, the cache key and the decision log each need it, and
    # hashing it is most of a cache hit's own CPU. Not part of equality, hashing or repr.
    _signature: str | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def option_names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.options)

    def image_digests(self) -> list[str]:
        """The images' SHA-256 digests, in order: how keys and logs name them."""
        return [hashlib.sha256(url.encode()).hexdigest() for url in self.images]

    def signature(self) -> str:
        """Hash of what defines the *question* (not the state): kind, context, text, ordered options."""
        if self._signature is not None:
            return self._signature
        payload: dict[str, Any] = {
            "kind": self.kind,
            "context": self.context,
            "instructions": self.instructions,
            "options": [[o.name, o.description] for o in self.options],
        }
        identity = self.extension.identity() if self.extension is not None else {}
        if identity:  # only when set: a question without knobs keeps the signature it had
            payload["extension"] = identity
        signature = canonical_hash(payload)
        object.__setattr__(self, "_signature", signature)  # frozen: memoised once, never changed
        return signature


@dataclass(frozen=True, slots=True)
class StagedQuestion:
    """One question of a body answered in stages: its request and what it waits for, named by
    the ``question_id`` of other questions of the same body. ``ask_if`` pairs a dependency with
    the answers it must have for this question to be asked (it is a dependency too)."""

    request: DecisionRequest
    depends_on: tuple[str, ...] = ()
    ask_if: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def dependencies(self) -> tuple[str, ...]:
        """``depends_on`` plus every ``ask_if`` key, each once, in the order given."""
        return tuple(dict.fromkeys(self.depends_on + tuple(dep for dep, _ in self.ask_if)))

    def key(self) -> list[Any]:
        """What of it a read of the whole body depends on, beside the request's read inputs."""
        return [self.request.question_id, self.request.signature(), list(self.depends_on),
                [[dep, list(wanted)] for dep, wanted in self.ask_if]]


@dataclass(frozen=True, slots=True)
class OptionScores:
    """A fast backend's read: one probability per option, in the request's option order.

    ``proba`` sums to 1 (backends normalise), each value a finite number in [0, 1]: anything
    else raises ValueError, which the routing service turns into a failed read (escalated,
    counted, never accepted, never cached). ``raw`` carries backend diagnostics worth logging
    (entropy, label mass, draws); it never influences routing.
    """

    options: tuple[str, ...]
    proba: tuple[float, ...]
    raw: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.options) != len(self.proba):
            raise ValueError(
                f"proba has {len(self.proba)} values for {len(self.options)} options"
            )
        bad = next((p for p in self.proba if not -1e-9 <= float(p) <= 1.0 + 1e-9), None)
        if bad is not None:  # NaN fails every comparison, so it lands here too
            raise ValueError(f"proba holds {bad!r}: every probability must be a finite number "
                             "in [0, 1]")
        total = math.fsum(self.proba)
        if not math.isclose(total, 1.0, abs_tol=1e-4):
            raise ValueError(f"proba sums to {total:.6f}, not 1")

    @property
    def top_index(self) -> int:
        return max(range(len(self.proba)), key=self.proba.__getitem__)

    @property
    def top(self) -> tuple[str, float]:
        i = self.top_index
        return self.options[i], self.proba[i]

    def as_dict(self) -> dict[str, float]:
        return dict(zip(self.options, self.proba))


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a policy says about one calibrated read."""

    accept: bool
    index: int  # the chosen option (the calibrated argmax)
    probability: float  # its calibrated probability
    threshold: float | None  # the bar it was held to (None: the rule has no single bar)
    reason: str  # short, for logs and the response ("above threshold", "margin 0.03 < 0.10", ...)


@dataclass(frozen=True, slots=True)
class TierRead:
    """One fast tier's read of a decision under a cascade policy, as every surface shows it: the
    tier's answer, its calibrated probability, the threshold it was held to (None: no
    threshold passed for it at tuning), whether the tier accepted it, and whether the read came
    from the read cache."""

    tier: str
    answer: str
    probability: float
    threshold: float | None
    accepted: bool
    cached: bool

    def facts(self) -> dict[str, Any]:
        return {"tier": self.tier, "answer": self.answer, "probability": self.probability,
                "threshold": self.threshold, "accepted": self.accepted, "cached": self.cached}


@dataclass(frozen=True, slots=True, kw_only=True)
class Receipt:
    """What was promised for one served answer (docs/calibration.md, "The receipt"):
    ``guarantee`` ("accuracy", "agreement_with_slow", or None) and ``why`` (the promise in
    words, or why there is none); the policy's ``target_accuracy`` and ``delta``, its file's
    ``policy_digest``, the ``question`` it covers (its scope signature); who answered
    (``answered_by``: "fast tier", "fast tier NAME", "fast tier (unverified)", "slow model"); and
    the policy's ``watch`` ("clear", "suspect": traffic less sure than its tuning rows or a
    drift alarm, "alarmed": an accuracy alarm; None: not watched). A slow model's answer never
    carries the fast tier's guarantee."""

    guarantee: str | None
    why: str
    answered_by: str
    target_accuracy: float | None = None
    delta: float | None = None
    policy_digest: str | None = None
    question: str | None = None
    watch: str | None = None

    def facts(self) -> dict[str, Any]:
        return {"guarantee": self.guarantee, "why": self.why, "answered_by": self.answered_by,
                "target_accuracy": self.target_accuracy, "delta": self.delta,
                "policy_digest": self.policy_digest, "question": self.question,
                "watch": self.watch}


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """The router's answer to one DecisionRequest (built by keyword: its fields are many and
    several are optional floats)."""

    decision_id: str
    question_id: str
    answer: str | None
    route: Route
    probability: float | None  # calibrated probability of the answer under the fast read
    raw_probability: float | None  # the fast backend's own probability of the answer
    threshold: float | None
    policy_id: str
    latency_ms: float
    probabilities: dict[str, float] | None = None  # calibrated, per option
    note: str | None = None  # e.g. "escalation unavailable: fast answer below threshold"
    # True when the answer is the slow path's (fresh or from the slow-answer cache): a ``cache``
    # route alone does not say whether a cached fast read or a cached slow answer was served.
    escalated: bool = False
    # Shadow mode: the fast tier read it and its policy judged it, but the slow model's answer
    # was served regardless (both are logged). ``guarantee``: what the policy promises about
    # this answer, "accuracy" or "agreement_with_slow": set only on an answer its policy
    # accepted and served from the fast tier (``receipt`` says why, or why there is none).
    shadow: bool = False
    guarantee: str | None = None
    # Under a cascade policy: the fast tier whose answer was served (None: the slow model's or
    # none), and every tier read for the decision, in order (None: one fast tier, not shown).
    tier: str | None = None
    tiers: tuple[TierRead, ...] | None = None
    receipt: Receipt | None = None
    # The thought a System One fast tier wrote before the read this answer came from (the
    # server's ``diagnostics.thought`` for ``think``), passed on; not in ``facts()``.
    thought: dict[str, Any] | None = None

    def facts(self) -> dict[str, Any]:
        """The decision as the flat JSON object every surface shows and the decision log keeps
        (all fields but the per-option ``probabilities``; latency rounded to the microsecond);
        a cascade's decision adds ``tier`` and ``tiers``."""
        facts: dict[str, Any] = {
            "decision_id": self.decision_id,
            "question_id": self.question_id,
            "answer": self.answer,
            "route": self.route,
            "escalated": self.escalated,
            "probability": self.probability,
            "raw_probability": self.raw_probability,
            "threshold": self.threshold,
            "policy_id": self.policy_id,
            "latency_ms": round(self.latency_ms, 3),
            "note": self.note,
            "shadow": self.shadow,
            "guarantee": self.guarantee,
            "receipt": None if self.receipt is None else self.receipt.facts(),
        }
        if self.tiers is not None:
            facts["tier"] = self.tier
            facts["tiers"] = [read.facts() for read in self.tiers]
        return facts


def summary_route(decisions: Iterable[Decision]) -> Route:
    """The one route that stands for several decisions: the least verified one they took."""
    routes = {d.route for d in decisions}
    return next((r for r in ROUTES_LEAST_VERIFIED_FIRST if r in routes), "none")


def canonical_json(payload: Any) -> bytes:
    """The one canonical JSON encoding used for hashes and fingerprints: sorted keys, no spaces,
    UTF-8, the bytes ``json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False)``
    writes, so hashes already stored in policy files stay valid. orjson writes them about 10x
    faster (this runs on every decision) except for floats below 1e-4 (``1e-05`` vs
    ``0.00001``): output holding ``e-`` or ``0.0000`` (a checked superset of those floats), and
    what orjson refuses (non-string keys, integers past 64 bits), goes to the stdlib encoder.
    NaN and infinities (not JSON) come out as ``null``."""
    try:
        encoded = orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)
        if b"e-" not in encoded and b"0.0000" not in encoded:
            return encoded
    except TypeError:  # orjson.JSONEncodeError subclasses TypeError
        pass
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def canonical_hash(payload: Any) -> str:
    return hashlib.sha256(canonical_json(payload)).hexdigest()
