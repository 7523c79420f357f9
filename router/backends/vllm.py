"""Fast backend that reads the answer slot of DiffusionGemma served by vLLM, through vLLM's
OpenAI chat API and the diffusion request fields (protocol notes, section 5).

Each read is the request the vLLM example server would send for the same one-question body
(``example_template``): its system text (the state LAST, in the user turn, so vLLM's prefix cache
reuses the rest), its labels, the label ids as they stand at the slot of the answer template
``"{id}: {label}"``, and its canvas ``thought block + answer template + turn close + pad`` with
the slot holding a seeded random id below the ENGINE's vocabulary. ``diffusion_max_steps: 1`` with
``diffusion_read_only`` is what makes vLLM do a one-step read (``is_one_step_read``); without the
cap the engine runs its whole denoise schedule and reports the converged canvas, silently. The
slot's logprobs give the distribution: a label the server did not return gets (lowest returned
logprob - 5), then softmax over the labels. Draws are averaged.

Up to ``label_cap`` options (vLLM's 128 ids per request) are read in one slot; beyond it, the
read is grouped (``grouping``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from policies.types import DecisionRequest, OptionScores, canonical_hash
from router.backends.base import DRAW_SEED_STRIDE, FastBackend
from router.backends.example_template import (
    TEMPLATE_VERSION,
    AnswerTemplate,
    choice_alphabet,
    labels_for,
    resolve,
    system_text,
)
from router.backends.grouping import grouped_read
from router.backends.http_post import JsonPoster
from router.backends.labels import load_tokenizer
from router.backends.options import VLLM_LABEL_CAP, VllmOptions
from router.backends.upstream import UpstreamWatch, upstream_identity
from router.errors import BackendMalformed, ConfigError, UnprocessableRequest
from router.settings import FastBackendSettings

MISSING_LABEL_PENALTY = 5.0  # the example server's rule for labels absent from the logprobs
NEUTRAL_ID = "q"  # the question id the label alphabet is checked with at start-up
TEMPLATE_CACHE = 4096  # resolved answer templates kept, by (question id, labels)
log = logging.getLogger(__name__)


class VllmBackend(FastBackend):
    """Reads ``POST {url}/v1/chat/completions`` with ``vllm_xargs`` diffusion fields.

    ``options`` (``VllmOptions``) say how; ``tokenizer`` (else ``options.tokenizer_path``, a LOCAL
    folder) is the served model's tokenizer.
    """

    name = "vllm"

    def __init__(
        self,
        url: str,
        options: VllmOptions | None = None,
        *,
        tokenizer: Any = None,
        api_key: str | None = None,
        timeout_s: float = 10.0,
        max_concurrency: int = 16,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.options = options = options or VllmOptions()
        if tokenizer is None:
            if options.tokenizer_path is None:
                raise ConfigError("the vllm backend needs tokenizer_path (a local folder)")
            tokenizer = load_tokenizer(options.tokenizer_path)
        self.tokenizer = tokenizer
        self.model = options.model
        if any(not 0 <= t < options.vocab_size for t in (options.turn_close_id, options.pad_id)):
            raise ConfigError(f"turn_close_id and pad_id must lie in [0, {options.vocab_size})")
        self._templates: OrderedDict[tuple[str, tuple[str, ...]], AnswerTemplate] = OrderedDict()
        self.alphabet = self._choice_labels()
        self._server_samples = options.server_samples
        self._poster = JsonPoster(
            base_url=url, api_key=api_key, timeout_s=timeout_s, max_concurrency=max_concurrency,
            retries_5xx=options.retries_5xx, max_retry_wait_s=options.max_retry_wait_s,
            transport=transport, what="vLLM server",
        )
        self._upstream = UpstreamWatch(self._poster, self.model, f"the vLLM server at {url}")

    @classmethod
    def from_settings(cls, settings: FastBackendSettings) -> VllmBackend:
        """Built from ``fast.url``, ``fast.api_key``, ``fast.timeout_s``, ``fast.max_concurrency``
        and ``fast.options`` (``VllmOptions``; ``tokenizer_path`` defaults to ``fast.model_path``)."""
        if not settings.url:
            raise ConfigError("the vllm backend needs fast.url", field="fast.url")
        options = settings.options_as(VllmOptions)
        if options.tokenizer_path is None and settings.model_path is not None:
            options = options.model_copy(update={"tokenizer_path": settings.model_path})
        return cls(
            settings.url, options,
            api_key=settings.api_key.get_secret_value() if settings.api_key else None,
            timeout_s=settings.timeout_s, max_concurrency=settings.max_concurrency,
        )

    def _choice_labels(self) -> tuple[str, ...]:
        """The choice labels one slot reads: the operator's (each checked; ConfigError names a bad
        one), else A-Z as the server has them and slotgate's lift past 26, keeping those that
        are one distinct token at the slot, up to ``label_cap``."""
        wanted = self.options.labels
        cap = self.options.label_cap
        if wanted:
            labels = tuple(wanted[:cap])
            try:
                self.template(NEUTRAL_ID, labels)
            except UnprocessableRequest as exc:
                raise ConfigError(f"labels: {exc.message}", field="fast.options.labels") from exc
            return labels
        try:
            base = self.template(NEUTRAL_ID, ("A", "B"))
        except UnprocessableRequest as exc:
            raise ConfigError(f"the answer template cannot be read: {exc.message}") from exc
        head = self.tokenizer.encode(self.options.thought_block, add_special_tokens=False)
        kept: list[str] = []
        seen: set[int] = set()
        for label in choice_alphabet():
            ids = [*head, *self.tokenizer.encode(f"{NEUTRAL_ID}: {label}", add_special_tokens=False)]
            if len(ids) != len(base.ids) or ids[base.slot] in seen or any(
                    a != b for i, (a, b) in enumerate(zip(ids, base.ids)) if i != base.slot):
                continue
            kept.append(label)
            seen.add(ids[base.slot])
            if len(kept) == cap:
                break
        if len(kept) < 2:
            raise ConfigError("fewer than two choice labels are single tokens at the answer slot")
        return tuple(kept)

    def template(self, question_id: str, labels: tuple[str, ...]) -> AnswerTemplate:
        """The resolved answer template (cached): UnprocessableRequest when it cannot be read."""
        key = (question_id, labels)
        found = self._templates.get(key)
        if found is None:
            found = resolve(self.tokenizer, self.options.thought_block, question_id, labels,
                            canvas_length=self.options.canvas_length)
            self._templates[key] = found
            if len(self._templates) > TEMPLATE_CACHE:
                self._templates.popitem(last=False)
        return found

    def identity(self) -> Mapping[str, Any]:
        o = self.options
        return {
            "backend": self.name,
            "model": self.model,
            "template": TEMPLATE_VERSION,
            "prompt": canonical_hash([o.thought_block, o.turn_close_id, o.pad_id])[:16],
            "canvas": [o.canvas_length, o.canvas_step],
            "vocab": o.vocab_size,
            "steps": o.steps,
            "samples": o.samples,
            "server_samples": o.server_samples,
            "constrained": o.constrained,
            "thinking": o.enable_thinking,
            "labels": list(self.alphabet),
            "grouping": [o.grouping, o.group_size],
        } | upstream_identity(self._upstream)

    def read_inputs(
        self, request: DecisionRequest, batch: Sequence[DecisionRequest]
    ) -> Mapping[str, Any]:
        # The question id is prompt text ("Question {id}:" and the answer template "{id}: A").
        return {**super().read_inputs(request, batch), "question_id": request.question_id}

    async def learn_upstream(self, *, strict: bool = True) -> None:
        await self._upstream.learn(strict=strict)

    async def read(self, requests: Sequence[DecisionRequest]) -> list[OptionScores]:
        await self._upstream.ensure()
        return list(await asyncio.gather(*(self._read(r) for r in requests)))

    async def _read(self, request: DecisionRequest) -> OptionScores:
        n = len(request.options)
        if n == 1:
            return OptionScores(request.option_names, (1.0,), {"reads": 0})
        if request.kind != "noul" and n > len(self.alphabet) and not (
                request.kind == "score" and n <= 9):
            return await grouped_read(request, self._read_one, max_options=len(self.alphabet),
                                      mode=self.options.grouping,
                                      group_size=self.options.group_size)
        return await self._read_one(request)

    async def _read_one(self, request: DecisionRequest) -> OptionScores:
        labels = labels_for(request, self.alphabet)
        template = self.template(request.question_id, labels)
        draws = self.options.samples or request.samples
        choices: list[Mapping[str, Any]] = []
        if self._server_samples and draws > 1:
            payload = await self._post(self.build_body(request, draw=0, server_draws=draws))
            choices = _choices(payload)
            if len(choices) < draws:
                # An engine without diffusion_samples ignores it and returns one draw: read the
                # rest client-side, now and from here on.
                log.warning("vLLM returned %d of %d diffusion_samples draws; drawing client-side",
                            len(choices), draws)
                self._server_samples = False
        missing = range(len(choices), draws)
        payloads = await asyncio.gather(
            *(self._post(self.build_body(request, draw=j)) for j in missing))
        choices = choices[:draws] + [c for p in payloads for c in _choices(p)[:1]]
        reads = [slot_distribution(c, template.slot, template.label_ids) for c in choices]
        proba = [math.fsum(r[0][i] for r in reads) / len(reads) for i in range(len(labels))]
        raw = {
            "draws": len(reads),
            "entropy_nats": [r[1]["entropy_nats"] for r in reads],
            "label_mass": [r[1]["label_mass"] for r in reads],
        }
        return OptionScores(request.option_names, tuple(proba), raw)

    async def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self._poster.post("/v1/chat/completions", body)

    def canvas_width(self, template: AnswerTemplate) -> int:
        """The smallest multiple of ``canvas_step`` holding the template and the turn close."""
        step, rows = self.options.canvas_step, len(template.ids) + 1
        return min(self.options.canvas_length, math.ceil(rows / step) * step)

    def seed_canvas(self, template: AnswerTemplate, seed: int) -> list[int]:
        canvas = [*template.ids, self.options.turn_close_id]
        canvas += [self.options.pad_id] * (self.canvas_width(template) - len(canvas))
        canvas[template.slot] = random.Random(seed).randrange(self.options.vocab_size)
        return canvas

    def build_body(self, request: DecisionRequest, *, draw: int,
                   server_draws: int | None = None) -> dict[str, Any]:
        o = self.options
        labels = labels_for(request, self.alphabet)
        template = self.template(request.question_id, labels)
        width = self.canvas_width(template)
        xargs: dict[str, Any] = {
            "diffusion_seed_canvas": self.seed_canvas(template, request.seed + DRAW_SEED_STRIDE * draw),
            "diffusion_canvas_length": width,
            "diffusion_max_steps": o.steps,
            "diffusion_read_only": True,
        }
        if o.steps > 1 or server_draws:  # hold the template: only the slot may change
            xargs["diffusion_pinned"] = [i for i in range(width) if i != template.slot]
        if server_draws:
            xargs["diffusion_samples"] = server_draws
        if o.constrained:
            xargs["diffusion_constrained"] = True
        return {
            "model": self.model,
            "messages": [
                {"role": "system", "content": system_text(request, labels)},
                {"role": "user", "content": request.state},
            ],
            "max_tokens": len(template.ids) + 1,
            "logprobs": True,
            "top_logprobs": o.top_logprobs,
            "logprob_token_ids": sorted(template.label_ids)[:VLLM_LABEL_CAP],
            "return_tokens_as_token_ids": True,
            "chat_template_kwargs": {"enable_thinking": o.enable_thinking},
            "vllm_xargs": xargs,
        }

    async def ready(self) -> bool:
        return await self._poster.get_ok("/health") and await self._upstream.still_same()

    async def aclose(self) -> None:
        await self._poster.aclose()


def _choices(payload: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices:
        raise BackendMalformed("vLLM answer has no choices")
    return choices


def slot_distribution(
    choice: Mapping[str, Any], slot: int, label_ids: Sequence[int]
) -> tuple[list[float], dict[str, float]]:
    """Probabilities over ``label_ids`` (in that order) from one choice's logprobs at ``slot``."""
    try:
        entry = choice["logprobs"]["content"][slot]
        returned: dict[int, float] = {}
        for item in [entry, *entry.get("top_logprobs", [])]:
            returned[_token_id(item["token"])] = float(item["logprob"])
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise BackendMalformed(f"vLLM answer has no readable logprobs at slot {slot}") from exc
    finite = [v for v in returned.values() if math.isfinite(v)]
    if not finite:
        raise BackendMalformed(f"vLLM returned no finite logprobs at slot {slot}")
    floor = min(finite) - MISSING_LABEL_PENALTY
    logits = [returned.get(t, floor) if math.isfinite(returned.get(t, floor)) else floor
              for t in label_ids]
    top = max(logits)
    weights = [math.exp(x - top) for x in logits]
    total = math.fsum(weights)
    probs = [math.exp(v) for v in finite]
    diagnostics = {
        "entropy_nats": -math.fsum(p * math.log(p) for p in probs if p > 0),
        "label_mass": math.fsum(math.exp(returned[t]) for t in label_ids if t in returned),
    }
    return [w / total for w in weights], diagnostics


def _token_id(token: Any) -> int:
    """vLLM's ``return_tokens_as_token_ids`` spelling: "token_id:1234"."""
    text = str(token)
    if not text.startswith("token_id:"):
        raise ValueError(f"token {text!r} is not in the token_id:N form")
    return int(text.removeprefix("token_id:"))
