"""Prompts for in-process torch reads, as token ids split where the state begins.

The static part (context, question, labelled options, the chat template up to the user turn)
comes first and is tokenized on its own, so its ids are identical for every state and its KV
cache can be reused; the state and the answer tail follow. Diffusion reads also get a canvas.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from policies.types import DecisionRequest

TEMPLATE_VERSION = "slotgate-torch-v1"  # bump whenever a prompt or canvas layout changes
DEFAULT_PREAMBLE = (
    "Answer one question about the message in the user turn. "
    "Reply with the label of exactly one option."
)
_STATE_MARK = "\u0000SLOTGATE-STATE\u0000"


@dataclass(frozen=True, slots=True)
class PromptIds:
    prefix_ids: tuple[int, ...]  # static: the same for every state of one question
    suffix_ids: tuple[int, ...]  # the state and the answer tail


def static_text(request: DecisionRequest, labels: tuple[str, ...], *, preamble: str) -> str:
    """Context, preamble, question and one ``  label: name (description)`` line per option."""
    lines = [request.context.strip(), ""] if request.context.strip() else []
    lines += [preamble, f"Question {request.question_id}: {request.instructions}".rstrip()]
    for label, option in zip(labels, request.options):
        detail = f" ({option.description})" if option.description else ""
        shown = label.strip()
        lines.append(f"  {shown}{detail}" if shown == option.name else f"  {shown}: {option.name}{detail}")
    return "\n".join(lines)


def chat_halves(tokenizer: Any, system: str, **template_kwargs: Any) -> tuple[str, str] | None:
    """The chat template's text before and after the user's content, with the generation
    prompt; None when the tokenizer has no chat template."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    text = tokenizer.apply_chat_template(
        [{"role": "system", "content": system}, {"role": "user", "content": _STATE_MARK}],
        tokenize=False, add_generation_prompt=True, **template_kwargs,
    )
    before, _, after = str(text).partition(_STATE_MARK)
    return before, after


def encode(tokenizer: Any, text: str) -> tuple[int, ...]:
    return tuple(tokenizer.encode(text, add_special_tokens=False)) if text else ()


def encode_many(tokenizer: Any, texts: list[str]) -> list[tuple[int, ...]]:
    """``encode`` of each text; a fast (Rust) tokenizer takes them in one batched call, which
    runs in parallel and releases the GIL. The ids are the same as one at a time."""
    filled = [t for t in texts if t]
    if len(filled) < 2 or not getattr(tokenizer, "is_fast", False):
        return [encode(tokenizer, t) for t in texts]
    batch = iter(tokenizer(filled, add_special_tokens=False)["input_ids"])
    return [tuple(next(batch)) if t else () for t in texts]


def chat_static(
    tokenizer: Any, request: DecisionRequest, labels: tuple[str, ...], *, preamble: str,
    **template_kwargs: Any,
) -> tuple[tuple[int, ...], str]:
    """(prefix ids, text after the state): system turn = static text, user turn = state."""
    system = static_text(request, labels, preamble=preamble)
    halves = chat_halves(tokenizer, system, **template_kwargs)
    before, after = halves if halves is not None else (system + "\n\nMessage:\n", "\n\n")
    return encode(tokenizer, before), after


def masked_prompt(
    tokenizer: Any, request: DecisionRequest, labels: tuple[str, ...], *, preamble: str,
    answer_prefix: str, max_tokens: int,
) -> PromptIds:
    """``[CLS] static Message: state answer_prefix [MASK] . [SEP]``; the state is cut from its
    end when the whole would exceed ``max_tokens`` (a masked LM has a fixed position budget)."""
    system = static_text(request, labels, preamble=preamble)
    prefix = (tokenizer.cls_token_id, *encode(tokenizer, system + "\nMessage:"))
    tail = (*encode(tokenizer, answer_prefix), tokenizer.mask_token_id, *encode(tokenizer, "."),
            tokenizer.sep_token_id)
    room = max_tokens - len(prefix) - len(tail)
    if room < 1:
        raise ValueError(
            f"the question and its {len(request.options)} options take {len(prefix) + len(tail)} "
            f"tokens, over this model's {max_tokens}")
    state = encode(tokenizer, request.state)[:room]
    return PromptIds(prefix_ids=prefix, suffix_ids=state + tail)


@dataclass(frozen=True, slots=True)
class Canvas:
    ids: tuple[int, ...]
    slot: int


def answer_canvas(
    tokenizer: Any, question_id: str, *, thought_block: str, turn_close_id: int, pad_id: int,
    canvas_length: int, canvas_step: int, first_label_id: int,
) -> Canvas:
    """System One's canvas: empty thought block, ``id:`` then the slot (seeded with the first
    label; the reader noises it), turn close, pad up to the smallest multiple of ``canvas_step``
    holding template + 1, capped at ``canvas_length``."""
    template = [*encode(tokenizer, thought_block + f"{question_id}:"), first_label_id]
    slot = len(template) - 1
    needed = len(template) + 1
    width = min(canvas_length, -(-needed // canvas_step) * canvas_step)
    if needed > width:
        raise ValueError(f"the answer template needs {needed} canvas positions, over {width}")
    ids = template + [turn_close_id] + [pad_id] * (width - needed)
    return Canvas(tuple(ids), slot)
