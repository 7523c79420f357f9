"""The vLLM example server's prompt and answer template for one question (protocol notes, section
4), so that a direct vLLM read sees the words, labels and slot the server would send and a policy
tuned through one path holds through the other. Written from the protocol, not copied.

The answer template is ``thought block + "{id}: {label}"``. A label's token id is the one it takes
AT THE SLOT: tokenize the template once per label and take the one position where they differ
(with a BPE tokenizer ``"bucket: A"`` ends in the id of ``" A"``, not of ``"A"``).
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass

from policies.types import DecisionRequest
from router.backends.labels import Tokenizer
from router.errors import UnprocessableRequest

TEMPLATE_VERSION = "example-server-lines-v1"  # bump whenever the words or the canvas layout change
HEAD = (
    "Answer a fixed set of questions about the state the user provides. "
    "Each question lists its allowed answers; reply with exactly one label per question.\n"
)
REPLY = 'Reply with one line per question, in this order, formatted as "id: label".'
SERVER_CHOICE_LABELS = tuple(string.ascii_uppercase)  # the server's 26
YES_NAMES = frozenset({"yes", "true"})


def choice_alphabet() -> tuple[str, ...]:
    """A-Z as the server labels choices, then slotgate's lift past 26: a-z, 0-9, AA..ZZ."""
    pairs = [a + b for a in string.ascii_uppercase for b in string.ascii_uppercase]
    return (*SERVER_CHOICE_LABELS, *string.ascii_lowercase, *string.digits, *pairs)


def noul_order(request: DecisionRequest) -> tuple[int, int]:
    """Index of the 'yes' option and of the 'no' option: the one named yes/true, else the first."""
    yes = next((i for i, o in enumerate(request.options) if o.name.lower() in YES_NAMES), 0)
    return yes, 1 - yes


def labels_for(request: DecisionRequest, alphabet: Sequence[str]) -> tuple[str, ...]:
    """The label of each option, in the request's order, as the server assigns them."""
    n = len(request.options)
    if request.kind == "noul":
        yes, _ = noul_order(request)
        return ("yes", "no") if yes == 0 else ("no", "yes")
    if request.kind == "score" and n <= 9:
        return tuple(str(i + 1) for i in range(n))
    return tuple(alphabet[:n])


def system_text(request: DecisionRequest, labels: Sequence[str]) -> str:
    """The system turn for one question (the server's "lines" format)."""
    text = HEAD
    if request.context.strip():
        text += "\n" + request.context.strip() + "\n"
    text += f"\nQuestion {request.question_id}: {request.instructions.strip()}\n"
    lines = list(zip(labels, request.options))
    if request.kind == "noul":  # the server lists yes before no, with the criteria as descriptions
        lines.sort(key=lambda pair: pair[0] != "yes")
    for label, option in lines:
        description = (option.description or "").strip()
        if request.kind == "noul":
            text += f"  {label}: {description}\n" if description else f"  {label}\n"
        elif description:
            text += f"  {label}: {option.name} ({description})\n"
        else:
            text += f"  {label}: {option.name}\n"
    return text + "\n" + REPLY


@dataclass(frozen=True, slots=True)
class AnswerTemplate:
    """Token ids of the answer template (slot holding the first label), the slot's position and
    each label's id at the slot."""

    ids: tuple[int, ...]
    slot: int
    label_ids: tuple[int, ...]


def resolve(tokenizer: Tokenizer, thought_block: str, question_id: str, labels: Sequence[str], *,
            canvas_length: int) -> AnswerTemplate:
    """The template for ``question_id`` answered with each of ``labels``; UnprocessableRequest
    when it does not fit the canvas or the labels do not share one single-token slot."""
    head = list(tokenizer.encode(thought_block, add_special_tokens=False))
    encoded = [head + list(tokenizer.encode(f"{question_id}: {label}", add_special_tokens=False))
               for label in labels]
    base = encoded[0]
    if len(base) + 1 > canvas_length:
        raise UnprocessableRequest(
            f"answer template is {len(base)} tokens; the canvas holds {canvas_length - 1}",
            field="questions")
    slot: int | None = None
    for label, ids in zip(labels[1:], encoded[1:]):
        if len(ids) != len(base):
            raise UnprocessableRequest(
                f"question {question_id!r}: label {label!r} is not a single token")
        diffs = [i for i, (a, b) in enumerate(zip(base, ids)) if a != b]
        if len(diffs) != 1 or (slot is not None and diffs[0] != slot):
            raise UnprocessableRequest(f"question {question_id!r}: labels do not share one slot")
        slot = diffs[0]
    if slot is None:
        raise UnprocessableRequest(f"question {question_id!r}: needs at least two labels")
    label_ids = tuple(ids[slot] for ids in encoded)
    if len(set(label_ids)) != len(label_ids):
        raise UnprocessableRequest(f"question {question_id!r}: two labels tokenize to the same id")
    return AnswerTemplate(tuple(base), slot, label_ids)
