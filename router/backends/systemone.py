"""Fast backend that asks a System One server (the vLLM example server, OpenJev, hosted Jev) one
question per HTTP request and reads the probabilities it returns.

Why one question per request: joint slots copy letters (protocol notes, section 7), and each read
then stands alone, so servers that ignore ``ask_if``/``depends_on`` (OpenJev) need no special
handling: the router never sends either; a grouped read's stages are run here (``grouping``).
Choices past the server's option cap are read by ``grouping.grouped_read``.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from policies.types import DecisionRequest, OptionScores
from router.backends.base import FastBackend
from router.backends.grouping import GroupingMode, grouped_read
from router.backends.http_post import JsonPoster
from router.errors import BackendMalformed, BackendRejected, ConfigError
from router.settings import FastBackendSettings

Dialect = Literal["example", "openjev", "jev"]
YES_NAMES = frozenset({"yes", "true"})
SETTINGS_OPTIONS = frozenset({
    "dialect", "model", "max_options", "grouping", "group_size", "samples", "server_revision",
    "retries_5xx", "max_retry_wait_s",
})


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
    """The id as the example server accepts it (prompt text: no ':' or newline, non-empty)."""
    qid = request.question_id.replace(":", "_").replace("\n", " ").replace("\r", " ").strip()
    return qid or "q"


class SystemOneBackend(FastBackend):
    """Reads decisions from ``POST {url}/v1/systemone``.

    ``dialect`` picks the default model name and option caps; ``max_options`` overrides the
    choice cap. ``samples`` (an int or "auto") overrides the request's own draws. ``grouping``
    is "combined" (default) or "chained" (lossy, for comparisons). ``server_revision`` names
    the server build, whose prompt template we cannot see; it goes into the fingerprint.
    """

    name = "systemone"

    def __init__(
        self,
        *,
        url: str,
        dialect: Dialect = "example",
        model: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 10.0,
        max_concurrency: int = 8,
        max_options: int | None = None,
        grouping: GroupingMode = "combined",
        group_size: int | None = None,
        samples: int | Literal["auto"] | None = None,
        server_revision: str = "",
        retries_5xx: int = 1,
        max_retry_wait_s: float = 2.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if dialect not in DIALECTS:
            raise ConfigError(f"dialect must be one of {sorted(DIALECTS)}, got {dialect!r}")
        if grouping not in ("combined", "chained"):
            raise ConfigError(f"grouping must be 'combined' or 'chained', got {grouping!r}")
        limits = DIALECTS[dialect]
        self.dialect = dialect
        self.model = model or limits.model
        self.max_options = max_options or limits.max_choice_options
        self.max_score_levels = limits.max_score_levels
        self.grouping: GroupingMode = grouping
        self.group_size = group_size
        self.samples = samples
        self.server_revision = server_revision
        self._has_health = limits.has_health
        self._poster = JsonPoster(
            base_url=url, api_key=api_key, timeout_s=timeout_s, max_concurrency=max_concurrency,
            retries_5xx=retries_5xx, max_retry_wait_s=max_retry_wait_s, transport=transport,
            what=f"System One server ({dialect})",
        )

    @classmethod
    def from_settings(cls, settings: FastBackendSettings) -> SystemOneBackend:
        """Built from ``fast.url``, ``fast.api_key``, ``fast.timeout_s``, ``fast.max_concurrency``
        and ``fast.options`` (dialect, model, max_options, grouping, group_size, samples,
        server_revision, retries_5xx, max_retry_wait_s)."""
        if not settings.url:
            raise ConfigError("the systemone backend needs fast.url", field="fast.url")
        return cls(
            url=settings.url,
            api_key=settings.api_key.get_secret_value() if settings.api_key else None,
            timeout_s=settings.timeout_s,
            max_concurrency=settings.max_concurrency,
            **checked_options(settings.options, SETTINGS_OPTIONS, "systemone"),
        )

    def identity(self) -> Mapping[str, Any]:
        return {
            "backend": self.name,
            "dialect": self.dialect,
            "model": self.model,
            "server_revision": self.server_revision,
            "max_options": self.max_options,
            "grouping": self.grouping,
            "group_size": self.group_size,
            "samples": self.samples,
        }

    async def read(self, requests: Sequence[DecisionRequest]) -> list[OptionScores]:
        return list(await asyncio.gather(*(self._read(r) for r in requests)))

    async def _read(self, request: DecisionRequest) -> OptionScores:
        n = len(request.options)
        if request.kind == "choice" and n > self.max_options:
            return await grouped_read(
                request, self._read_one, max_options=self.max_options,
                mode=self.grouping, group_size=self.group_size,
            )
        if request.kind == "score" and n > self.max_score_levels:
            raise BackendRejected(
                f"score question has {n} levels; the {self.dialect} server takes "
                f"at most {self.max_score_levels}"
            )
        if request.kind == "noul" and n != 2:
            raise BackendRejected(f"a noul question needs exactly 2 options, got {n}")
        return await self._read_one(request)

    async def _read_one(self, request: DecisionRequest) -> OptionScores:
        if len(request.options) == 1:  # the example server rejects these; there is nothing to read
            return OptionScores(request.option_names, (1.0,), {"reads": 0})
        payload = await self._poster.post("/v1/systemone", self.build_body(request))
        return self.parse_answer(request, payload)

    def build_body(self, request: DecisionRequest) -> dict[str, Any]:
        """The /v1/systemone body for one question about ``request.state``."""
        question: dict[str, Any] = {"type": request.kind, "instructions": request.instructions}
        if request.kind == "choice":
            question["criteria"] = {o.name: o.description for o in request.options}
        elif request.kind == "score":
            question["criteria"] = [o.name for o in request.options]
        else:
            yes, no = _noul_order(request)
            descriptions = (request.options[yes].description, request.options[no].description)
            if any(descriptions):
                question["criteria"] = {"true": descriptions[0] or "", "false": descriptions[1] or ""}
        body: dict[str, Any] = {
            "model": self.model,
            "state": request.state,
            "questions": {question_id(request): question},
            "samples": self.samples if self.samples is not None else request.samples,
            "seed": request.seed,
        }
        if request.context:
            body["instructions"] = request.context  # example-server extension; OpenJev ignores it
        return body

    def parse_answer(self, request: DecisionRequest, payload: Mapping[str, Any]) -> OptionScores:
        """Probabilities over ``request.options`` (in order) from a 200 answer, else BackendMalformed."""
        qid = question_id(request)
        answers = payload.get("answers")
        answer = answers.get(qid) if isinstance(answers, dict) else None
        if not isinstance(answer, dict):
            raise BackendMalformed(f"System One answer has no answers[{qid!r}] object")
        names = request.option_names
        if request.kind == "noul":
            p_yes = _finite(answer.get("noul"), "noul")
            if not 0.0 <= p_yes <= 1.0:
                raise BackendMalformed(f"noul probability {p_yes} is outside [0, 1]")
            yes, _ = _noul_order(request)
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
        return OptionScores(names, tuple(p / total for p in proba), raw)

    async def ready(self) -> bool:
        return await self._poster.get_ok("/health") if self._has_health else True

    async def aclose(self) -> None:
        await self._poster.aclose()


def checked_options(options: Mapping[str, Any], allowed: frozenset[str], kind: str) -> dict[str, Any]:
    """``fast.options`` as keyword arguments; ConfigError naming any option the backend lacks."""
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ConfigError(
            f"fast.options {unknown} are not options of the {kind} backend "
            f"(it takes {sorted(allowed)})", field="fast.options",
        )
    return dict(options)


def _noul_order(request: DecisionRequest) -> tuple[int, int]:
    """Index of the 'yes' option and of the 'no' option: the one named yes/true, else the first."""
    yes = next((i for i, o in enumerate(request.options) if o.name.lower() in YES_NAMES), 0)
    return yes, 1 - yes


def _finite(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BackendMalformed(f"probability of {what!r} is not a finite number: {value!r}")
    return float(value)
