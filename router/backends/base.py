"""The fast-backend protocol: a batch of decision requests in, one probability per option out.

Contract for every implementation (checked by ``tests/router/backends/test_contract.py``):
- ``read(requests)`` returns one ``OptionScores`` per request, in order, whose ``options`` are
  exactly the request's option names in the request's order and whose ``proba`` sums to 1.
- Failures raise ``router.errors.BackendError`` subclasses (never a foreign exception): the
  service escalates on them. A wrong or partial answer is ``BackendMalformed``.
- ``read_inputs(request, batch)`` is exactly what of the request a read depends on (the read
  cache key is built from it, the namespace and the fingerprint): everything sent upstream that
  can change the answer (a question id that becomes prompt text, co-questions of a joint read),
  nothing else.
- ``read_staged(questions)`` (only where ``reads_staged(questions)`` is True) reads a body of
  several stages (``policies.types.StagedQuestion``) whole, as the server runs it (``ask_if``
  evaluated there, later stages continuing the answers it gave): one ``OptionScores`` per
  question, None for one the server skipped. The router's side of it is ``routing.stages``.
- ``DecisionRequest.extension`` carries knobs for one backend family (``router.backends.knobs``):
  a backend reads its own and ignores the others.
- ``read_spans(state, questions)`` (only where ``reads_spans``: a System One backend) answers
  span questions (``router.backends.spans``), one ``SpanAnswer`` per question, in order.
- ``fingerprint`` identifies everything that changes what a read returns (model, prompt
  template version, canvas, samples, label alphabet...). Policies are tuned for one fingerprint
  and cache keys include it, so it must change whenever reads could change.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

from policies.types import DecisionRequest, OptionScores, StagedQuestion, canonical_hash
from router.backends.spans import SpanAnswer, SpanQuestion, SpanState
from router.errors import BackendRejected

# System One's draw seeds: draw j of a read with seed s uses s + DRAW_SEED_STRIDE * j (the example
# server's rule; the vllm and torch readers follow it so that their draws match).
DRAW_SEED_STRIDE = 7919


class FastBackend(ABC):
    """Base class of fast backends. Subclasses set ``name`` and implement ``read``."""

    name: str = "backend"
    # Whether ``read_spans`` answers span questions, and whether a read sees
    # ``DecisionRequest.images``; what a backend cannot read goes to the slow model.
    reads_spans: bool = False
    reads_images: bool = False

    @abstractmethod
    async def read(self, requests: Sequence[DecisionRequest]) -> list[OptionScores]:
        """Read every request; see the module docstring for the contract."""

    async def read_spans(self, state: SpanState,
                         questions: Sequence[SpanQuestion]) -> list[SpanAnswer]:
        """One answer per span question, in order (only where ``reads_spans``)."""
        raise BackendRejected(f"the {self.name} backend reads no span questions")

    def read_inputs(
        self, request: DecisionRequest, batch: Sequence[DecisionRequest]
    ) -> Mapping[str, Any]:
        """What the read of ``request`` (asked within ``batch``) depends on. Default: the
        question's signature (kind, context, text, options), the state, the draws and the seed."""
        return {"signature": request.signature(), "state": request.state,
                "samples": request.samples, "seed": request.seed,
                **({"images": request.image_digests()} if request.images else {})}

    @property
    def reads_jointly(self) -> bool:
        """True when the requests of one ``read`` call answer each other (a joint read): then a
        batch is read whole or not at all, so no answer is read without its co-questions."""
        return False

    def reads_staged(self, questions: Sequence[StagedQuestion]) -> bool:
        """True when ``read_staged`` can read this body of several stages as one upstream request
        (a server that runs the stages itself). Default: no; the router then runs the stages."""
        return False

    async def read_staged(
        self, questions: Sequence[StagedQuestion]
    ) -> list[OptionScores | None]:
        """Read a whole staged body as the server runs it: one ``OptionScores`` per question, in
        order, None for a question the server skipped (its ``ask_if`` failed there)."""
        raise NotImplementedError(f"the {self.name} backend does not read staged bodies")

    async def learn_upstream(self, *, strict: bool = True) -> None:
        """Learn what a remote server says of itself, before ``fingerprint`` is used (a remote
        tier's fingerprint includes it: ``router.backends.upstream``); not ``strict``: a server
        that cannot be asked leaves the tier unread until it can. Default: nothing to learn."""

    def identity(self) -> Mapping[str, Any]:
        """What goes into the fingerprint. Override to add model, template, canvas, samples."""
        return {"backend": self.name}

    def serving(self) -> Mapping[str, Any]:
        """What this backend serves with now, for operators (``/readyz``): its kernels, whether
        its compiled read is warm, and ``fallbacks`` (human-readable) where it serves with less
        than it was set up for. Not part of the fingerprint/identity. Default: nothing to say."""
        return {}

    @property
    def fingerprint(self) -> str:
        return fingerprint_of(self.identity())

    async def ready(self) -> bool:
        """True when the backend can serve reads now (``/readyz``). Cheap; no model call."""
        return True

    async def aclose(self) -> None:
        """Release connections and models. Idempotent."""


def fingerprint_of(identity: Mapping[str, Any]) -> str:
    """A short stable hash of a backend's identity (16 hex chars are plenty to tell configs apart)."""
    return canonical_hash(dict(identity))[:16]
