"""What makes two decisions the same input for the watch: a fingerprint of the text read and the
options asked, with what templates vary (numbers, ids, timestamps, e-mail addresses, URLs,
names) folded to placeholders, so a templated message counts once however its ids change."""

from __future__ import annotations

import hashlib
import re

from policies.types import DecisionRequest

# Order matters: the wider forms first, so a URL's digits are not folded before the URL is.
_FOLDS = (
    (re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b"), " <email> "),
    (re.compile(r"\b(?:https?://|www\.)\S+", re.IGNORECASE), " <url> "),
    # UUIDs, hex digests and mixed letter-digit tokens (order numbers, ticket ids, card tails)
    (re.compile(r"\b(?=[\w-]*\d)[\w-]*[a-z][\w-]*\b", re.IGNORECASE), " <id> "),
    # times, dates, amounts, phone numbers: runs of digits with their separators
    (re.compile(r"[#+]?\d[\d.,:/-]*"), " <n> "),
    # a capitalised word after a lower-case word or a comma is a name (a sentence's first word,
    # and one after a full stop, are not folded)
    (re.compile(r"(?<=[a-z,] )[A-Z][a-z]+(?: [A-Z][a-z]+)*"), " <name> "),
)
_SPACES = re.compile(r"\s+")


def normalised(text: str) -> str:
    """``text`` with its templated parts folded to placeholders, lower-cased, spaces collapsed."""
    for pattern, placeholder in _FOLDS:
        text = pattern.sub(placeholder, text)
    return _SPACES.sub(" ", text).strip().lower()


def input_key(request: DecisionRequest) -> str:
    """The watch's dedupe key of a decision: the normalised text read and the options asked."""
    digest = hashlib.blake2b(digest_size=16)
    for part in (request.instructions, normalised(request.context), normalised(request.state),
                 request.kind, *request.option_names):
        digest.update(part.encode("utf-8", "surrogatepass"))
        digest.update(b"\x00")
    return digest.hexdigest()
