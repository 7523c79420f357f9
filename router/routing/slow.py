"""The slow path: the one module that imports litellm (lazily: it takes seconds to import).
Decisions go to the slow model with the options enforced by a JSON-schema response format, are
validated, and get one corrective retry; other chat requests pass through, streaming included.
The completion function is injectable (``litellm.acompletion`` by default), so the prompt,
retry and passthrough rules are testable without HTTP.

litellm's exceptions are translated once, here, into router.errors' SlowPathError subtree.
Messages are sanitised first: provider keys never reach an error, a log line or a response.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import orjson

from policies.types import DecisionRequest
from router.errors import (
    NO_SLOW_MODEL,
    Forbidden,
    InvalidRequest,
    NoSlowModel,
    PayloadTooLarge,
    SlotgateError,
    SlowPathError,
    SlowPathInvalidAnswer,
    SlowPathRateLimited,
    SlowPathTimeout,
    SlowPathUnavailable,
    TooManyRequests,
)
from router.retry_after import retry_after_s
from router.routing.backpressure import ConcurrencyLimit
from router.routing.credentials import Credentials
from router.routing.credentials import resolve as resolve_credentials
from router.routing.deadline import deadline_in, queue_refusal, remaining_s
from router.routing.litellm_import import import_shared_dependencies
from router.routing.litellm_import import litellm_module as _litellm
from router.routing.litellm_import import warm_up as _warm_up
from router.routing.ports import SlowAnswer

if TYPE_CHECKING:
    from router.settings import SlowPathSettings

logger = logging.getLogger(__name__)
PROVIDER_GRACE_S = 0.25  # past litellm's own timeout, the call is cancelled (a provider ignoring it)
WARM_UP_POLL_S = 0.02  # how often a call waiting for litellm's background import looks again

LOADING = "available once litellm is loaded (escalations wait for it)"
# ``litellm.acompletion``'s shape: keyword arguments in; a ModelResponse (``choices[0].message
# .content``, ``model_dump()``) out, or an async iterator of chunks when ``stream=True``.
Completion = Callable[..., Awaitable[Any]]
# OpenAI chat-completion fields passed to litellm as arguments. Any other field goes to the
# upstream in the request body (``extra_body``), never to litellm, whose own keyword arguments
# (mock_response, fallbacks, callbacks...) a client must not reach.
PASSTHROUGH_FIELDS = frozenset({
    "messages", "model", "stream", "stream_options", "temperature", "top_p", "n", "stop",
    "max_tokens", "max_completion_tokens", "presence_penalty", "frequency_penalty", "logit_bias",
    "user", "response_format", "seed", "tools", "tool_choice", "parallel_tool_calls", "logprobs",
    "top_logprobs", "reasoning_effort", "modalities", "prediction", "audio", "service_tier",
    "store", "functions", "function_call",
})
_KEY_PATTERNS = re.compile(r"(Bearer\s+)\S+|\b(sk|pk|rk|key|token)-[A-Za-z0-9_\-]{6,}",
                           re.IGNORECASE)


def response_format(options: Sequence[str]) -> dict[str, Any]:
    """The JSON-schema response format that confines the answer to ``options``."""
    schema = {"type": "object", "properties": {"answer": {"type": "string", "enum": list(options)}},
              "required": ["answer"], "additionalProperties": False}
    return {"type": "json_schema",
            "json_schema": {"name": "slotgate_decision", "schema": schema, "strict": True}}


def options_prompt(request: DecisionRequest) -> str:
    lines = [f"- {o.name}" + (f": {o.description}" if o.description else "") for o in request.options]
    return "\n".join([
        *([request.context] if request.context else []),
        f"Question: {request.instructions}", "Options:", *lines,
        'Answer with JSON {"answer": "<option>"} where <option> is exactly one option name.',
    ])


def decision_messages(request: DecisionRequest) -> list[dict[str, Any]]:
    """The question and its options as a system message, then the caller's conversation (or the
    state as the user message): the last user message stays the input being decided about."""
    system = {"role": "system", "content": options_prompt(request)}
    if request.turns:
        return [system, *({"role": role, "content": text} for role, text in request.turns)]
    if request.images:  # shown ahead of the state, as the System One server shows them
        return [system, {"role": "user", "content": [
            *({"type": "image_url", "image_url": {"url": url}} for url in request.images),
            {"type": "text", "text": request.state}]}]
    return [system, {"role": "user", "content": request.state}]


def parse_answer(content: str | None, options: Sequence[str]) -> str | None:
    """The option in ``content`` ({"answer": x}, a JSON string, or the bare name), else None."""
    if not content:
        return None
    text = content.strip()
    try:
        value: Any = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nested past the parser's reach
        value = text
    if isinstance(value, dict):
        value = value.get("answer")
    return value if isinstance(value, str) and value in options else None


class SlowPath:
    """The slow LLM behind litellm, configured by ``settings.slow`` (a ``SlowModel``).

    ``limit`` is the one concurrency cap on the slow model, decisions and passthrough alike (the
    app sizes its wait queue by ``max_queue``, past which callers get 429); without one, calls
    wait for ``settings.max_concurrency`` slots. ``completion`` replaces ``litellm.acompletion``
    (tests); its exceptions are translated as litellm's are."""

    def __init__(self, settings: SlowPathSettings, *, completion: Completion | None = None,
                 limit: ConcurrencyLimit | None = None,
                 trace_headers: Callable[[], dict[str, str]] | None = None) -> None:
        self.settings = settings
        self._completion = completion
        # The W3C trace context of the current span, sent with each call (tracing on only).
        self._trace_headers = trace_headers
        self._limit = limit or ConcurrencyLimit(
            "slow path", capacity=settings.max_concurrency, max_waiting=sys.maxsize,
            on_reject=lambda: None)
        # Everything that could be a provider key: ours, and the key variables litellm reads.
        secrets = [settings.api_key.get_secret_value()] if settings.api_key else []
        secrets += [v for k, v in os.environ.items()
                    if k.endswith(("_API_KEY", "_KEY", "_TOKEN", "_SECRET")) and len(v) >= 8]
        self._secrets = sorted({s for s in secrets if s}, key=len, reverse=True)
        # Set once litellm is imported and warm (or never will be here): the app freezes the
        # start-up heap after it (router/http/startup_freeze.py).
        self.warmed_up = threading.Event()
        self._credentials: dict[str, Credentials] = {}  # by model, checked once each
        if settings.model and completion is None and "litellm" not in sys.modules:
            # litellm takes seconds to import: start now, off the event loop, so that the first
            # escalation neither pays for it nor blocks the loop for every other request.
            import_shared_dependencies()  # first: litellm_import.py says why
            threading.Thread(target=self._warm_up, name="slotgate-litellm-warm-up",
                             daemon=True).start()
        else:
            if settings.model and completion is None:
                self._check_credentials()
            self.warmed_up.set()

    @property
    def available(self) -> bool:
        """A slow model is configured and nothing known stops a call (its credentials are
        checked once litellm is loaded; until then this is optimistic)."""
        return self.unavailable_reason is None

    @property
    def unavailable_reason(self) -> str | None:
        """Why escalation cannot work (no model, no credentials), or None."""
        if not self.settings.model:
            return NO_SLOW_MODEL
        known = self._credentials.get(self.settings.model)
        return known.problem if known is not None else None

    @property
    def status(self) -> str:
        """For /readyz: "available", LOADING, or why escalation is unavailable."""
        if self.unavailable_reason is not None:
            return self.unavailable_reason
        return "available" if self.warmed_up.is_set() else LOADING

    @property
    def model(self) -> str | None:
        return self.settings.model

    async def ask(self, request: DecisionRequest) -> SlowAnswer:
        """One of ``request``'s options from the slow model; raises SlowPathError subclasses."""
        return await self._ask(request, what="escalation", acquire=True)

    async def audit(self, request: DecisionRequest) -> SlowAnswer:
        """``ask`` for an audit: outside the clients' concurrency cap, so an audit never holds
        a slot a client's escalation waits for. Audits have a budget of their own instead: the
        monitor's ``monitoring.audit_workers`` calls at most."""
        return await self._ask(request, what="audit", acquire=False)

    async def _ask(self, request: DecisionRequest, *, what: str, acquire: bool) -> SlowAnswer:
        model = self._require_model(what)
        options = request.option_names
        convo = decision_messages(request)
        start = time.perf_counter()
        content: str | None = None
        for attempt in (1, 2):
            response = await self._acompletion(
                _acquire=acquire, model=model, messages=convo,
                response_format=response_format(options))
            content = response.choices[0].message.content if response.choices else None
            answer = parse_answer(content, options)
            if answer is not None:
                return SlowAnswer(answer, model, (time.perf_counter() - start) * 1e3, attempt)
            convo = [*convo, {"role": "assistant", "content": (content or "")[:2000]},
                     {"role": "user", "content": _correction(content, options)}]
        raise SlowPathInvalidAnswer(
            f"slow model {model} gave no valid option after one corrective retry "
            f"(last answer: {self._sanitise((content or '')[:200])!r})")

    def supports_images(self) -> bool:
        """Whether the slow model takes images: ``slow.vision`` when set, else litellm's
        ``supports_vision`` (False for a model litellm does not know)."""
        model = self.settings.model
        if not model or self.settings.vision is not None:
            return bool(model) and bool(self.settings.vision)
        return bool(_litellm().supports_vision(model))

    async def ask_messages(self, messages: list[dict[str, Any]]) -> tuple[str | None, str]:
        """The slow model's reply to ``messages`` (a span question, which no option list
        confines) and the model's name; as ``ask``, under the cap and ``slow.timeout_s``."""
        model = self._require_model("escalation")
        response = await self._acompletion(model=model, messages=messages,
                                           response_format={"type": "json_object"})
        return (response.choices[0].message.content if response.choices else None), model

    async def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """A non-decision chat request passed through; returns the OpenAI-shaped response."""
        kwargs = self._passthrough(body)
        response = await self._acompletion(_caller_model=True, **kwargs)
        return dict(response.model_dump())

    async def stream(self, body: dict[str, Any]) -> AsyncIterator[bytes]:
        """SSE bytes as chunks arrive: ``data: {chunk}\\n\\n`` ... ``data: [DONE]\\n\\n``.
        Failures before the first chunk raise SlowPathError (the caller can still answer with an
        error status); later ones end the stream with an SSE ``{"error": ...}`` event."""
        kwargs = self._passthrough(body)
        sent_any = False
        async with contextlib.AsyncExitStack() as slot:
            # The slot is held for the whole stream; the wait for it and the call's start come
            # out of slow.timeout_s, as for every other caller of the cap.
            with deadline_in(self.settings.timeout_s):
                await slot.enter_async_context(self._limit.acquire())
                response = await self._acompletion(_acquire=False, _caller_model=True,
                                                   stream=True, **kwargs)
            try:
                async for chunk in response:
                    sent_any = True
                    yield b"data: " + json.dumps(chunk.model_dump(exclude_none=True)).encode() + b"\n\n"
            except Exception as exc:  # noqa: BLE001 - translated once, here
                error = self._translate(exc)
                if not sent_any:
                    raise error from None
                body_ = {"error": {"message": error.message, "type": error.error_type}}
                yield b"data: " + json.dumps(body_).encode() + b"\n\n"
                return
            finally:
                closer = getattr(response, "aclose", None)
                if closer is not None:
                    await closer()
        yield b"data: [DONE]\n\n"

    async def _warm(self) -> None:
        """Wait, without blocking the event loop, for the warm-up thread's import of litellm:
        importing it here meanwhile would hold the loop on the import lock for seconds (every
        request, /healthz included, would wait). Cancellable: the caller's deadline still holds."""
        while not self.warmed_up.is_set():
            await asyncio.sleep(WARM_UP_POLL_S)

    async def aclose(self) -> None:
        """Close the HTTP clients litellm cached for the running event loop. litellm keeps them
        process-wide, keyed by loop, and never closes them, so a stopped app would leave its
        upstream connections (and its loop's transports) open. Other loops' clients are kept.
        While the warm-up thread is still importing litellm (a SIGTERM or a failed port bind in
        the first seconds) no call has been made, so there is nothing to close; touching the
        half-imported package then would raise KeyError: 'litellm'."""
        if "litellm" not in sys.modules or not self.warmed_up.is_set():
            return
        from litellm.caching.evicted_client_closer import running_loop_token

        cache = _litellm().in_memory_llm_clients_cache
        suffix = f"-{running_loop_token()}"
        for key in [k for k in list(cache.cache_dict) if isinstance(k, str) and k.endswith(suffix)]:
            client = cache.cache_dict.get(key)
            cache._remove_key(key)
            close = getattr(client, "aclose", None) or getattr(client, "close", None)
            if close is not None:
                result = close()
                if asyncio.iscoroutine(result):
                    await result

    def _require_model(self, what: str) -> str:
        if not self.settings.model:
            raise NoSlowModel(what)
        reason = self.unavailable_reason
        if reason is not None:
            raise SlowPathUnavailable(reason)
        return self.settings.model

    def _check_credentials(self, model: str | None = None) -> Credentials:
        """The credentials of ``model`` (the configured one by default), checked once. An
        injected completion (tests) is not litellm: whatever is configured is passed as it is."""
        model = model or self.settings.model or ""
        known = self._credentials.get(model)
        if known is None:
            api_key = self.settings.api_key.get_secret_value() if self.settings.api_key else None
            if self._completion is not None:
                return Credentials(api_key)
            known = self._credentials[model] = resolve_credentials(
                model, api_base=self.settings.api_base, api_key=api_key,
                check_environment=_litellm().validate_environment)
            if known.problem and model == self.settings.model:
                logger.warning("ESCALATION UNAVAILABLE: %s", known.problem)
        return known

    def _warm_up(self) -> None:
        try:
            _warm_up()
            self._check_credentials()
        finally:
            self.warmed_up.set()

    def _passthrough(self, body: dict[str, Any]) -> dict[str, Any]:
        """litellm's arguments for a passthrough ``body``. Credential fields were refused by the
        request model (router/http/openai/wire.py); the model allow-list is checked here."""
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            raise InvalidRequest("messages must be a non-empty list", field="messages")
        configured = self._require_model("passthrough")
        model = body.get("model") or configured
        if model in self.settings.model_aliases:
            model = configured
        allowed = {configured, *self.settings.allowed_models}
        if model not in allowed:
            raise Forbidden(f"model {model!r} is not allowed; allowed: {sorted(allowed)}",
                            field="model")
        kwargs = {k: v for k, v in body.items() if k in PASSTHROUGH_FIELDS and k != "stream"}
        extra = {k: v for k, v in body.items() if k not in PASSTHROUGH_FIELDS}
        return {**kwargs, "model": model, **({"extra_body": extra} if extra else {})}

    async def _acompletion(self, *, _acquire: bool = True, _caller_model: bool = False,
                           **kwargs: Any) -> Any:
        """The completion under the timeout (and the concurrency cap unless ``_acquire`` is False).
        ``_caller_model``: the model is the client's pick (passthrough), so a model litellm cannot
        route is the client's error (400 naming ``model``), not a failing upstream (502)."""
        self._refuse_oversized(kwargs)
        if self._completion is None and not self.warmed_up.is_set():
            await self._warm()
        completion = self._completion or _litellm().acompletion
        # One budget for the wait for a slot and the call: an escalation's deadline
        # (router/routing/deadline.py), which also keeps a corrective retry from taking a second
        # full timeout, or else a passthrough's own, slow.timeout_s from now. Past it a wait for a
        # slot is the queue's refusal (429), never a slow-model timeout (504).
        with deadline_in(self.settings.timeout_s):
            budget_s = remaining_s(self.settings.timeout_s)
            if budget_s <= 0:
                raise SlowPathTimeout(f"slow model: no time left of slow.timeout_s = "
                                      f"{self.settings.timeout_s:g} s")
            kwargs.update(timeout=budget_s, max_retries=0, num_retries=0)
            if self._trace_headers is not None and (traced := self._trace_headers()):
                kwargs["extra_headers"] = {**kwargs.get("extra_headers", {}), **traced}
            if self.settings.api_base:
                kwargs["api_base"] = self.settings.api_base
            api_key = self._check_credentials(kwargs["model"]).api_key
            if api_key:
                kwargs["api_key"] = api_key
            try:
                # The outer bound guards against a provider that ignores ``timeout``.
                async with asyncio.timeout(budget_s + PROVIDER_GRACE_S):
                    if not _acquire:
                        return await completion(**kwargs)
                    async with self._limit.acquire():
                        return await completion(**kwargs)
            except TooManyRequests:
                raise  # our own queue is full: already in the error tree, nothing to translate
            except Exception as exc:  # noqa: BLE001 - every litellm failure is translated once, here
                if isinstance(exc, TimeoutError) and (refused := queue_refusal()) is not None:
                    raise refused from None  # the wait for a slot ran out: a 429, not a 504
                self._raise_translated(exc, caller_model=_caller_model)

    def _refuse_oversized(self, kwargs: dict[str, Any]) -> None:
        """413 before the call for a request over ``slow.max_request_bytes`` (its JSON, which is
        what litellm sends): the slow model's server would refuse it, or cut the upload, which
        reaches us as the slow model being unavailable or failing, not as the request's size."""
        limit = self.settings.max_request_bytes
        size = len(orjson.dumps(kwargs, default=str))
        if size > limit:
            raise PayloadTooLarge(_too_large_message(f"would be {size} bytes", limit),
                                  field="body")

    def _raise_translated(self, exc: Exception, *, caller_model: bool = False) -> NoReturn:
        error = self._translate(exc, caller_model=caller_model)
        leaked = self._sanitise(f"{exc}{exc!r}") != f"{exc}{exc!r}"
        logger.warning("slow path failed: %s: %s", type(error).__name__, error.message)
        if leaked:  # keep the foreign exception (and its key) out of every traceback
            raise error from None
        raise error from exc

    def _translate(self, exc: BaseException, *, caller_model: bool = False) -> SlotgateError:
        litellm = _litellm()
        detail = self._sanitise(str(exc))[:500]
        if (caller_model and isinstance(exc, litellm.BadRequestError)
                and "LLM Provider NOT provided" in str(exc)):
            model = self._sanitise(str(getattr(exc, "model", None) or ""))[:200]
            return InvalidRequest(
                f"model {model!r} names no provider litellm can route (use a litellm model "
                "string such as 'openai/<name>')", field="model")
        if getattr(exc, "status_code", None) == 413:  # the slow model's server: over its limit
            refused = "was refused as too large by the slow model's server"
            return PayloadTooLarge(_too_large_message(refused, self.settings.max_request_bytes),
                                   field="body")
        if isinstance(exc, litellm.RateLimitError):
            return SlowPathRateLimited(f"slow model rate limited: {detail}",
                                       retry_after_s=_retry_after_s(exc))
        if isinstance(exc, (litellm.Timeout, TimeoutError)):
            return SlowPathTimeout(f"slow model timed out after {self.settings.timeout_s:g} s: {detail}")
        if isinstance(exc, (litellm.APIConnectionError, litellm.ServiceUnavailableError,
                            litellm.InternalServerError, litellm.BadGatewayError)):
            return SlowPathUnavailable(f"slow model unavailable: {detail}")
        return SlowPathError(f"slow model call failed: {type(exc).__name__}: {detail}")

    def _sanitise(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return _KEY_PATTERNS.sub(lambda m: (m.group(1) or "") + "***", text)


def _too_large_message(what: str, limit: int) -> str:
    return (f"the request to the slow model {what}; slow.max_request_bytes = {limit} (a "
            "decision's options are sent twice, in the prompt and in the answer schema): send "
            "fewer or shorter options, or set slow.max_request_bytes to what the slow model's "
            "server accepts")


def _correction(content: str | None, options: Sequence[str]) -> str:
    return (f"Your answer {(content or '')[:200]!r} is not valid. Reply with JSON "
            '{"answer": "<option>"} where <option> is exactly one of: '
            + ", ".join(json.dumps(o) for o in options))


def _retry_after_s(exc: BaseException) -> float | None:
    """What the upstream's headers (on litellm's exception or its response) ask to wait."""
    response = getattr(exc, "response", None)
    headers = dict(getattr(response, "headers", None) or {})
    headers.update(getattr(exc, "headers", None) or {})
    return retry_after_s(headers)
