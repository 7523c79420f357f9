"""One pydantic options model per fast backend: ``fast.options`` is validated against the model of
``fast.kind`` when settings load, so a misspelt or ill-typed option is a start-up error that names
it. Light on purpose (pydantic only): settings import this module, never the backends themselves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator

from router.backends.options_base import BackendOptions

GroupingMode = Literal["combined", "chained"]
Dialect = Literal["example", "openjev", "jev"]
VLLM_LABEL_CAP = 128  # vLLM's per-request cap on logprob_token_ids (MAX_LOGPROB_TOKEN_IDS)
ENGINE_VOCAB = 262_144  # DiffusionGemma's vocabulary: the bound vLLM checks canvas ids against


class MockOptions(BackendOptions):
    """``top_proba`` on the first option and the rest spread evenly; None = uniform."""

    top_proba: float | None = Field(None, ge=0, le=1)


class SklearnOptions(BackendOptions):
    """No options: the artifact at ``fast.model_path`` says everything."""


class EmbeddingOptions(BackendOptions):
    """No options: the artifact at ``fast.model_path`` names its encoder."""


class RetryOptions(BackendOptions):
    """The HTTP backends' retry rules (``http_post``)."""

    retries_5xx: int = Field(1, ge=0)
    max_retry_wait_s: float = Field(2.0, ge=0)


class SystemOneOptions(RetryOptions):
    """``dialect`` picks the default model name and caps; ``max_options`` overrides the choice cap.
    ``samples`` (a count or "auto") overrides the request's draws. ``joint``: the questions of one
    stage go upstream in one body and are read jointly, as a client calling the server directly
    gets them; False asks one question per request. ``server_revision`` names the server build
    (its prompt template is out of sight) for the fingerprint. ``steps``/``think``/``chunk_rows``/
    ``chunk_prompt`` are the example server's engine knobs, forwarded when set. ``constrained`` and
    ``engine_samples`` say the server runs with ``--constrained`` / ``--engine-samples``. ``stages``: who
    runs the stages of a body with ``depends_on``/``ask_if``: ``"server"`` sends the body whole,
    so later stages continue the answers the server gave, as for its own clients (the example
    dialect's default); ``"router"`` reads stage by stage (OpenJev and Jev ignore dependencies,
    so it is the only choice there)."""

    dialect: Dialect = "example"
    model: str | None = None
    max_options: int | None = Field(None, ge=2)
    grouping: GroupingMode = "combined"
    group_size: int | None = Field(None, ge=2)
    samples: Annotated[int, Field(ge=1)] | Literal["auto"] | None = None
    joint: bool = True
    server_revision: str = ""
    steps: int | None = Field(None, ge=1, le=8)
    think: int | None = Field(None, ge=0, le=4096)
    chunk_rows: int | None = Field(None, ge=8)
    chunk_prompt: Literal["shared", "own"] | None = None
    stages: Literal["server", "router"] | None = None
    # The server's --constrained: reads over the labels only, so label probabilities always
    # sum to 1 (another meaning of every probability: part of the fingerprint). The server
    # does not report it; say it here. --engine-samples (a fixed count as one engine request)
    # draws otherwise than one request per draw: part of the fingerprint too.
    constrained: bool = False
    engine_samples: bool = False

    @field_validator("stages")
    @classmethod
    def _stages_need_a_server_that_runs_them(cls, value: str | None,
                                             info: ValidationInfo) -> str | None:
        dialect = info.data.get("dialect", "example")
        if value == "server" and dialect != "example":
            raise ValueError(f'"server" needs the example dialect: {dialect} servers ignore '
                             'depends_on and ask_if (use "router")')
        return value

    @property
    def server_runs_stages(self) -> bool:
        return (self.stages or ("server" if self.dialect == "example" else "router")) == "server"


class VllmOptions(RetryOptions):
    """Reads DiffusionGemma's answer slot straight from vLLM (``vllm.py``).

    The prompt, labels and canvas follow the example server's template (``TEMPLATE_VERSION``).
    ``tokenizer_path``: a LOCAL folder with the served model's tokenizer (default
    ``fast.model_path``). ``labels``: the choice labels past the server's A-Z (checked against the
    tokenizer at start-up). ``steps``: ``diffusion_max_steps`` (1 is the one-step read vLLM
    recognises; more pins the template, as the server does). ``samples`` overrides the request's
    draws; ``server_samples`` asks for them as one ``diffusion_samples`` request (newer vLLM; an
    engine that returns fewer draws is read client-side from then on). ``vocab_size`` is the
    engine's vocabulary (noise ids are drawn below it), not the tokenizer's length.
    """

    model: str = "dgemma"
    tokenizer_path: Path | None = None
    labels: list[str] | None = None
    label_cap: int = Field(VLLM_LABEL_CAP, ge=2, le=VLLM_LABEL_CAP)
    thought_block: str = "<|channel>thought\n<channel|>"
    turn_close_id: int = Field(106, ge=0)  # Gemma's <turn|>
    pad_id: int = Field(0, ge=0)
    canvas_length: int = Field(64, ge=2)
    canvas_step: int = Field(16, ge=1)
    vocab_size: int = Field(ENGINE_VOCAB, ge=2)
    top_logprobs: int = Field(20, ge=0)
    steps: int = Field(1, ge=1, le=8)
    samples: int | None = Field(None, ge=1)
    server_samples: bool = False
    constrained: bool = False
    enable_thinking: bool = False
    grouping: GroupingMode = "combined"
    group_size: int | None = Field(None, ge=2)


def options_model(kind: str) -> type[BackendOptions]:
    """The options model of backend ``kind`` (TorchOptions lives beside its backend, imported here
    when asked for; it subclasses BackendOptions from options_base.py, not from here, so the two
    modules do not import each other)."""
    if kind == "torch":
        from router.backends.torch.options import TorchOptions

        return TorchOptions
    models: dict[str, type[BackendOptions]] = {
        "mock": MockOptions, "sklearn": SklearnOptions, "embedding": EmbeddingOptions,
        "systemone": SystemOneOptions, "vllm": VllmOptions,
    }
    if kind not in models:
        raise ValueError(f"unknown fast backend kind {kind!r}")
    return models[kind]


def parse_options(kind: str, raw: Any) -> BackendOptions:
    """``raw`` (a mapping, or an options model) as ``kind``'s options model; ValueError naming
    every bad option and the options the backend takes."""
    model = options_model(kind)
    if isinstance(raw, BackendOptions):
        if not isinstance(raw, model):  # ValueError: pydantic reports it as the field's error
            raise ValueError(  # noqa: TRY004
                f"{type(raw).__name__} are not options of the {kind} backend "
                f"(it takes {model.__name__})")
        return raw
    try:
        return model.model_validate(raw if raw is not None else {})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'options'}: "
            + ("not an option of this backend" if err["type"] == "extra_forbidden" else err["msg"])
            for err in exc.errors()
        )
        raise ValueError(f"options for the {kind} backend: {problems} "
                         f"(it takes {sorted(model.model_fields)})") from None


__all__ = [
    "BackendOptions", "EmbeddingOptions", "MockOptions", "SklearnOptions", "SystemOneOptions",
    "VllmOptions", "options_model", "parse_options",
]
