"""What makes two decisions the same input for the watch, for labels and for drift alike: a
fingerprint of the text read and the options asked, with case, whitespace and punctuation
dropped and what templates vary (numbers, ids, timestamps, e-mail addresses, URLs, names)
folded to placeholders, so a message counts once however its ids, its "!" or its spacing
change."""

from __future__ import annotations

import hashlib
import re

from policies.types import DecisionRequest

_EMAIL = re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b")
_URL = re.compile(r"\b(?:https?://|www\.)\S+", re.IGNORECASE)
# UUIDs, hex digests and mixed letter-digit tokens (order numbers, ticket ids, card tails)
_ID = re.compile(r"\b(?=[\w-]*\d)[\w-]*[a-z][\w-]*\b", re.IGNORECASE)
# times, dates, amounts, phone numbers: runs of digits with their separators
_NUMBER = re.compile(r"[#+]?\d[\d.,:/-]*")
_DIGIT = re.compile(r"\d")
# a capitalised word after a lower-case word or a comma is a name (a sentence's first word,
# and one after a full stop, are not folded)
_NAME = re.compile(r"(?<=[a-z,] )[A-Z][a-z]+(?: [A-Z][a-z]+)*")
_SPACES = re.compile(r"\s+")
# punctuation and symbols ("!", "?", "...", quotes, emoji): what a copy varies to pass as new;
# the placeholders' own brackets are kept
_PUNCTUATION = re.compile(r"[^\w\s<>]+")


def normalised(text: str) -> str:
    """``text`` with its templated parts folded to placeholders, lower-cased, spaces collapsed.
    The wider forms go first, so a URL's digits are not folded before the URL is; a fold whose
    mark (an "@", a scheme, a digit) the text lacks is skipped, which keeps the common message
    to a few microseconds."""
    if "@" in text:
        text = _EMAIL.sub(" <email> ", text)
    lowered = text.lower()
    if "http" in lowered or "www." in lowered:
        text = _URL.sub(" <url> ", text)
    if _DIGIT.search(text):
        text = _NUMBER.sub(" <n> ", _ID.sub(" <id> ", text))
    text = _PUNCTUATION.sub(" ", _NAME.sub(" <name> ", text))
    return _SPACES.sub(" ", text).strip().lower()


def input_key(request: DecisionRequest) -> str:
    """The watch's dedupe key of a decision: the normalised text read and the options asked."""
    parts = (request.instructions, normalised(request.context), normalised(request.state),
             request.kind, *request.option_names)
    return hashlib.blake2b("\x00".join(parts).encode("utf-8", "surrogatepass"),
                           digest_size=16).hexdigest()
