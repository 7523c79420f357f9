"""Start-up checks and warm-up: what every decision needs is checked before the first request, so
a bad setting stops the server at once with a message naming it, instead of starting, saying
ready, and failing each decision (a 500, or a 400 that blames the client); and every fast tier
reads once before the replica says it is ready."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from policies.file import PolicyFile
from policies.types import DecisionRequest, Option
from router.backends.base import FastBackend
from router.errors import BackendError, ConfigError

log = logging.getLogger("slotgate")

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


WARM_UP_STATE = "warm-up read"
# How long start-up waits for the warm-up before it serves: a tier warm within it never shows a
# not-ready window; a slower one warms in the background while /readyz answers 503.
WARM_UP_GRACE_S = 1.0


def warm_up_request(policies: Sequence[PolicyFile]) -> DecisionRequest:
    """The request each tier reads once at start-up: the question and options of the first
    served policy that records them (a model trained for one question reads no other), else a
    yes/no placeholder."""
    for file in policies:
        if file.question is not None and file.options:
            question = file.question.question()
            return DecisionRequest(question.id, question.instructions,
                                   tuple(Option(name) for name in file.options), WARM_UP_STATE,
                                   context=question.context, kind=question.kind)
    return DecisionRequest("warm_up", "", (Option("yes"), Option("no")), WARM_UP_STATE)


class WarmUp:
    """Every configured fast tier's first read, made at start-up: a first read can take seconds
    (a model's lazy loads, a compiled kernel), and a replica is not ready (``/readyz``) until
    each tier has made one. A tier whose read fails counts as tried (the log says why); its own
    ``ready()`` reports whether it can serve."""

    def __init__(self, tiers: Mapping[str, FastBackend]) -> None:
        self._tiers = dict(tiers)
        self._pending = set(self._tiers)

    @property
    def pending(self) -> list[str]:
        """The tiers not read yet, in reading order."""
        return [name for name in self._tiers if name in self._pending]

    async def run(self, request: DecisionRequest) -> None:
        for name, backend in self._tiers.items():
            started = time.perf_counter()
            try:
                await backend.read([request])
            except BackendError as exc:  # tried: the tier's own ready() says whether it serves
                log.warning("warm-up: tier %r failed its first read (%s: %s)", name,
                            type(exc).__name__, exc)
            else:
                log.info("warm-up: tier %r read once in %.2f s", name,
                         time.perf_counter() - started)
            finally:
                self._pending.discard(name)
