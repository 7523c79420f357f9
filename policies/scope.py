"""What question a tuned policy answers: its scope, recorded at tuning as the policy file's
``question`` (readable) and ``signature`` (its hash), and checked by the router for every decision
(docs/calibration.md, "Scope").

A question is what is asked, apart from the state: its ``id`` (an OpenAI ``json_schema`` ``name``
for an enum schema, the property name for an object schema, ``"choice"`` for vLLM's choice
lists; a System One question id), its ``instructions`` (every name, title and description on the
path to the answer, ``question_text``; a System One question's instructions; "" when it is asked
by its id alone), its ``context`` (the chat request's system messages and the turns before the
state, a System One body's top-level instructions) and its ``kind`` (choice, noul, score). A
scope is one question over one set of options (names and descriptions, in any order: every
calibrator slotgate fits is top-label or one temperature, and rules name options by name). Two
questions that differ in any of these never share a policy, whatever their options: every
yes/no question has the same two.

The identity is canonical (``canonical_text``): whitespace is not a word, so runs of it (line
breaks of any convention included) count as one space and the ends are stripped; how a prompt
is split across messages follows from that. No word is dropped or changed anywhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
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
    each field comes from on each surface). Built with ``of`` or ``asked``, which hold its texts
    in canonical form (``canonical_text``) and normalise instructions that only spell the id to
    "" (an OpenAI schema with no description is asked by its name, a System One question with
    no instructions by its id: the same question)."""

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
        return cls(question_id, _own_text(question_id, instructions), canonical_text(context),
                   kind)

    @classmethod
    def of(cls, request: DecisionRequest) -> Question:
        """The question ``request`` asks (its fields were checked where it was parsed)."""
        return cls(request.question_id, _own_text(request.question_id, request.instructions),
                   canonical_text(request.context), request.kind)

    def as_dict(self) -> dict[str, Any]:
        """The question as a policy file, a model artifact and a predictions row record it."""
        return {"id": self.id, "instructions": self.instructions, "context": self.context,
                "kind": self.kind}

    def describe(self) -> str:
        """The question as a note names it: its id, kind and (shortened) text."""
        text = self.instructions or self.context
        shown = f": {text[:60]!r}" + ("..." if len(text) > 60 else "") if text else ""
        return f"{self.id!r} ({self.kind}{shown})"


def canonical_text(text: str) -> str:
    """``text`` as a question's identity holds it: every run of whitespace (spaces, tabs, line
    breaks as CRLF, CR or LF) one space, none at either end. Two texts with the same words in
    the same order are the same text; any other difference is a different text."""
    return " ".join(text.split())


def _spelling(text: str) -> str:
    """The words of ``text`` up to case, with '_' and '-' read as spaces: what a title spells
    (pydantic titles the field ``customer_intent`` "Customer Intent")."""
    return canonical_text(text.replace("_", " ").replace("-", " ")).casefold()


def spells_id(text: str, question_id: str) -> bool:
    """Whether ``text`` only spells the question id (``_spelling``)."""
    return _spelling(text) == _spelling(question_id)


def question_text(question_id: str, parts: Iterable[str | None]) -> str:
    """A question's instructions from the texts on the path to its answer, outermost first (an
    OpenAI object schema: its ``json_schema`` name, description, the schema's title and
    description, then the property's title and description). A part that is empty, only spells
    the id (``spells_id``) or repeats an earlier part says nothing more and is left out; the rest
    are kept, in order, one per line. "" when none is left: the question is asked by its id."""
    kept: dict[str, str] = {_spelling(question_id): ""}  # spelling -> the text kept for it
    for part in parts:
        text = canonical_text(part or "")
        if text:
            kept.setdefault(_spelling(text), text)
    return "\n".join(text for text in kept.values() if text)


def _own_text(question_id: str, instructions: str) -> str:
    """Instructions as the identity holds them: canonical, without the lines that only spell
    the id (the id is the question's already); "" for none."""
    return canonical_text("\n".join(line for line in instructions.splitlines()
                                    if not spells_id(line, question_id)))


def scope_signature(options: Sequence[str | Option], question: Question) -> str:
    """The policy file's ``signature``: ``question`` asked over ``options`` (names, or
    ``Option`` with their descriptions; in any order)."""
    if not options:
        raise ValueError("a scope needs the option names the policy was tuned on")
    described = sorted(([o, None] if isinstance(o, str) else [o.name, _description(o)]
                        for o in options), key=lambda pair: (pair[0], pair[1] or ""))
    return SCOPE_PREFIX + canonical_hash({"options": described, "question": question.as_dict()})


def _description(option: Option) -> str | None:
    return None if option.description is None else canonical_text(option.description)


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


def unrecorded_signature(options: Sequence[str], question_id: str | None) -> str:
    """A ``scope-v1`` signature as files written before questions were recorded hold it: the
    option set, and the question id when the tuning rows named one."""
    return UNRECORDED_PREFIX + canonical_hash({"options": sorted(options),
                                               "question": question_id})


def verbatim_signature(options: Sequence[str], question: Mapping[str, str]) -> str:
    """A ``scope-v2`` signature as files written before question texts were canonical hold it:
    ``question``'s texts as given (instructions that were exactly the id, or blank, as none)."""
    instructions = question.get("instructions", "")
    recorded = {"id": question["id"], "context": question.get("context", ""),
                "kind": question.get("kind", "choice"),
                "instructions": "" if instructions.strip() in ("", question["id"])
                else instructions}
    return SCOPE_PREFIX + canonical_hash({"options": sorted([name, None] for name in options),
                                          "question": recorded})


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


@dataclass(frozen=True, slots=True)
class QuestionScope:
    """A question over a set of option names: what a request asks, or what a policy answers."""

    question: Question
    options: frozenset[str]

    @classmethod
    def of(cls, request: DecisionRequest) -> QuestionScope:
        return cls(Question.of(request), frozenset(request.option_names))


# The fields ``near_miss`` compares, in the order a note lists them.
SCOPE_FIELDS = ("id", "instructions", "context", "kind", "options")


def near_miss(asked: QuestionScope, tuned: Mapping[str, QuestionScope]
              ) -> tuple[str, str, str] | None:
    """(policy id, field, what differs) when ``asked`` differs from a tuned scope in exactly one
    field of ``SCOPE_FIELDS``, else None (covered, or far from every policy). The first such
    policy by id: a request is one near miss, however many policies it nearly matches."""
    for policy_id in sorted(tuned):
        differing = _differing(asked, tuned[policy_id])
        if len(differing) == 1:
            field = differing[0]
            return policy_id, field, _difference(asked, tuned[policy_id], field)
    return None


def _differing(asked: QuestionScope, tuned: QuestionScope) -> list[str]:
    mine, theirs = asked.question.as_dict(), tuned.question.as_dict()
    fields = [name for name in SCOPE_FIELDS[:-1] if mine[name] != theirs[name]]
    return fields + ["options"] * (asked.options != tuned.options)


def _difference(asked: QuestionScope, tuned: QuestionScope, field: str) -> str:
    """What differs, for a log line: the two texts (shortened), or the options each lacks."""
    if field == "options":
        extra, missing = sorted(asked.options - tuned.options), sorted(tuned.options - asked.options)
        return (f"options: {len(extra)} not tuned on {_few(extra)}, "
                f"{len(missing)} tuned on but not asked {_few(missing)}")
    value, expected = asked.question.as_dict()[field], tuned.question.as_dict()[field]
    return f"{field}: asked {_short(value)}, tuned on {_short(expected)}"


def _few(names: Sequence[str]) -> str:
    return "(" + ", ".join(names[:3]) + (", ..." if len(names) > 3 else "") + ")"


def _short(text: str) -> str:
    return repr(text[:80] + ("..." if len(text) > 80 else ""))
