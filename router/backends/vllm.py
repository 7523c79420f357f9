"""Fast backend that reads the answer slot of DiffusionGemma served by vLLM, through vLLM's
OpenAI chat API and the diffusion request fields (protocol notes, section 5).

The prompt is built here: the system turn holds the static part (context, question, options each
with a one-token label) and the user turn holds the state, LAST, so vLLM's prefix cache reuses
the static part across messages. The seed canvas is ``thought block + answer prefix + [slot] +
turn close + pad``; the slot holds a seeded uniformly random id (the model has no mask token;
noise is the mask). One read-only denoise step returns logprobs at every canvas position; the
slot's entries give the distribution: a label the server did not return gets (lowest returned
logprob - 5), then softmax over the labels. Draws are averaged.

Up to ``label_cap`` options (vLLM's 128 ids per request) are read in one slot; beyond it, the
read is grouped (``grouping``).
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from policies.types import DecisionRequest, OptionScores, canonical_hash
from router.backends.base import DRAW_SEED_STRIDE, FastBackend
from router.backends.grouping import GroupingMode, grouped_read
from router.backends.http_post import JsonPoster
from router.backends.labels import (
    LabelAlphabet,
    build_alphabet,
    check_alphabet,
    default_candidates,
    load_tokenizer,
)
from router.backends.systemone import checked_options
from router.errors import BackendMalformed, ConfigError
from router.settings import FastBackendSettings

TEMPLATE_VERSION = "slotgate-vllm-v1"  # bump whenever the prompt or canvas layout changes
DEFAULT_PREAMBLE = (
    "Answer one question about the message in the user turn. "
    "Reply with the label of exactly one option."
)
VLLM_LABEL_CAP = 128  # vLLM's per-request cap on logprob_token_ids (MAX_LOGPROB_TOKEN_IDS)
MISSING_LABEL_PENALTY = 5.0  # the example server's rule for labels absent from the logprobs
SETTINGS_OPTIONS = frozenset({
    "model", "tokenizer_path", "labels", "label_cap", "preamble", "thought_block",
    "answer_prefix", "label_prefix", "turn_close_id", "pad_id", "canvas_length", "canvas_step",
    "vocab_size",
    "top_logprobs", "samples", "server_samples", "constrained", "enable_thinking", "grouping",
    "group_size", "retries_5xx", "max_retry_wait_s",
})


class VllmBackend(FastBackend):
    """Reads ``POST {url}/v1/chat/completions`` with ``vllm_xargs`` diffusion fields.

    ``tokenizer_path`` is a LOCAL folder with the served model's tokenizer (or pass
    ``tokenizer``). ``labels`` names the label alphabet (checked strictly); by default it is
    built from A-Z, a-z, 0-9, AA-ZZ. ``label_prefix`` is what precedes a label in the slot when
    its token is looked up (" " where the model writes " A" after "answer:"; unverified for
    DiffusionGemma, so it is a setting and part of the fingerprint). ``samples`` overrides the request's draws;
    ``server_samples`` sends them as one ``diffusion_samples`` request (newer vLLM) instead of
    parallel requests; ``constrained`` sends ``diffusion_constrained``.
    """

    name = "vllm"

    def __init__(
        self,
        *,
        url: str,
        model: str = "dgemma",
        tokenizer_path: Path | str | None = None,
        tokenizer: Any = None,
        labels: Sequence[str] | None = None,
        label_prefix: str = "",
        label_cap: int = VLLM_LABEL_CAP,
        preamble: str = DEFAULT_PREAMBLE,
        thought_block: str = "<|channel>thought\n<channel|>",
        answer_prefix: str = "answer:",
        turn_close_id: int = 106,  # Gemma's <turn|>
        pad_id: int = 0,
        canvas_length: int = 64,
        canvas_step: int = 16,
        vocab_size: int | None = None,
        top_logprobs: int = 20,
        samples: int | None = None,
        server_samples: bool = False,
        constrained: bool = False,
        enable_thinking: bool = False,
        grouping: GroupingMode = "combined",
        group_size: int | None = None,
        api_key: str | None = None,
        timeout_s: float = 10.0,
        max_concurrency: int = 16,
        retries_5xx: int = 1,
        max_retry_wait_s: float = 2.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if tokenizer is None:
            if tokenizer_path is None:
                raise ConfigError("the vllm backend needs tokenizer_path (a local folder)")
            tokenizer = load_tokenizer(tokenizer_path)
        if not 2 <= label_cap <= VLLM_LABEL_CAP:
            raise ConfigError(f"label_cap must be in [2, {VLLM_LABEL_CAP}], got {label_cap}")
        self.model = model
        self.alphabet: LabelAlphabet = (
            check_alphabet(tokenizer, [label_prefix + label for label in labels[:label_cap]])
            if labels else build_alphabet(
                tokenizer, limit=label_cap,
                candidates=[label_prefix + c for c in default_candidates()])
        )
        self.label_prefix = label_prefix
        self.vocab_size = vocab_size or len(tokenizer)
        self.preamble = preamble
        self.canvas_length = canvas_length
        self.canvas_step = canvas_step
        self.turn_close_id = turn_close_id
        self.pad_id = pad_id
        self.top_logprobs = top_logprobs
        self.samples = samples
        self.server_samples = server_samples
        self.constrained = constrained
        self.enable_thinking = enable_thinking
        self.grouping: GroupingMode = grouping
        self.group_size = group_size
        self._template_text = (thought_block, answer_prefix)
        self._template = [
            *tokenizer.encode(thought_block, add_special_tokens=False),
            *tokenizer.encode(answer_prefix, add_special_tokens=False),
            pad_id,  # the slot, overwritten with noise per draw
        ]
        rows = len(self._template) + 1  # + turn close
        if rows > canvas_length:
            raise ConfigError(f"answer template is {rows} tokens; the canvas holds {canvas_length}")
        self.canvas_width = min(canvas_length, math.ceil(rows / canvas_step) * canvas_step)
        if any(not 0 <= t < self.vocab_size for t in (*self._template, turn_close_id, pad_id)):
            raise ConfigError(f"template ids must lie in [0, {self.vocab_size})")
        self._poster = JsonPoster(
            base_url=url, api_key=api_key, timeout_s=timeout_s, max_concurrency=max_concurrency,
            retries_5xx=retries_5xx, max_retry_wait_s=max_retry_wait_s, transport=transport,
            what="vLLM server",
        )

    @classmethod
    def from_settings(cls, settings: FastBackendSettings) -> VllmBackend:
        """Built from ``fast.url``, ``fast.model_path`` (the LOCAL tokenizer folder, unless
        ``fast.options.tokenizer_path`` names it), ``fast.api_key``, ``fast.timeout_s``,
        ``fast.max_concurrency`` and the remaining keyword options in ``fast.options``."""
        if not settings.url:
            raise ConfigError("the vllm backend needs fast.url", field="fast.url")
        options = checked_options(settings.options, SETTINGS_OPTIONS, "vllm")
        options.setdefault("tokenizer_path", settings.model_path)
        return cls(
            url=settings.url,
            api_key=settings.api_key.get_secret_value() if settings.api_key else None,
            timeout_s=settings.timeout_s,
            max_concurrency=settings.max_concurrency,
            **options,
        )

    @property
    def slot_position(self) -> int:
        return len(self._template) - 1

    def identity(self) -> Mapping[str, Any]:
        return {
            "backend": self.name,
            "model": self.model,
            "template": TEMPLATE_VERSION,
            "prompt": canonical_hash([self.preamble, *self._template_text])[:16],
            "canvas": [self.canvas_length, self.canvas_width],
            "samples": self.samples,
            "server_samples": self.server_samples,
            "constrained": self.constrained,
            "labels": list(self.alphabet.labels),
            "grouping": [self.grouping, self.group_size],
        }

    async def read(self, requests: Sequence[DecisionRequest]) -> list[OptionScores]:
        return list(await asyncio.gather(*(self._read(r) for r in requests)))

    async def _read(self, request: DecisionRequest) -> OptionScores:
        cap = len(self.alphabet)
        if len(request.options) > cap:
            return await grouped_read(request, self._read_one, max_options=cap,
                                      mode=self.grouping, group_size=self.group_size)
        if len(request.options) == 1:
            return OptionScores(request.option_names, (1.0,), {"reads": 0})
        return await self._read_one(request)

    async def _read_one(self, request: DecisionRequest) -> OptionScores:
        draws = self.samples or request.samples
        label_ids = self.alphabet.ids[: len(request.options)]
        if self.server_samples and draws > 1:
            payloads = [await self._post(self.build_body(request, draw=0, server_draws=draws))]
        else:
            payloads = await asyncio.gather(
                *(self._post(self.build_body(request, draw=j)) for j in range(draws))
            )
        reads = [
            slot_distribution(choice, self.slot_position, label_ids)
            for payload in payloads for choice in _choices(payload)
        ]
        proba = [math.fsum(r[0][i] for r in reads) / len(reads) for i in range(len(label_ids))]
        raw = {
            "draws": len(reads),
            "entropy_nats": [r[1]["entropy_nats"] for r in reads],
            "label_mass": [r[1]["label_mass"] for r in reads],
        }
        return OptionScores(request.option_names, tuple(proba), raw)

    async def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self._poster.post("/v1/chat/completions", body)

    def system_text(self, request: DecisionRequest) -> str:
        """The static part of the prompt: identical for every state of one question."""
        lines = [request.context.strip(), ""] if request.context.strip() else []
        lines += [self.preamble, f"Question {request.question_id}: {request.instructions}"]
        shown = (label.removeprefix(self.label_prefix) for label in self.alphabet.labels)
        for label, option in zip(shown, request.options):
            detail = f" ({option.description})" if option.description else ""
            lines.append(f"  {label}: {option.name}{detail}")
        return "\n".join(lines)

    def seed_canvas(self, seed: int) -> list[int]:
        canvas = list(self._template)
        canvas[self.slot_position] = random.Random(seed).randrange(self.vocab_size)
        canvas.append(self.turn_close_id)
        return canvas + [self.pad_id] * (self.canvas_width - len(canvas))

    def build_body(self, request: DecisionRequest, *, draw: int,
                   server_draws: int | None = None) -> dict[str, Any]:
        label_ids = sorted(self.alphabet.ids[: len(request.options)])
        xargs: dict[str, Any] = {
            "diffusion_seed_canvas": self.seed_canvas(request.seed + DRAW_SEED_STRIDE * draw),
            "diffusion_canvas_length": self.canvas_width,
            "diffusion_read_only": True,
        }
        if server_draws:
            xargs["diffusion_samples"] = server_draws
            xargs["diffusion_pinned"] = [
                i for i in range(self.canvas_width) if i != self.slot_position
            ]
        if self.constrained:
            xargs["diffusion_constrained"] = True
        return {
            "model": self.model,
            "messages": [
                {"role": "system", "content": self.system_text(request)},
                {"role": "user", "content": request.state},
            ],
            "max_tokens": len(self._template) + 1,
            "logprobs": True,
            "top_logprobs": self.top_logprobs,
            "logprob_token_ids": label_ids,
            "return_tokens_as_token_ids": True,
            "chat_template_kwargs": {"enable_thinking": self.enable_thinking},
            "vllm_xargs": xargs,
        }

    async def ready(self) -> bool:
        return await self._poster.get_ok("/health")

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
