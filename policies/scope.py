"""What question a tuned policy answers: its scope, recorded at tuning as the policy file's
``question`` (readable) and ``signature`` (its hash), and checked by the router for every decision
(docs/calibration.md, "Scope").

A question is what is asked, apart from the state: its ``id`` (an OpenAI ``json_schema`` ``name``
for an enum schema, the property name for an object schema, ``"choice"`` for vLLM's choice
lists; a System One question id), its ``instructions`` (the schema's or property's description,
a System One question's instructions; "" when it is asked by its id alone, as a schema with no
description is), its ``context`` (the chat request's system messages, a System One body's
top-level instructions) and its ``kind`` (choice, noul, score). A scope is one question over one
set of options (names and descriptions, in any order: every calibrator slotgate fits is
top-label or one temperature, and rules name options by name). Two questions that differ in any
of these never share a policy, whatever their options: every yes/no question has the same two.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from policies.types import DecisionRequest, Option, QuestionKind, canonical_hash

# What a decision no loaded policy covers gets (``policy.unscoped``): the slow model's answer,
# the same served as a shadow decision (the fast read logged beside it, to tune on later), the
# fast answer marked ``unverified``, or (configurations written before scopes) the fallback
# threshold on the uncalibrated read. None carries a guarantee or reaches any policy's watch.
UnscopedMode = Literal["escalate", "shadow", "unverified", "threshold"]

SCOPE_PREFIX = "scope-v2:"
# Scopes written before questions were recorded: an option set, or an option set and an id.
# Such a file does not know what its question asks, and the router refuses to serve it.
UNRECORDED_PREFIX = "scope-v1:"


@dataclass(frozen=True, slots=True)
class Question:
    """What a decision asks, apart from its options and state (the module docstring says where
    each field comes from on each surface). Built with ``of`` or ``asked``, which normalise
    instructions that only repeat the id to "" (an OpenAI schema with no description is asked
    by its name, a System One question with no instructions by its id: the same question)."""

    id: str
    instructions: str = ""
    context: str = ""
    kind: QuestionKind = "choice"

    @classmethod
    def asked(cls, question_id: str, *, instructions: str = "", context: str = "",
              kind: QuestionKind = "choice") -> Question:
        """A question as a person names it (``slotgate train/tune --question``); checked."""
        if not question_id.strip() or any(c in question_id for c in ":\r\n"):
            raise ValueError(f"question id {question_id!r} must be non-empty, with no ':' or "
                             "newline")
        if kind not in ("choice", "noul", "score"):
            raise ValueError(f"question kind must be choice, noul or score, got {kind!r}")
        return cls(question_id, _own_text(question_id, instructions), context, kind)

    @classmethod
    def of(cls, request: DecisionRequest) -> Question:
        """The question ``request`` asks (its fields were checked where it was parsed)."""
        return cls(request.question_id, _own_text(request.question_id, request.instructions),
                   request.context, request.kind)

    def as_dict(self) -> dict[str, Any]:
        """The question as a policy file, a model artifact and a predictions row record it."""
        return {"id": self.id, "instructions": self.instructions, "context": self.context,
                "kind": self.kind}

    def describe(self) -> str:
        """The question as a note names it: its id, kind and (shortened) text."""
        text = self.instructions or self.context
        shown = f": {text[:60]!r}" + ("..." if len(text) > 60 else "") if text else ""
        return f"{self.id!r} ({self.kind}{shown})"


def _own_text(question_id: str, instructions: str) -> str:
    """Instructions that say more than the id; "" for none, or for the id repeated."""
    return "" if instructions.strip() in ("", question_id) else instructions


def scope_signature(options: Sequence[str | Option], question: Question) -> str:
    """The policy file's ``signature``: ``question`` asked over ``options`` (names, or
    ``Option`` with their descriptions; in any order)."""
    if not options:
        raise ValueError("a scope needs the option names the policy was tuned on")
    described = sorted(([o, None] if isinstance(o, str) else [o.name, o.description]
                        for o in options), key=lambda pair: (pair[0], pair[1] or ""))
    return SCOPE_PREFIX + canonical_hash({"options": described, "question": question.as_dict()})


def request_scope(request: DecisionRequest) -> str:
    """The scope signature a policy covering ``request`` holds. Memoised by the request's own
    (memoised) signature, which hashes its kind, context, instructions and options, and its
    question id: the registry asks for every decision, and hashing 77 option names, or even
    building their tuple, would be a visible share of a cache hit's CPU."""
    key = (request.signature(), request.question_id)
    scope = _SCOPES.get(key)
    if scope is None:
        if len(_SCOPES) >= _SCOPES_MAX:  # distinct questions are few; a flood just starts over
            _SCOPES.clear()
        scope = _SCOPES[key] = scope_signature(request.options, Question.of(request))
    return scope


_SCOPES: dict[tuple[str, str], str] = {}
_SCOPES_MAX = 4096


def question_recorded(signature: str | None) -> bool:
    """Whether a policy file's ``signature`` pins down the question it was tuned on: a scope of
    a recorded question, or one logged request's own signature (rows exported from the decision
    log: that exact question, its options in that order). A file written before questions were
    recorded (``scope-v1``: an option set and perhaps an id; ``null``: its option list) is not,
    and the router refuses it (re-tune it with ``slotgate tune --question``)."""
    return signature is not None and not signature.startswith(UNRECORDED_PREFIX)


def describe(request: DecisionRequest) -> str:
    """The question as a person reads it in a note: its id, kind and text, its option count and
    a few names (two questions over the same options must read apart)."""
    names = request.option_names
    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    return f"{Question.of(request).describe()} over {len(names)} options ({shown})"
