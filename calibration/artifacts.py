"""Versioned JSON artifacts: ``{"format": "slotgate/<kind>", "version": 1, ...payload}``, written
atomically, read back only when format and version match what this code understands."""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ARTIFACT_VERSION = 1
RESERVED_KEYS = ("format", "version")


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path beside ``path`` for the block to write; renamed onto ``path`` when the
    block succeeds (one ``os.replace``: a reader sees the old file or the new one, never half of
    one), removed when it fails. The one atomic versioned-file write of every artifact."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = _new_file_beside(target)
    try:
        yield temporary
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


def _new_file_beside(target: Path) -> Path:
    """A new empty file in ``target``'s folder, made with the mode any new file gets (0666 less
    the umask): a server running as another user must be able to read what tuning wrote, and
    ``tempfile.mkstemp`` makes its files 0600."""
    while True:
        temporary = target.parent / f".{target.name}.{secrets.token_hex(4)}.tmp"
        try:
            os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:  # another writer's temporary: draw another name
            continue
        return temporary


def write_json_artifact(path: str | os.PathLike[str], kind: str, payload: dict[str, Any]) -> Path:
    """Write ``payload`` under a ``slotgate/<kind>`` header; a reader never sees a half file."""
    clash = [key for key in RESERVED_KEYS if key in payload]
    if clash:
        raise ValueError(f"payload must not contain the header keys {clash}")
    document = {"format": f"slotgate/{kind}", "version": ARTIFACT_VERSION, **payload}
    text = json.dumps(document, indent=2, sort_keys=False, allow_nan=False) + "\n"
    with atomic_path(path) as temporary:
        temporary.write_text(text, encoding="utf-8")
    return Path(path)


def read_json_artifact(path: str | os.PathLike[str], kind: str) -> dict[str, Any]:
    """The payload of a ``slotgate/<kind>`` artifact (header removed); ValueError naming the
    file when it is not JSON, is another kind, or has a version this code does not read."""
    source = Path(path)
    try:
        document = json.loads(source.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{source}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    if not isinstance(document, dict):  # bad file content, like any other: ValueError
        raise ValueError(  # noqa: TRY004
            f"{source}: expected a JSON object, got {type(document).__name__}")
    expected = f"slotgate/{kind}"
    if document.get("format") != expected:
        raise ValueError(f"{source}: format is {document.get('format')!r}, expected {expected!r}")
    if document.get("version") != ARTIFACT_VERSION:
        raise ValueError(
            f"{source}: {expected} version {document.get('version')!r} is not supported "
            f"(this slotgate reads version {ARTIFACT_VERSION}); re-create the artifact"
        )
    return {key: value for key, value in document.items() if key not in RESERVED_KEYS}
