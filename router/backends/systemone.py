"""Fast backend that asks a System One server (the vLLM example server, OpenJev, hosted Jev) and
reads the probabilities it returns.

The questions of one stage (one ``read`` call) about one state go upstream in ONE body by default,
as a client calling the server directly sends them: the example server reads a body jointly (one
canvas; joint slots copy letters, protocol notes section 7), so per-question requests would give
other probabilities than the server gives its own clients. ``joint: false`` asks one question per
request. Choices past the server's cap, and scores past its level cap (read as choices over the
levels), are read by ``grouping.grouped_read``, each in requests of their own.

A body of several stages (``depends_on``/``ask_if``) goes upstream whole (``read_staged``, option
``stages: "server"``, the example dialect's default): the server lists every question in each
stage's prompt and continues each later stage from the answers it gave (its "prefill"), so only
the whole body gets the probabilities its own clients get. ``stages: "router"`` (and a body with a
question past the caps) leaves the stages to the router, one body per stage.

A 422 from the server refuses what the caller sent (an id whose answer template does not fit the
canvas...): it becomes ``UnprocessableRequest``, the caller's error, never an escalation.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from policies.types import DecisionRequest, OptionScores, StagedQuestion
from router.backends.base import FastBackend
from router.backends.example_template import noul_order
from router.backends.grouping import grouped_read
from router.backends.http_post import JsonPoster
from router.backends.knobs import systemone_knobs
from router.backends.options import SystemOneOptions
from router.backends.spans import (
    SpanAnswer,
    SpanQuestion,
    SpanState,
    parse_server_answer,
    ungrounded,
)
from router.backends.upstream import UpstreamWatch, upstream_identity
from router.errors import BackendMalformed, BackendRejected, ConfigError
from router.settings import FastBackendSettings

MAX_QUESTIONS = 64  # the example server's per-body cap
# Engine knobs of one question (``SystemOneKnobs.engine``), sent on it rather than on the body.
# A question read alone also differs in ``engine`` from the others, so it is never grouped with
# them into one body when the router runs the stages: as on the server, it is read on its own.
QUESTION_KNOBS = frozenset({"alone"})
AUTH_FAILURES = frozenset({401, 403})
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DialectLimits:
    """What each server family accepts in one question (protocol notes, section 8)."""

    model: str
    max_choice_options: int
    max_score_levels: int
    has_health: bool


DIALECTS: Mapping[str, DialectLimits] = {
    "example": DialectLimits("dgemma", 26, 26, True),  # the example server ignores `model`
    "openjev": DialectLimits("openjev-latest", 128, 10, True),
    "jev": DialectLimits("jev-latest", 255, 10, False),
}


def question_id(request: DecisionRequest) -> str:
    """The id as the example server accepts it (prompt text: no ':' or newline, non-empty) and
    answers it (trimmed)."""
    qid = request.question_id.replace(":", "_").replace("\n", " ").replace("\r", " ").strip()
    return qid or "q"


def wire_ids(requests: Sequence[DecisionRequest]) -> list[str]:
    """Distinct acceptable ids for the questions of one body (cleaning may make two ids equal)."""
    ids: list[str] = []
    for request in requests:
        qid, k = question_id(request), 2
        while qid in ids:
            qid, k = f"{question_id(request)}_{k}", k + 1
        ids.append(qid)
    return ids


class SystemOneBackend(FastBackend):
    """Reads decisions from ``POST {url}/v1/systemone``; ``options`` (``SystemOneOptions``) say how."""

    name = "systemone"

    def __init__(
        self,
        url: str,
        options: SystemOneOptions | None = None,
        *,
        api_key: str | None = None,
        timeout_s: float = 10.0,
        max_concurrency: int = 8,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.options = options = options or SystemOneOptions()
        limits = DIALECTS[options.dialect]
        self.dialect = options.dialect
        # OpenJev and Jev answer no spans and take no images.
        self.reads_spans = self.reads_images = options.dialect == "example"
        self.model = options.model or limits.model
        self.max_options = options.max_options or limits.max_choice_options
        self.max_score_levels = limits.max_score_levels
        self._has_health = limits.has_health
        self._key_ok: bool | None = None  # checked once, by the first readiness probe
        self._poster = JsonPoster(
            base_url=url, api_key=api_key, timeout_s=timeout_s, max_concurrency=max_concurrency,
            retries_5xx=options.retries_5xx, max_retry_wait_s=options.max_retry_wait_s,
            transport=transport, what=f"System One server ({options.dialect})",
            caller_statuses=frozenset({422}),
        )
        self._upstream = UpstreamWatch(self._poster, self.model, f"the System One server at {url}")

    @classmethod
    def from_settings(cls, settings: FastBackendSettings) -> SystemOneBackend:
        """Built from ``fast.url``, ``fast.api_key``, ``fast.timeout_s``, ``fast.max_concurrency``
        and ``fast.options`` (``SystemOneOptions``)."""
        if not settings.url:
            raise ConfigError("the systemone backend needs fast.url", field="fast.url")
        return cls(
            settings.url, settings.options_as(SystemOneOptions),
            api_key=settings.api_key.get_secret_value() if settings.api_key else None,
            timeout_s=settings.timeout_s, max_concurrency=settings.max_concurrency,
        )

    def identity(self) -> Mapping[str, Any]:
        o = self.options
        return {
            "backend": self.name,
            "dialect": self.dialect,
            "model": self.model,
            "server_revision": o.server_revision,
            "max_options": self.max_options,
            "grouping": o.grouping,
            "group_size": o.group_size,
            "samples": o.samples,
            "joint": o.joint,
            "stages": "server" if o.server_runs_stages else "router",
            "engine": [o.steps, o.think, o.chunk_rows, o.chunk_prompt],
        } | {flag: True for flag in ("constrained", "engine_samples") if getattr(o, flag)
             } | upstream_identity(self._upstream)

    @property
    def reads_jointly(self) -> bool:
        return self.options.joint

    def read_inputs(
        self, request: DecisionRequest, batch: Sequence[DecisionRequest]
    ) -> Mapping[str, Any]:
        # The id is prompt text upstream; a joint read's answer also depends on its co-questions.
        knobs = systemone_knobs(request)
        inputs = {**super().read_inputs(request, batch), "question_id": question_id(request),
                  "samples_auto": knobs.samples_auto, "engine": list(knobs.engine)}
        for group in self._joint_groups(batch):
            if len(group) > 1 and any(batch[i] == request for i in group):
                inputs["joint"] = [[question_id(batch[i]), batch[i].signature()] for i in group]
        return inputs

    def _alone(self, request: DecisionRequest) -> bool:
        """Read in requests of its own: one option, or past the caps (a grouped read)."""
        n = len(request.options)
        return n == 1 or n > (self.max_score_levels if request.kind == "score" else
                              self.max_options if request.kind == "choice" else 2)

    def _joint_groups(self, batch: Sequence[DecisionRequest]) -> list[list[int]]:
        """Indices of the requests read together: same state, context, draws and seed, in
        order, at most the server's questions per body."""
        if not self.options.joint:
            return []
        by_key: dict[tuple[Any, ...], list[int]] = {}
        for i, r in enumerate(batch):
            if not self._alone(r):
                key = (r.state, r.images, r.context, r.samples, r.seed, systemone_knobs(r))
                by_key.setdefault(key, []).append(i)
        return [idx[k:k + MAX_QUESTIONS] for idx in by_key.values()
                for k in range(0, len(idx), MAX_QUESTIONS)]

    def reads_staged(self, questions: Sequence[StagedQuestion]) -> bool:
        """A body with dependencies, read jointly by a server that runs stages, none of whose
        questions needs reads of its own (grouped past the caps, or a single option)."""
        o = self.options
        return (o.joint and o.server_runs_stages and 1 < len(questions) <= MAX_QUESTIONS
                and any(q.depends_on or q.ask_if for q in questions)
                and not any(self._alone(q.request) or
                            (q.request.kind == "noul" and len(q.request.options) != 2)
                            for q in questions))

    async def read_staged(
        self, questions: Sequence[StagedQuestion]
    ) -> list[OptionScores | None]:
        await self._upstream.ensure()
        requests = [q.request for q in questions]
        ids = wire_ids(requests)
        wire = dict(zip((r.question_id for r in requests), ids))
        by_id = {r.question_id: r for r in requests}
        body = self.build_body(requests, ids)
        for question, qid in zip(questions, ids):
            if question.depends_on:
                body["questions"][qid]["depends_on"] = [wire[d] for d in question.depends_on]
            if question.ask_if:
                body["questions"][qid]["ask_if"] = {
                    wire[dep]: [_server_answer_name(by_id[dep], name) for name in wanted]
                    for dep, wanted in question.ask_if}
        payload = await self._poster.post("/v1/systemone", body)
        answers = payload.get("answers")
        if not isinstance(answers, dict):
            raise BackendMalformed("System One answer has no answers object")
        return [None if qid in answers and answers[qid] is None  # skipped by the server
                else self.parse_answer(r, payload, qid) for r, qid in zip(requests, ids)]

    async def read_spans(self, state: SpanState,
                         questions: Sequence[SpanQuestion]) -> list[SpanAnswer]:
        """Every span question about ``state`` in one body, as the server's own client sends it
        (the state as sent, so offsets index the same text); each answer must be grounded."""
        if not self.reads_spans:
            return await super().read_spans(state, questions)
        body: dict[str, Any] = {
            "model": self.model, "state": state.value, "seed": state.seed,
            "questions": {q.id: {"type": q.kind, "instructions": q.instructions,
                                 **({"criteria": q.criteria()} if q.given else {})}
                          for q in questions},
        }
        if state.context:
            body["instructions"] = state.context
        if state.images:
            body["images"] = list(state.images)
        for knob in ("steps", "think"):
            if getattr(self.options, knob) is not None:
                body[knob] = getattr(self.options, knob)
        body.update((k, v) for k, v in state.engine if k not in QUESTION_KNOBS)
        payload = await self._poster.post("/v1/systemone", body)
        answers = payload.get("answers")
        if not isinstance(answers, dict):
            raise BackendMalformed("System One answer has no answers object")
        out = []
        for q in questions:
            answer = parse_server_answer(q, answers.get(q.id))
            why = ungrounded(answer, state.source)
            if why is not None:
                raise BackendMalformed(f"answers[{q.id!r}]: {why}")
            out.append(answer)
        return out

    async def learn_upstream(self, *, strict: bool = True) -> None:
        await self._upstream.learn(strict=strict)

    async def read(self, requests: Sequence[DecisionRequest]) -> list[OptionScores]:
        await self._upstream.ensure()
        groups = self._joint_groups(requests)
        joint = {i for group in groups for i in group}
        singles = [i for i in range(len(requests)) if i not in joint]
        joint_reads, single_reads = await asyncio.gather(
            asyncio.gather(*(self._read_body([requests[i] for i in group]) for group in groups)),
            asyncio.gather(*(self._read(requests[i]) for i in singles)),
        )
        out: dict[int, OptionScores] = dict(zip(singles, single_reads))
        for group, scores in zip(groups, joint_reads):
            out.update(zip(group, scores))
        return [out[i] for i in range(len(requests))]

    async def _read(self, request: DecisionRequest) -> OptionScores:
        n = len(request.options)
        if request.kind == "noul" and n != 2:
            raise BackendRejected(f"a noul question needs exactly 2 options, got {n}")
        if request.kind == "score" and n > self.max_score_levels:
            # Past the server's level cap the levels are read as a choice over their names
            # (grouped past the choice cap); the answer is the same distribution over the levels.
            request = dataclasses.replace(request, kind="choice")
        if request.kind == "choice" and n > self.max_options:
            return await grouped_read(
                request, self._read_one, max_options=self.max_options,
                mode=self.options.grouping, group_size=self.options.group_size,
            )
        return await self._read_one(request)

    async def _read_one(self, request: DecisionRequest) -> OptionScores:
        if len(request.options) == 1:  # the example server rejects these; there is nothing to read
            return OptionScores(request.option_names, (1.0,), {"reads": 0})
        [scores] = await self._read_body([request])
        return scores

    async def _read_body(self, requests: Sequence[DecisionRequest]) -> list[OptionScores]:
        ids = wire_ids(requests)
        payload = await self._poster.post("/v1/systemone", self.build_body(requests, ids))
        return [self.parse_answer(r, payload, qid) for r, qid in zip(requests, ids)]

    def build_body(self, requests: Sequence[DecisionRequest],
                   ids: Sequence[str] | None = None) -> dict[str, Any]:
        """The /v1/systemone body asking ``requests`` (one state) in one read."""
        first, knobs = requests[0], systemone_knobs(requests[0])
        ids = list(ids) if ids is not None else wire_ids(requests)
        o = self.options
        samples: int | str = (o.samples if o.samples is not None else
                              "auto" if knobs.samples_auto else first.samples)
        body: dict[str, Any] = {
            "model": self.model,
            "state": first.state,
            "questions": {qid: _question(r) for qid, r in zip(ids, requests)},
            "samples": samples,
            "seed": first.seed,
        }
        if first.context:
            body["instructions"] = first.context  # example-server extension; OpenJev ignores it
        if first.images:
            body["images"] = list(first.images)
        for knob in ("steps", "think", "chunk_rows", "chunk_prompt"):
            if getattr(o, knob) is not None:
                body[knob] = getattr(o, knob)
        # What the caller set wins over the operator's defaults; per-question knobs go on
        # their question.
        body.update((k, v) for k, v in knobs.engine if k not in QUESTION_KNOBS)
        return body

    def parse_answer(self, request: DecisionRequest, payload: Mapping[str, Any],
                     qid: str | None = None) -> OptionScores:
        """Probabilities over ``request.options`` (in order) from a 200 answer, else BackendMalformed."""
        qid = qid if qid is not None else question_id(request)
        answers = payload.get("answers")
        answer = answers.get(qid) if isinstance(answers, dict) else None
        if not isinstance(answer, dict):
            raise BackendMalformed(f"System One answer has no answers[{qid!r}] object")
        names = request.option_names
        if request.kind == "noul":
            p_yes = _finite(answer.get("noul"), "noul")
            if not 0.0 <= p_yes <= 1.0:
                raise BackendMalformed(f"noul probability {p_yes} is outside [0, 1]")
            yes, _ = noul_order(request)
            proba = [1.0 - p_yes, 1.0 - p_yes]
            proba[yes] = p_yes
        else:
            given = answer.get("probabilities")
            if not isinstance(given, dict):
                raise BackendMalformed(f"answers[{qid!r}] has no probabilities object")
            if request.kind == "score" and set(given) == {str(i) for i in range(len(names))}:
                given = {names[int(k)]: v for k, v in given.items()}
            if set(given) != set(names):
                raise BackendMalformed(
                    f"answers[{qid!r}] names options {sorted(given)[:5]}..., not the "
                    f"{len(names)} requested"
                )
            proba = [_finite(given[name], name) for name in names]
        total = math.fsum(proba)
        if total <= 0 or any(p < 0 for p in proba):
            raise BackendMalformed(f"answers[{qid!r}] probabilities are not a distribution")
        raw = {"server_confidence": answer.get("confidence"), "server_model": payload.get("model")}
        diagnostics = payload.get("diagnostics")
        if isinstance(diagnostics, dict) and isinstance(diagnostics.get("thought"), dict):
            raw["server_thought"] = diagnostics["thought"]
        return OptionScores(names, tuple(p / total for p in proba), raw)

    async def ready(self) -> bool:
        """Reachable, and our key accepted: the server's /health needs no key, so the first probe
        also POSTs an empty body (a 401/403 refuses the key, a 422 the body) and remembers."""
        if self._key_ok is None:
            status = await self._poster.status_of("/v1/systemone", {})
            if status is None:
                return False  # unreachable: probe the key again next time
            self._key_ok = status not in AUTH_FAILURES
            if not self._key_ok:
                log.error("the System One server refuses slotgate's key (HTTP %d): not ready",
                          status)
        if not self._key_ok:
            return False
        if self._has_health and not await self._poster.get_ok("/health"):
            return False
        return await self._upstream.still_same()

    async def aclose(self) -> None:
        await self._poster.aclose()


def _question(request: DecisionRequest) -> dict[str, Any]:
    question: dict[str, Any] = {"type": request.kind, "instructions": request.instructions}
    question.update((k, v) for k, v in systemone_knobs(request).engine
                    if k in QUESTION_KNOBS)
    if request.kind == "choice":
        question["criteria"] = {o.name: o.description for o in request.options}
    elif request.kind == "score":
        question["criteria"] = [o.name for o in request.options]
    else:
        yes, no = noul_order(request)
        descriptions = (request.options[yes].description, request.options[no].description)
        if any(descriptions):
            question["criteria"] = {"true": descriptions[0] or "", "false": descriptions[1] or ""}
    return question


def _server_answer_name(request: DecisionRequest, name: str) -> str:
    """An answer of ``request`` as the server names it in ``ask_if``: ``yes``/``no`` for a noul
    (whatever slotgate calls its options), the option or level name otherwise."""
    if request.kind != "noul" or name not in request.option_names:
        return name
    yes, _ = noul_order(request)
    return "yes" if request.option_names.index(name) == yes else "no"


def _finite(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BackendMalformed(f"probability of {what!r} is not a finite number: {value!r}")
    return float(value)
