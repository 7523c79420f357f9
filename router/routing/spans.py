"""Span questions through routing: the first tier reads them when it can (a System One
backend), ``plan.span_plan`` decides (span answers are unscoped: ``policy.unscoped`` rules), and
an escalation asks the slow model the same question, whose answer must be grounded: a substring
of the text at the offsets it gives (every item of ``spans``), else the escalation failed.
Span answers are not cached and not in the decision log: no policy is tuned on them yet."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from policies.types import Decision, Route
from router.backends.spans import (
    SpanAnswer,
    SpanItem,
    SpanQuestion,
    SpanState,
    ungrounded,
)
from router.errors import (
    BackendError,
    NoSlowModel,
    SlowPathError,
    SlowPathInvalidAnswer,
    SlowPathUnavailable,
)
from router.routing.escalation import explained
from router.routing.plan import UNSCOPED_POLICY_ID, Mode, Plan, reads_first_tier, span_plan
from router.routing.registry import PolicyRegistry
from router.settings import Settings
from router.store.metrics import Metrics


@runtime_checkable
class MessagesModel(Protocol):
    """A slow model that answers free-form messages (``SlowPath.ask_messages``)."""

    async def ask_messages(self, messages: list[dict[str, Any]]) -> tuple[str | None, str]: ...


@dataclass(frozen=True, slots=True)
class SpanDecision:
    """One routed span question: the answer served and its routing facts."""

    answer: SpanAnswer
    decision: Decision


class SpanRouting:
    """Routes the span questions of one body; the parts are the routing service's."""

    def __init__(self, *, backend: Any, registry: PolicyRegistry, slow: object | None,
                 settings: Settings, metrics: Metrics) -> None:
        self.backend = backend
        self.registry = registry
        self.slow = slow
        self.settings = settings
        self.metrics = metrics

    def mode(self) -> Mode:
        registry = self.registry
        return Mode(shadow=registry.shadow_all, unscoped=registry.unscoped,
                    serve_unverified_on_failure=self.settings.slow.serve_unverified_on_failure,
                    fallback_threshold=registry.fallback_threshold)

    async def route(self, state: SpanState,
                    questions: Sequence[SpanQuestion]) -> dict[str, SpanDecision]:
        started = time.perf_counter()
        mode = self.mode()
        reads, no_read = await self._read(state, questions, needed=reads_first_tier(None, mode))
        tasks = [asyncio.ensure_future(self._decide(state, q, read, mode, no_read, started))
                 for q, read in zip(questions, reads)]
        try:
            decided = await asyncio.gather(*tasks)
        except BaseException:  # one failed question fails the body: no slow call runs on
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        return {q.id: d for q, d in zip(questions, decided)}

    async def _read(self, state: SpanState, questions: Sequence[SpanQuestion], *,
                    needed: bool = True) -> tuple[list[SpanAnswer | None], str | None]:
        """The first tier's answers (None each where there are none) and why there are none
        (None too when the read was not ``needed``: ``policy.unscoped: escalate``)."""
        none: list[SpanAnswer | None] = [None] * len(questions)
        if not getattr(self.backend, "reads_spans", False):
            return none, (f"the fast tier ({self.backend.name}) reads no span questions, so "
                          "the slow model answers them")
        if not needed:
            return none, None
        try:
            async with asyncio.timeout(self.settings.fast.timeout_s):
                return list(await self.backend.read_spans(state, questions)), None
        except TimeoutError:
            return none, f"the fast tier timed out after {self.settings.fast.timeout_s:g} s"
        except BackendError as exc:
            return none, f"the fast read failed: {exc}"

    async def _decide(self, state: SpanState, question: SpanQuestion, read: SpanAnswer | None,
                      mode: Mode, no_read: str | None, started: float) -> SpanDecision:
        the_plan = span_plan(None if read is None else read.confidence, mode,
                             f"{question.kind} question {question.id!r}", no_read)
        answer, route, note = await self._answer(state, question, read, the_plan)
        escalated = the_plan.action in ("escalate", "shadow")
        self.metrics.decision(route=route, escalated=escalated)
        first = answer.items[0].text if answer.items and question.kind == "span" else None
        return SpanDecision(answer, Decision(
            decision_id=uuid.uuid4().hex, question_id=question.id, answer=first, route=route,
            probability=None, raw_probability=None if read is None else read.confidence,
            threshold=(mode.fallback_threshold
                       if mode.unscoped == "threshold" and read is not None else None),
            policy_id=UNSCOPED_POLICY_ID, latency_ms=(time.perf_counter() - started) * 1e3,
            note=note, escalated=escalated and route == "slow",
            shadow=the_plan.action == "shadow"))

    async def _answer(self, state: SpanState, question: SpanQuestion, read: SpanAnswer | None,
                      the_plan: Plan) -> tuple[SpanAnswer, Route, str | None]:
        if the_plan.action in ("fast", "unverified"):
            assert read is not None  # planned only on a read
            return read, "fast" if the_plan.action == "fast" else "unverified", the_plan.note
        try:
            return await self.ask_slow(state, question), "slow", the_plan.note
        except SlowPathError as exc:
            failure = None
            if the_plan.fallback == "unverified" and read is None:  # not read: read it now
                [read], failure = await self._read(state, [question])
            if the_plan.fallback == "unverified" and read is not None:
                return read, "unverified", f"{exc.message}; {the_plan.fallback_note}"
            self.metrics.decision(route="failed", escalated=True)
            raise explained(exc, the_plan.error_note, failure) from exc

    async def ask_slow(self, state: SpanState, question: SpanQuestion) -> SpanAnswer:
        """The slow model's answer, grounded in ``state.source``; one corrective retry, then
        ``SlowPathInvalidAnswer`` saying what was wrong."""
        slow = self.slow
        if slow is None or not getattr(slow, "available", False):
            reason = getattr(slow, "unavailable_reason", None)
            if reason and self.settings.slow.model:  # configured, but no credentials for it
                raise SlowPathUnavailable(reason)
            raise NoSlowModel()
        if not isinstance(slow, MessagesModel):
            raise SlowPathInvalidAnswer("the slow model answers no span questions")
        source = state.source
        messages = span_messages(state, question)
        problem, model = "", ""
        for _ in (1, 2):
            content, model = await slow.ask_messages(messages)
            answer, problem = parse_slow_answer(content, question)
            if answer is not None:
                why = ungrounded(answer, source)
                if why is None:  # in text order, as the server lists them
                    return dataclasses.replace(
                        answer, items=tuple(sorted(answer.items, key=lambda i: i.start)))
                problem = f"its span is not in the text: {why}"
            messages = [*messages, {"role": "assistant", "content": (content or "")[:2000]},
                        {"role": "user", "content": f"That answer is not usable: {problem}. "
                                                    "Answer again, as asked."}]
        raise SlowPathInvalidAnswer(
            f"slow model {model} gave no grounded {question.kind} answer for "
            f"{question.id!r} after one corrective retry: {problem}")


def span_messages(state: SpanState, question: SpanQuestion) -> list[dict[str, Any]]:
    """The question for the slow model: the text offsets count in, and the JSON to answer."""
    where = ("the state below" if isinstance(state.value, str) else
             'the "text" field of the state below' if state.source != state.text else
             "the state below, as written")
    item = '{"text": "<copied exactly>", "start": <offset>, "end": <offset>}'
    shape = (f'{{"found": true, {item[1:-1]}}} or {{"found": false}} when the text has no '
             "such value" if question.kind == "span" else
             f'{{"items": [{item}, ...]}} listing every such value in the order they appear, '
             f'at most {question.max_items}, or {{"items": []}} when there is none')
    system = "\n".join([
        *([state.context] if state.context else []),
        f"Question: {question.instructions}",
        ("Answer with a value copied from the text, character for character. Offsets are "
         f"0-based character offsets into {where}; end is exclusive, so text == "
         "TEXT[start:end]."),
        f"Answer with JSON {shape}.",
    ])
    user: Any = state.text
    if state.images:
        user = [*({"type": "image_url", "image_url": {"url": url}} for url in state.images),
                {"type": "text", "text": state.text}]
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def parse_slow_answer(content: str | None, question: SpanQuestion
                      ) -> tuple[SpanAnswer | None, str]:
    """The slow model's JSON as a span answer, or (None, what is wrong with it)."""
    try:
        value = json.loads(content or "")
    except (ValueError, RecursionError):
        return None, "it is not JSON"
    if not isinstance(value, dict):
        return None, "it is not a JSON object"
    raw: Any = [value] if question.kind == "span" else value.get("items")
    if question.kind == "span" and (value.get("found") is False or value.get("text") is None):
        return SpanAnswer("span", (), 1.0), ""
    if not isinstance(raw, list):
        return None, 'it has no "items" list'
    items = []
    for it in raw[:question.max_items]:
        if (not isinstance(it, dict) or not isinstance(it.get("text"), str)
                or any(isinstance(it.get(k), bool) or not isinstance(it.get(k), int)
                       for k in ("start", "end"))):
            return None, "an item lacks a text and integer start and end"
        items.append(SpanItem(it["text"], it["start"], it["end"]))
    return SpanAnswer(question.kind, tuple(items), 1.0), ""
