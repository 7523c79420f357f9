"""Start-up checks: what every decision needs is checked before the first request, so a bad
setting stops the server at once with a message naming it, instead of starting, saying ready,
and failing each decision (a 500, or a 400 that blames the client)."""

from __future__ import annotations

import os
from pathlib import Path

from router.errors import ConfigError

LOG_SETTING = "log.decision_log_path"


def check_decision_log(path: Path) -> None:
    """The decision log can be created and appended to (creating its folder, as the log would)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("ab"):
            pass
    except OSError as exc:
        raise ConfigError(f"{LOG_SETTING} {path}: cannot be written: {exc.strerror or exc}",
                          field=LOG_SETTING) from exc


def decision_log_writable(path: Path) -> bool:
    """For /readyz, without writing: the file (or, before the first decision, its folder) is
    writable by this process. A full disk or a file made read-only after start-up shows here."""
    if path.exists():
        return path.is_file() and os.access(path, os.W_OK)
    return path.parent.is_dir() and os.access(path.parent, os.W_OK)
