"""Parse and validate a System One ``POST /v1/systemone`` body, as the vLLM example server accepts
it, into typed questions ordered in dependency stages. Errors speak the example server's dialect.

Accepted: ``model`` (echoed), ``state`` (required; a string as is, anything else as JSON text),
``questions`` (id -> ``{type, criteria, instructions, depends_on, ask_if}``; types ``noul``
(``bool``/``boolean`` too), ``choice``, ``score``, and ``span``/``spans`` where the caller takes
them (``span_wire``: routed apart, ``router.routing.spans``); ids trimmed, as the server trims them; levels,
descriptions and criteria values of any JSON type are read as text, as the server prints them:
``str()``, a falsy description left out; a question's non-string ``instructions`` as
``json.dumps`` with ASCII escapes; an empty ``depends_on``/``ask_if`` is none, as there),
top-level ``instructions`` (shared context; ``str()`` of a non-string, a falsy one left out, as
the server prints it), ``samples`` (``"auto"`` or 1..32, larger counts capped; ``true`` is 1, as there),
``seed`` (``int()`` of it, as there), ``ask`` (a subset of ids), ``images`` (``images``: data
URLs shown ahead of the state, with a multipart form's image parts) and the slotgate extension
``policy`` (a tuned policy's name, top level or per question). The example server's engine
knobs ``steps``, ``think``, ``chunk_rows``, ``chunk_prompt``, ``auto_max``, ``auto_threshold``,
``sequential`` and the per-question ``alone`` are validated with its rules (``sequential`` and
``alone`` must be booleans here) and carried to the fast backend: a System One backend forwards
them, so its reads are the ones the server gives its own clients; the other backends configure
their own reads.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from policies.types import DecisionRequest, Option, QuestionKind, StagedQuestion
from router.backends.knobs import SystemOneKnobs
from router.backends.spans import SpanQuestion, SpanState

# Re-exported for the modules that take the wire's errors from here (the chat variant).
from router.http.systemone.errors import InvalidBody as InvalidBody  # noqa: PLC0414
from router.http.systemone.errors import SystemOneError as SystemOneError  # noqa: PLC0414
from router.http.systemone.images import json_images
from router.http.systemone.span_wire import span_question, span_text_problem
from router.routing.stages import stage_order

MAX_SAMPLES = 32  # the example server's cap; larger counts are clamped, not refused
DEFAULT_SEED = 42
ENGINE_KNOBS = ("steps", "think", "chunk_rows", "chunk_prompt", "auto_max", "auto_threshold",
                "sequential")  # validated, then forwarded
MAX_STEPS = 8  # the server clamps steps into [1, 8]
MAX_THINK = 4096
_KINDS: dict[str, QuestionKind] = {
    "noul": "noul", "bool": "noul", "boolean": "noul", "choice": "choice", "score": "score",
}


@dataclass(frozen=True, slots=True)
class Question:
    """One validated question. ``options`` are what the fast backend reads: ``yes``/``no`` for a
    noul, the option names for a choice, the level strings (in order) for a score."""

    id: str
    kind: QuestionKind
    instructions: str
    options: tuple[Option, ...]
    depends_on: tuple[str, ...] = ()
    ask_if: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (dependency, wanted answers), in order
    policy: str | None = None
    alone: bool = False  # the server reads it in a chunk of its own

    @property
    def answer_names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.options)

    @property
    def dependencies(self) -> tuple[str, ...]:
        """``depends_on`` plus every ``ask_if`` key, each once, in the order given."""
        return tuple(dict.fromkeys(self.depends_on + tuple(dep for dep, _ in self.ask_if)))


@dataclass(frozen=True, slots=True)
class SystemOneRequest:
    """A validated body. ``stages`` lists question ids stage by stage: a question comes after every
    question it depends on; within a stage ids keep the request's order."""

    model: str | None
    state: str
    context: str
    questions: tuple[Question, ...]
    stages: tuple[tuple[str, ...], ...]
    samples: int
    seed: int
    policy: str | None = None
    samples_auto: bool = False  # samples "auto": a System One backend forwards it as such
    engine: tuple[tuple[str, Any], ...] = ()  # the engine knobs given, (name, value) in order
    spans: tuple[SpanQuestion, ...] = ()  # the asked span questions, routed apart
    order: tuple[str, ...] = ()  # every asked id, in request order (the answers' order)
    state_value: Any = None  # the state as sent: span offsets index it (or its "text")
    images: tuple[str, ...] = ()  # data URLs shown ahead of the state

    def span_state(self) -> SpanState:
        """What the span questions are asked about."""
        return SpanState(value=self.state_value, text=self.state, context=self.context,
                         seed=self.seed, images=self.images, engine=self.engine)

    def question(self, question_id: str) -> Question:
        return next(q for q in self.questions if q.id == question_id)

    def staged(self) -> tuple[StagedQuestion, ...]:
        """The asked questions as ``routing.stages`` answers them, in request order."""
        return tuple(StagedQuestion(self.decision_request(q), q.depends_on, q.ask_if)
                     for q in self.questions)

    def decision_request(self, question: Question) -> DecisionRequest:
        """One question of the body as the routing service decides it; the engine knobs travel
        to the fast backend as ``SystemOneKnobs``."""
        engine = self.engine + ((("alone", True),) if question.alone else ())
        return DecisionRequest(
            question_id=question.id,
            instructions=question.instructions,
            options=question.options,
            state=self.state,
            context=self.context,
            kind=question.kind,
            samples=self.samples,
            seed=self.seed,
            policy=question.policy or self.policy,
            extension=SystemOneKnobs(samples_auto=self.samples_auto, engine=engine),
            images=self.images,
        )


def parse_request(payload: Any, *, max_questions: int, max_options: int,
                  spans: bool = False, form_images: Sequence[str] = ()) -> SystemOneRequest:
    """Validate a decoded payload; raises ``SystemOneError`` (or ``InvalidBody``) naming the field.
    ``spans``: span questions are taken (``/v1/systemone``); elsewhere they are refused.
    ``form_images``: a multipart form's image parts, shown ahead of the body's ``images``."""
    if not isinstance(payload, dict):
        raise InvalidBody("invalid body: expected a JSON object")
    if payload.get("state") is None:
        raise SystemOneError("state: required", field="state")
    raw_questions = payload.get("questions")
    if not isinstance(raw_questions, dict) or not raw_questions:
        raise SystemOneError("questions: needs a non-empty map of id -> question", field="questions")
    if len(raw_questions) > max_questions:
        raise SystemOneError(f"schema: at most {max_questions} questions", field="questions")
    every = _questions(raw_questions, max_options=max_options, spans=spans)
    asked_ids = _asked(payload.get("ask"), every)
    asked = {qid: q for qid, q in asked_ids.items() if isinstance(q, Question)}
    asked_spans = tuple(q for q in asked_ids.values() if isinstance(q, SpanQuestion))
    if asked_spans and (problem := span_text_problem(payload["state"])):
        raise SystemOneError(problem, field="state")
    model = payload.get("model")
    return SystemOneRequest(
        model=model if isinstance(model, str) else None,
        state=_text(payload["state"]),
        context=_context(payload.get("instructions")),
        questions=tuple(asked.values()),
        stages=_stages(asked),
        samples=_samples(payload.get("samples", "auto")),
        seed=_seed(payload.get("seed", DEFAULT_SEED)),
        policy=_policy_name(payload.get("policy"), "policy"),
        samples_auto=payload.get("samples", "auto") == "auto",
        engine=_engine(payload),
        spans=asked_spans,
        order=tuple(asked_ids),
        state_value=payload["state"],
        images=(*form_images, *json_images(payload.get("images"))),
    )


def _questions(raw_questions: dict[str, Any], *, max_options: int,
               spans: bool) -> dict[str, Question | SpanQuestion]:
    """Every question by its trimmed id, in request order, references checked."""
    every: dict[str, Question | SpanQuestion] = {}
    for qid, raw in raw_questions.items():
        question = (span_question(qid, raw, allowed=spans)
                    or _question(qid, raw, max_options=max_options))
        if question.id in every:  # two ids the same once trimmed
            raise SystemOneError(f"duplicate question id '{question.id}'", field="questions")
        every[question.id] = question
    _check_references({k: q for k, q in every.items() if isinstance(q, Question)},
                      {k: q for k, q in every.items() if isinstance(q, SpanQuestion)})
    return every


def _question(raw_id: str, raw: Any, *, max_options: int) -> Question:
    qid = raw_id.strip()  # the server trims ids and answers under the trimmed id
    where = f"question '{qid}'"
    if not qid or ":" in qid or "\n" in qid or "\r" in qid:
        raise SystemOneError(
            f"{where}: ids must be non-empty after trimming, with no ':' or newline",
            field="questions",
        )
    if not isinstance(raw, dict):
        raise SystemOneError(f"{where}: needs an object with a type", field=f"questions.{qid}")
    kind_raw = raw.get("type")
    if kind_raw is None:
        raise SystemOneError(f"{where}: type: required", field=f"questions.{qid}.type")
    kind = _KINDS.get(kind_raw) if isinstance(kind_raw, str) else None
    if kind is None:
        raise SystemOneError(f"{where}: unknown type '{kind_raw}'", field=f"questions.{qid}.type")
    options = _options(where, kind, raw.get("criteria"))
    if len(options) < 2:
        raise SystemOneError(f"{where}: needs at least two alternatives", field=f"questions.{qid}")
    if len(options) > max_options:
        raise SystemOneError(f"{where}: at most {max_options} alternatives", field=f"questions.{qid}")
    return Question(
        id=qid,
        kind=kind,
        instructions=_instructions(raw.get("instructions", "")),
        options=options,
        depends_on=_depends_on(where, raw.get("depends_on")),
        ask_if=_ask_if(where, raw.get("ask_if")),
        policy=_policy_name(raw.get("policy"), f"questions.{qid}.policy"),
        alone=_flag(raw.get("alone", False), f"questions.{qid}.alone", f"{where}: alone"),
    )


def _flag(value: Any, field: str, what: str) -> bool:
    """A boolean switch. The server takes ``bool(value)`` of anything (so "no" would mean yes);
    slotgate refuses what is not a JSON boolean."""
    if not isinstance(value, bool):
        raise SystemOneError(f"{what} must be true or false", field=field)
    return value


def _options(where: str, kind: QuestionKind, criteria: Any) -> tuple[Option, ...]:
    if kind == "noul":
        criteria = {} if criteria is None else criteria
        if not isinstance(criteria, dict):
            raise SystemOneError(
                f'{where}: noul criteria must be {{"true": description, "false": description}}',
                field="criteria",
            )
        return (Option("yes", _description(criteria.get("true"))),
                Option("no", _description(criteria.get("false"))))
    if kind == "choice":
        if not isinstance(criteria, dict):
            raise SystemOneError(
                f"{where}: choice criteria must map each option to a description or null",
                field="criteria",
            )
        return tuple(Option(name, _description(d)) for name, d in criteria.items())
    if not isinstance(criteria, list):
        raise SystemOneError(f"{where}: score criteria must be an ordered list of levels",
                             field="criteria")
    levels = [_level(level) for level in criteria]
    duplicates = sorted({level for level in levels if levels.count(level) > 1})
    if duplicates:
        raise SystemOneError(f"{where}: duplicate level '{duplicates[0]}'", field="criteria")
    return tuple(Option(level) for level in levels)


def _level(level: Any) -> str:
    """A level as the server names it: text as given, anything else through ``str()``."""
    return level if isinstance(level, str) else str(level)


def _description(value: Any) -> str | None:
    """A description as the server prints it: a falsy one (None, "", 0, false) is left out,
    anything else is its ``str()``."""
    if not value:
        return None
    return value if isinstance(value, str) else str(value)


def _instructions(value: Any) -> str:
    """A question's instructions as the server reads them: text as given, anything else as
    ``json.dumps`` (ASCII escapes included)."""
    return value if isinstance(value, str) else json.dumps(value)


def _context(value: Any) -> str:
    """The top-level instructions as the server prints them: a falsy value is left out, anything
    else is its ``str()`` (``True``, a Python repr of an object)."""
    if not value:
        return ""
    return value if isinstance(value, str) else str(value)


def _engine(payload: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """The engine knobs given, checked with the server's rules and messages."""
    knobs: list[tuple[str, Any]] = []
    for name, cap in (("steps", MAX_STEPS), ("auto_max", MAX_SAMPLES)):
        if name in payload:  # integers the server clamps into [1, cap]
            value = payload[name]
            if isinstance(value, bool) or not isinstance(value, int):
                raise SystemOneError(f"schema: {name} must be an integer", field=name)
            knobs.append((name, max(1, min(value, cap))))
    if "think" in payload:
        think = payload["think"]
        if isinstance(think, bool) or not isinstance(think, int) or not 0 <= think <= MAX_THINK:
            raise SystemOneError(
                f"schema: think must be a thought budget in tokens, 0 to {MAX_THINK}", field="think")
        knobs.append(("think", think))
    if payload.get("chunk_rows") is not None:
        rows = payload["chunk_rows"]
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 8:
            raise SystemOneError("schema: chunk_rows must be an integer of at least 8",
                                 field="chunk_rows")
        knobs.append(("chunk_rows", rows))
    if "chunk_prompt" in payload:
        if payload["chunk_prompt"] not in ("shared", "own"):
            raise SystemOneError('schema: chunk_prompt must be "shared" or "own"',
                                 field="chunk_prompt")
        knobs.append(("chunk_prompt", payload["chunk_prompt"]))
    if "auto_threshold" in payload:
        nats = payload["auto_threshold"]
        if isinstance(nats, bool) or not isinstance(nats, (int, float)) or not math.isfinite(nats):
            raise SystemOneError("schema: auto_threshold must be a number of nats",
                                 field="auto_threshold")
        knobs.append(("auto_threshold", float(nats)))
    if "sequential" in payload:
        knobs.append(("sequential", _flag(payload["sequential"], "sequential",
                                          "schema: sequential")))
    return tuple(knobs)


def _depends_on(where: str, raw: Any) -> tuple[str, ...]:
    if not raw:  # the server reads ``depends_on or []``: null, [] or {} is no dependency
        return ()
    if not isinstance(raw, list) or not all(isinstance(dep, str) for dep in raw):
        raise SystemOneError(f"{where}: depends_on must be a list of question ids",
                             field="depends_on")
    return tuple(dict.fromkeys(raw))


def _ask_if(where: str, raw: Any) -> tuple[tuple[str, tuple[str, ...]], ...]:
    if not raw:  # the server reads ``ask_if or {}``: null, [] or {} is no condition
        return ()
    bad = SystemOneError(
        f"{where}: ask_if must map a question id to a non-empty list of its answers",
        field="ask_if",
    )
    if not isinstance(raw, dict):
        raise bad
    out = []
    for dep, wanted in raw.items():
        if not isinstance(wanted, list) or not wanted:
            raise bad
        if not all(isinstance(w, (str, int, float)) and not isinstance(w, bool) for w in wanted):
            raise bad
        out.append((dep, tuple(dict.fromkeys(str(w) for w in wanted))))
    return tuple(out)


def _check_references(questions: dict[str, Question],
                      spans: dict[str, SpanQuestion]) -> None:
    for q in questions.values():
        for dep in q.dependencies:
            if dep in spans:
                raise SystemOneError(
                    f"question '{q.id}': cannot depend on the span question '{dep}'",
                    field="depends_on")
            if dep == q.id or dep not in questions:
                raise SystemOneError(f"question '{q.id}': depends on unknown question '{dep}'",
                                     field="depends_on")
        for dep, wanted in q.ask_if:
            allowed = questions[dep].answer_names
            if any(w not in allowed for w in wanted):
                raise SystemOneError(
                    f"question '{q.id}': ask_if values for '{dep}' must be among {list(allowed)}",
                    field="ask_if",
                )


def _asked(raw: Any, questions: dict[str, Question | SpanQuestion]
           ) -> dict[str, Question | SpanQuestion]:
    """The ``ask`` subset (default: every question); it must hold everything it depends on."""
    if raw is None:
        return questions
    if (not isinstance(raw, list) or not raw
            or not all(isinstance(i, str) and i in questions for i in raw)):
        raise SystemOneError("schema: ask must list question ids from this schema", field="ask")
    for qid in raw:
        missing = [dep for dep in getattr(questions[qid], "dependencies", ()) if dep not in raw]
        if missing:
            raise SystemOneError(f"schema: ask names '{qid}' but not everything it depends on "
                                 f"('{missing[0]}')", field="ask")
    return {qid: q for qid, q in questions.items() if qid in raw}


def _stages(questions: dict[str, Question]) -> tuple[tuple[str, ...], ...]:
    try:
        return stage_order({qid: q.dependencies for qid, q in questions.items()})
    except ValueError as exc:
        raise SystemOneError(f"schema: {exc}", field="questions") from exc


def _samples(raw: Any) -> int:
    # "auto" lets the example server re-read on high entropy; slotgate's backends read once.
    if raw == "auto" or raw is True:  # true is the count 1 to the server (a bool is an int)
        return 1
    if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 1:
        return min(raw, MAX_SAMPLES)
    raise SystemOneError('schema: samples must be a positive count or "auto"', field="samples")


def _seed(raw: Any) -> int:
    """The seed as the server takes it, ``int()`` of a number or of an integer's text (7.9 is 7,
    "7" is 7). What ``int()`` refuses fails the server without a reply; booleans, which it
    would take as 0 and 1, are refused here too, as a seed nobody means."""
    if isinstance(raw, (int, float, str)) and not isinstance(raw, bool):
        try:
            return int(raw)
        except (ValueError, OverflowError):
            pass
    raise SystemOneError("seed: must be an integer (or a number or text int() takes)",
                         field="seed")


def _policy_name(raw: Any, field: str) -> str | None:
    if raw is None or (isinstance(raw, str) and raw):
        return raw
    raise SystemOneError(f"{field}: must be a policy name", field=field)


def _text(value: Any) -> str:
    """Strings as they are, anything else as JSON text (non-ASCII left unescaped, as written)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
