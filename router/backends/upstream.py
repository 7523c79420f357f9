"""What a remote fast tier's server says of itself (``GET /v1/models``): part of the tier's
fingerprint, so a server now serving another model (another weights path, base model or context
length under the same name) is another tier, whose cached reads and tuned policies do not carry
over. A server with no such route (404) says nothing, and the fingerprint is the config's alone."""

from __future__ import annotations

import logging
from typing import Any

from router.backends.http_post import JsonPoster
from router.errors import BackendError, BackendUnavailable

log = logging.getLogger("slotgate")

# The fields of vLLM's ModelCard (vllm/entrypoints/openai/protocol.py) that say which model it
# serves; ``created`` is the time of the request and ``permission`` per-request ids: left out.
VLLM_CARD_FIELDS = ("id", "root", "parent", "max_model_len")
# OpenJev's {"models": [{name, description, release_date}]}
OPENJEV_FIELDS = ("name", "release_date")


async def self_report(poster: JsonPoster, model: str) -> dict[str, Any] | None:
    """The server's own account of the model it serves under ``model`` (None: no
    ``/v1/models``, or an answer in neither shape, with a WARNING). A list that does not name ``model`` is kept whole, so any change to what
    the server serves changes the report."""
    payload = await poster.get_json("/v1/models")
    if payload is None:
        return None
    for key, name, fields in (("data", "id", VLLM_CARD_FIELDS),
                              ("models", "name", OPENJEV_FIELDS)):
        cards = payload.get(key)
        if isinstance(cards, list) and all(isinstance(c, dict) for c in cards):
            reported = [{f: c.get(f) for f in fields} for c in cards]
            mine = [c for c in reported if c[name] == model]
            if len(mine) == 1:
                return mine[0]
            return {"models": sorted(reported, key=repr)}
    log.warning("GET /v1/models answered neither a vLLM model list (data) nor an OpenJev one "
                "(models), so the fingerprint holds the config alone: %s", str(payload)[:200])
    return None


def upstream_identity(watch: UpstreamWatch) -> dict[str, Any]:
    """The fingerprint's part of a learnt report: ``{"upstream": report}``, or nothing while
    none was learnt (a server without ``/v1/models``, or not asked)."""
    return {} if watch.report is None else {"upstream": watch.report}


class UpstreamWatch:
    """A remote tier's self-report: learnt once (``learn``, before the fingerprint is used) and
    checked again by each readiness probe (``still_same``); once it differs every read fails
    (``ensure``) until a restart checks the policies against the new model. A server that cannot
    be asked at start-up (``learn(strict=False)``: down, or failing) is asked again before each
    read, whose error its failure is (decisions escalate, as in any fast-tier outage): a server
    with no ``/v1/models`` is read then; a report learnt late was not checked against the
    policies, so it too fails every read until a restart."""

    def __init__(self, poster: JsonPoster, model: str, what: str) -> None:
        self._poster, self._model, self._what = poster, model, what
        self.report: dict[str, Any] | None = None
        self.changed: dict[str, Any] | None = None  # what it reports now, when it differs
        self.unknown: str | None = None  # why the start-up could not ask (asked again)

    async def learn(self, *, strict: bool = True) -> None:
        try:
            self.report = await self_report(self._poster, self._model)
        except BackendError as exc:
            if strict:
                raise
            self.unknown = str(exc)
            log.error("%s cannot say which model it serves (GET /v1/models: %s): it is asked "
                      "again before each read, and its decisions escalate until it answers",
                      self._what, exc)

    async def ensure(self) -> None:
        """Before a read: while what the server serves is not known, ask (its failure is the
        read's); raise ``BackendUnavailable`` once it reported another model."""
        if self.unknown is not None:
            self._compare(await self_report(self._poster, self._model))
        self.check()

    async def still_same(self) -> bool:
        """False (and logged once) when the server now reports another model than it did."""
        if self.changed is not None:
            return False
        try:
            now = await self_report(self._poster, self._model)
        except BackendError:
            return self.unknown is None  # unreachable or garbled now: the reads will say so
        self._compare(now)
        return self.changed is None

    def _compare(self, now: dict[str, Any] | None) -> None:
        self.unknown = None
        if now != self.report:
            self.changed = now if now is not None else {}
            log.error("%s now reports %s, not %s as at start-up: it is another tier, whose reads "
                      "fail until slotgate restarts and checks the policies against it",
                      self._what, now, self.report)

    def check(self) -> None:
        """Raise ``BackendUnavailable`` once the server reported another model."""
        if self.changed is not None:
            raise BackendUnavailable(
                f"{self._what} now serves {self.changed}, not {self.report} as at start-up: "
                "restart slotgate so that its policies are checked against the new model")
