"""``slotgate migrate``: a policy file written by an earlier slotgate, made one this slotgate
serves, without re-tuning, when nothing but how it was recorded changed: its backend fingerprint
(text models were fingerprinted by their file's bytes, now by what they compute), its question
(files written before questions were recorded; the question is named here, as ``tune
--question`` names it) or its scope signature (question texts hashed as written, now in canonical
form). Each change is checked before it is made: the policy must have been tuned on this very
model file, and a named question must be one the old scope allows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from router.cli.common import (
    QuestionContext,
    QuestionId,
    QuestionKindFlag,
    QuestionText,
    check_out,
    fail,
    question_of,
)

if TYPE_CHECKING:
    from policies.scope import Question
    from router.backends.sklearn import TextModel


def migrate(
    policy: Annotated[Path, typer.Option(
        "--policy", help="The policy file to migrate (written by any earlier slotgate).")],
    model: Annotated[Path | None, typer.Option(
        "--model", help="The text model (joblib) the policy was tuned on: its fingerprint is "
                        "re-computed the current way once the file is shown to be that model's; "
                        "its recorded question names the policy's when --question does not.")] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", help="Where to write the migrated policy (default: over --policy).")] = None,
    question: QuestionId = None,
    instructions: QuestionText = "",
    context: QuestionContext = "",
    question_kind: QuestionKindFlag = "choice",
) -> None:
    """Re-sign an older policy file for this slotgate (fingerprint, question, scope), checking
    each change; exits 2, naming what to do instead, when the policy cannot be migrated."""
    from pydantic import ValidationError

    from policies.file import PolicyFile, first_error

    named = question_of(question, instructions=instructions, context=context, kind=question_kind)
    target = out or policy
    check_out(target, "--out")
    data = _read(policy)
    if data.get("cascade") is not None:
        fail(f"--policy: {policy} is a cascade policy: re-tune it (`slotgate tune` with its "
             "tiers' predictions); migrate re-signs one-tier policies")
    sealed, key = _sealed(data, policy)
    text_model = _load_model(model) if model is not None else None
    changes = [_fingerprint(data, text_model, policy)]
    changes.append(_scope(data, named or _model_question(text_model), policy,
                          sent=(instructions, context)))
    try:
        migrated = PolicyFile.model_validate({**data, "version": 4})
    except ValidationError as exc:
        field, message = first_error(exc)
        fail(f"--policy: {policy}: field {field!r}: {message}")
    done = [change for change in changes if change]
    if not done:
        typer.echo(f"{policy}: {migrated.policy_id}: nothing to migrate, it is current")
        return
    # Sealed as it was: a file tuning sealed is sealed again over what migrate changed (its seal
    # was checked first); one written before seals stays unsealed (migrate vouches for its
    # changes, not for the rest).
    (migrated.sealed(key) if sealed else migrated).write(target)
    typer.echo(f"{target}: {migrated.policy_id}: " + "; ".join(done))


def _sealed(data: dict[str, Any], path: Path) -> tuple[bool, bytes | None]:
    """Whether the file carries a seal (``digest``), and the signing key to seal it again with
    (``SLOTGATE_POLICY__SIGNING_KEY``, as ``tune`` signs; None: a digest only). A sealed file
    must be as tuning wrote it (``PolicyFile.integrity_problem``) before anything is changed."""
    from pydantic import ValidationError

    from policies.file import PolicyFile, first_error
    from router.cli.policy import signing_key_of_environment

    if data.get("digest") is None:
        return False, None
    key = signing_key_of_environment() if data.get("hmac") is not None else None
    if data.get("hmac") is not None and key is None:
        fail(f"--policy: {path} is signed (field 'hmac'): set SLOTGATE_POLICY__SIGNING_KEY to the "
             "server's policy.signing_key to sign it again")
    try:
        before = PolicyFile.model_validate(data, context={"scope_unchecked": True})
    except ValidationError as exc:
        field, message = first_error(exc)
        fail(f"--policy: {path}: field {field!r}: {message}")
    problem = before.integrity_problem(key)
    if problem is not None:
        fail(f"--policy: {path}: field 'digest': {problem}; re-tune it (`slotgate tune`)")
    return True, key


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        fail(f"--policy: {path}: not a readable JSON file: {exc}")
    if not isinstance(data, dict) or data.get("format") != "slotgate/policy":
        fail(f"--policy: {path}: not a slotgate policy file (field 'format')")
    return data


def _load_model(path: Path) -> TextModel:
    from router.backends.sklearn import load_text_model
    from router.errors import ConfigError

    try:
        return load_text_model(path)
    except ConfigError as exc:
        fail(f"--model: {exc.message}")


def _model_question(model: TextModel | None) -> Question | None:
    return None if model is None else model.question


def _fingerprint(data: dict[str, Any], model: TextModel | None, path: Path) -> str:
    """Re-sign the backend fingerprint when the file's is ``model``'s under the scheme that
    fingerprinted a text model by its file's sha256; "" when nothing changed."""
    import hashlib

    from router.backends.base import fingerprint_of
    from router.backends.sklearn import SklearnBackend

    if model is None:
        return ""
    current = SklearnBackend(model=model).fingerprint
    recorded = data.get("backend_fingerprint")
    if recorded == current:
        return ""
    by_bytes = fingerprint_of({"backend": "sklearn", "kind": model.kind, "model_sha256":
                               hashlib.sha256(model.path.read_bytes()).hexdigest()})
    if recorded != by_bytes:
        fail(f"--model: {path} was tuned for backend fingerprint {recorded}, which is not "
             f"{model.path}'s (now {current}, by its file's bytes {by_bytes}): it was tuned on "
             "another model; re-tune it on this model's predictions (`slotgate predict`, then "
             "`slotgate tune`)")
    data["backend_fingerprint"] = current
    return f"backend fingerprint {recorded} -> {current} (the same model file)"


def _scope(data: dict[str, Any], named: Question | None, path: Path, *,
           sent: tuple[str, str] = ("", "")) -> str:
    """Record the question and re-sign the scope, when the file's scope is an older form of it
    (or one logged request's exact signature, when a question is named for it: ``sent`` is its
    instructions and context as the flags give them, as a client sent them); "" when there is
    nothing to do."""
    from policies.scope import SCOPE_PREFIX, UNRECORDED_PREFIX, scope_signature

    options, signature, recorded = data.get("options"), data.get("signature"), data.get("question")
    if recorded is not None:
        question, before = _recorded(recorded, options, signature, named, path), "hashed as written"
    elif signature is None or signature.startswith(UNRECORDED_PREFIX):
        question, before = _unrecorded(options, signature, named, path), "unrecorded"
    elif named is not None and not signature.startswith(SCOPE_PREFIX):
        question = _logged(options, signature, named, path, sent=sent)
        before = "one logged option order"
    else:
        return ""  # one logged request's exact signature, served as it is
    if question is None:
        return ""
    data.update(question=question.as_dict(), signature=scope_signature(options or [], question))
    return f"question {question.describe()} ({before} -> {data['signature'][:21]}...)"


def _recorded(recorded: dict[str, Any], options: list[str] | None, signature: str | None,
              named: Question | None, path: Path) -> Question | None:
    """The recorded question when the file hashed its texts as written; None when current (or
    refused on load with its own reason: a hand-edited question is not re-signed)."""
    from policies.scope import scope_signature, verbatim_signature

    question = _as_question(recorded)
    if named is not None and named != question:
        fail(f"--question: {path} records the question {question.describe()}; it answers no "
             f"other (named: {named.describe()})")
    if not options or signature == scope_signature(options, question):
        return None
    return question if signature == verbatim_signature(options, recorded) else None


def _unrecorded(options: list[str] | None, signature: str | None, named: Question | None,
                path: Path) -> Question:
    """The named question for a file written before questions were recorded, checked against
    its ``scope-v1`` signature (an option set, and the id when the rows named one)."""
    from policies.scope import unrecorded_signature

    if not options:
        fail(f"--policy: {path} records neither its question nor its options: re-tune it")
    question = _named(named, path)
    allowed = {unrecorded_signature(options, None), unrecorded_signature(options, question.id)}
    if signature is not None and signature not in allowed:
        fail(f"--question: {path} was tuned on a question other than {question.id!r} over its "
             "options (its scope-v1 signature says so); name that question")
    return question


def _logged(options: list[str] | None, signature: str, named: Question, path: Path, *,
            sent: tuple[str, str]) -> Question:
    """The named question for a policy tuned on rows exported from the decision log, whose
    signature is one logged request's (its options in that order): checked by asking the named
    question over the recorded options, in their order, as the wire builds it."""
    from policies.types import DecisionRequest, Option

    ordered = tuple(Option(name) for name in options or ())
    instructions, context = sent
    # A question with no text is read as its id on a schema, as "" on a choice list.
    texts = {instructions, instructions or named.id}
    if not any(DecisionRequest(named.id, text, ordered, "", context=context, kind=named.kind)
               .signature() == signature for text in texts):
        fail(f"--question: {path} was tuned on one logged question, and {named.describe()} over "
             f"its {len(ordered)} options in their logged order is not it (the --context and "
             "--instructions must be as the client sent them); name that question")
    return named


def _named(named: Question | None, path: Path) -> Question:
    if named is None:
        fail(f"--question: {path} was written before questions were recorded: name the "
             "question it was tuned for (--question, and --instructions, --context, "
             "--question-kind where it has them; docs/calibration.md, \"Scope\"), or pass the "
             "--model it was tuned on when that model records it")
    return named


def _as_question(recorded: dict[str, Any]) -> Question:
    from policies.scope import Question

    return Question.asked(recorded["id"], instructions=recorded.get("instructions", ""),
                          context=recorded.get("context", ""), kind=recorded.get("kind", "choice"))
