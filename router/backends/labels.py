"""Single-token option labels for slot reads: every option is shown to the model with a label
that the tokenizer encodes as exactly one token, all ids distinct, so one slot reads them all.

A label alphabet the operator names is checked strictly (ConfigError naming the bad label). The
default alphabet is the candidates below, keeping those that pass, in order.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from router.errors import ConfigError


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def __len__(self) -> int: ...


def default_candidates() -> list[str]:
    """A-Z, a-z, 0-9, then two capital letters (AA..ZZ): short, unambiguous, mostly one token."""
    letters = list(string.ascii_uppercase) + list(string.ascii_lowercase) + list(string.digits)
    pairs = [a + b for a in string.ascii_uppercase for b in string.ascii_uppercase]
    return letters + pairs


@dataclass(frozen=True, slots=True)
class LabelAlphabet:
    labels: tuple[str, ...]
    ids: tuple[int, ...]  # ids[i] is the one token of labels[i]

    def __len__(self) -> int:
        return len(self.labels)


def single_token_id(tokenizer: Tokenizer, label: str) -> int | None:
    ids = tokenizer.encode(label, add_special_tokens=False)
    return ids[0] if len(ids) == 1 else None


def check_alphabet(tokenizer: Tokenizer, labels: Sequence[str]) -> LabelAlphabet:
    """The operator's alphabet, or ConfigError naming the first label that is not one distinct token."""
    seen: dict[int, str] = {}
    for label in labels:
        token = single_token_id(tokenizer, label)
        if token is None:
            raise ConfigError(f"label {label!r} is not a single token for this tokenizer")
        if token in seen:
            raise ConfigError(f"labels {seen[token]!r} and {label!r} tokenize to the same id {token}")
        seen[token] = label
    if len(seen) < 2:
        raise ConfigError("a label alphabet needs at least two labels")
    return LabelAlphabet(tuple(seen.values()), tuple(seen))


def build_alphabet(tokenizer: Tokenizer, *, limit: int,
                   candidates: Sequence[str] | None = None) -> LabelAlphabet:
    """The first ``limit`` candidates that are single, distinct tokens."""
    labels: list[str] = []
    ids: list[int] = []
    for label in candidates or default_candidates():
        token = single_token_id(tokenizer, label)
        if token is not None and token not in ids:
            labels.append(label)
            ids.append(token)
            if len(labels) == limit:
                break
    if len(labels) < 2:
        raise ConfigError("fewer than two default labels are single tokens for this tokenizer")
    return LabelAlphabet(tuple(labels), tuple(ids))


def load_tokenizer(path: Path | str) -> Any:
    """A tokenizer from a LOCAL folder (no hub downloads); ConfigError when it cannot load."""
    from transformers import AutoTokenizer

    folder = Path(path)
    if not folder.exists():
        raise ConfigError(f"tokenizer path {folder} does not exist")
    try:
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load a tokenizer from {folder}: {exc}") from exc
