"""What question a tuned policy answers: its scope, recorded at tuning as the policy file's
``signature`` and checked by the router for every decision (docs/calibration.md, "Scope").

A scope is the set of option names the policy was tuned on and, when its tuning rows came from
one named question, that name: an OpenAI ``json_schema`` ``name`` (an enum schema) or property
name (an object schema; ``"choice"`` for vLLM's choice lists), or a System One question ``id``.
A decision is covered when its options are the same names (in any order: every calibrator
slotgate fits is top-label or one temperature, and rules name options by name, so a policy reads
options the same in any order) and, for a named scope, its question id is that name. A subset of
the options (2 of the 77 intents) is another question.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from policies.types import DecisionRequest, canonical_hash

# What a decision no loaded policy covers gets (``policy.unscoped``): the slow model's answer,
# the same served as a shadow decision (the fast read logged beside it, to tune on later), the
# fast answer marked ``unverified``, or (configurations written before scopes) the fallback
# threshold on the uncalibrated read. None carries a guarantee or reaches any policy's watch.
UnscopedMode = Literal["escalate", "shadow", "unverified", "threshold"]

SCOPE_PREFIX = "scope-v1:"


def scope_signature(options: Sequence[str], question: str | None = None) -> str:
    """The policy file's ``signature``: what the policy answers. ``question`` None: any question
    asked over exactly these options (a policy tuned on a labelled CSV knows no question name)."""
    if not options:
        raise ValueError("a scope needs the option names the policy was tuned on")
    return SCOPE_PREFIX + canonical_hash({"options": sorted(options), "question": question})


def request_scopes(request: DecisionRequest) -> tuple[str, str]:
    """The two scope signatures that cover ``request``: its named question, then any question
    over its options. Memoised by the request's own (memoised) signature, which hashes its
    options, and its question id: the registry asks for every decision, and hashing 77 option
    names twice, or even building their tuple, would be a visible share of a cache hit's CPU."""
    key = (request.signature(), request.question_id)
    scopes = _SCOPES.get(key)
    if scopes is None:
        if len(_SCOPES) >= _SCOPES_MAX:  # distinct questions are few; a flood just starts over
            _SCOPES.clear()
        options = request.option_names
        scopes = _SCOPES[key] = (scope_signature(options, request.question_id),
                                 scope_signature(options))
    return scopes


_SCOPES: dict[tuple[str, str], tuple[str, str]] = {}
_SCOPES_MAX = 4096


def file_scope(signature: str | None, options: Sequence[str] | None) -> str | None:
    """The scope a loaded policy file answers, as the registry indexes it.

    A file tuned since scopes were recorded holds its scope signature. A file written before
    (signature null) is scoped by its recorded ``options``: any question over those names. A
    file whose signature is one logged request's hash keeps answering exactly that question. A
    file with neither signature nor options has no known scope: None, and the registry refuses
    it (re-tune it)."""
    if signature is not None:
        return signature
    if options:
        return scope_signature(options)
    return None


def describe(request: DecisionRequest) -> str:
    """The question as a person reads it in a note: its id and option count, a few names."""
    names = request.option_names
    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    return f"{request.question_id!r} over {len(names)} options ({shown})"
