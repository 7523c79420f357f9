"""All of slotgate's settings, read once at start-up (YAML file, then ``SLOTGATE_*`` environment
variables, which win) and passed down. Fitted artifacts (models, policies) are files named here."""

from __future__ import annotations

import difflib
import logging
import os
import re
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)
from pydantic_settings.exceptions import SettingsError

from policies.scope import UnscopedMode
from router.backends.options import BackendOptions, parse_options
from router.errors import ConfigError

ENV_PREFIX = "SLOTGATE_"
# SLOTGATE_* variables that name no setting on purpose: read by the Makefile, the tests, the
# benchmarks and compose.yaml (the tokenizer folder it mounts), never by the settings.
NOT_SETTINGS = frozenset({"SLOTGATE_DATA_DIR", "SLOTGATE_TOKENIZER_DIR",
                          "SLOTGATE_BENCH_RESULTS", "SLOTGATE_TEST_CACHE"})
# Cache namespaces become part of Redis keys (router/store/cache.py): no ':' or spaces.
NAMESPACE_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,64}")
BackendKind = Literal["mock", "sklearn", "embedding", "systemone", "vllm", "torch"]
OptionsT = TypeVar("OptionsT", bound=BackendOptions)


class Section(BaseModel):
    """A settings section: a key it does not know is refused naming it (``slow.timout_s``), as
    one at the top level is, instead of being ignored."""

    model_config = ConfigDict(extra="forbid")


class FastBackendSettings(Section):
    """Which fast backend to build and its options: ``options`` is validated against the options
    model of ``kind`` (router/backends/options.py) when settings load."""

    # The tier's name in cascade policy files (``slotgate tune --tier NAME=COST``); the first
    # tier's is this one, later tiers' are in ``tiers``.
    name: str = Field("fast", pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    kind: BackendKind = "sklearn"
    model_path: Path | None = None  # sklearn/embedding artifact, or a local model folder
    url: str | None = None  # systemone / vllm server
    api_key: SecretStr | None = None
    options: BackendOptions = Field(default_factory=dict, validate_default=True)
    timeout_s: float = Field(0.25, gt=0)  # past it the decision escalates
    # The fast tier reads at most this many characters of the state (the head): a 900 KB
    # message must not make every read time out and keep working after it did.
    max_input_chars: int = Field(20_000, ge=1)
    max_concurrency: int = Field(64, ge=1)

    @field_validator("options", mode="before")
    @classmethod
    def _options_of_kind(cls, value: Any, info: ValidationInfo) -> BackendOptions:
        kind = info.data.get("kind")
        if kind is None:  # kind itself failed validation; that error is reported already
            return BackendOptions()
        return parse_options(kind, value)

    def options_as(self, model: type[OptionsT]) -> OptionsT:
        """The options as ``model`` (what the backend of ``kind`` reads)."""
        options = self.options
        if not isinstance(options, model):
            raise TypeError(f"fast.options are {type(options).__name__}, not {model.__name__}")
        return options


class TierSettings(FastBackendSettings):
    """A fast tier read after the first (``fast``) when a cascade policy's earlier tiers turn a
    decision down: a fast backend section with a name of its own (docs/cascade.md)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")


class SlowPathSettings(Section):
    """The slow LLM behind litellm. ``model`` is any litellm model string; None = no escalation."""

    model: str | None = None
    api_base: str | None = None
    api_key: SecretStr | None = None
    # One budget for a slow call: the wait for a slot (429 past it), the call and a decision's
    # corrective retry (504 past it); a stream's wait and start, not the whole stream.
    timeout_s: float = Field(30.0, gt=0)
    max_concurrency: int = Field(32, ge=1)
    # The largest request sent to the slow model; a larger one is a 413 naming this setting,
    # before any call. 1 MiB: the default body limit of nginx and of aiohttp servers, which often
    # front a model server. A decision's options go to the slow model twice (prompt and schema).
    max_request_bytes: int = Field(2**20, ge=1024)
    # Models a passthrough request may name; empty = only ``model`` itself.
    allowed_models: list[str] = Field(default_factory=list)
    # Names a passthrough request may use for "the configured slow model": the README's clients
    # send model="any" for decisions (the name is ignored there), and the same client's plain
    # chat must not get a 403 for it. An empty list makes every name literal.
    model_aliases: list[str] = Field(default_factory=lambda: ["any"])
    # When the slow path is down, answer with the fast read marked "unverified" instead of an error.
    serve_unverified_on_failure: bool = False
    # Whether ``model`` takes images (a System One body with images is a 400 naming it when
    # not); None: litellm's ``supports_vision`` says, False for a model litellm does not know.
    vision: bool | None = None


class CacheSettings(Section):
    redis_url: str | None = None  # None: in-process LRU
    ttl_s: int = Field(7 * 24 * 3600, ge=1)
    max_entries: int = Field(100_000, ge=1)  # in-process LRU size
    namespace: str = "default"
    # Redis is a cache: while it is down decisions are still answered (slower, uncached), so by
    # default /readyz stays 200 and reports it; true makes a down Redis take the replica out.
    required: bool = False
    # The cross-replica claim on a slow answer lives this long unless its holder renews it (every
    # third of it): a replica that dies holding one frees the question within about this time.
    claim_ttl_s: float = Field(3.0, gt=0)

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        if not NAMESPACE_PATTERN.fullmatch(value):
            raise ValueError(f"must be 1-64 characters of A-Z a-z 0-9 _ . - (no ':'), got {value!r}")
        return value


class PolicySettings(Section):
    files: list[Path] = Field(default_factory=list)  # tuned policy files (slotgate tune --out)
    default: str | None = None  # name of the policy used when none matches the signature
    # The rule for decisions no tuned policy covers and no default names:
    fallback_threshold: float = Field(0.9, ge=0, le=1)
    # What a decision no loaded policy covers (its question was never tuned on) gets:
    # "escalate", "shadow", "unverified" or "threshold" (the fallback threshold above); see
    # policies/scope.py. Unset: "threshold" when fallback_threshold is set, else "escalate".
    unscoped: UnscopedMode | None = None
    allow_fingerprint_mismatch: bool = False
    # Shadow mode for every decision whose policy file does not say otherwise (its own
    # ``shadow`` wins): the slow model answers and is served, the fast read is logged. The cold
    # start with no labels; in it, policy files may be missing until they are first tuned.
    shadow: bool = False
    # Reload the policy files when they change on disk (SIGHUP always reloads); an invalid
    # new file is refused with a log line naming it and the loaded policies keep serving.
    watch: bool = True
    # A file whose content no longer matches its digest (edited after tuning), or unsigned
    # under ``signing_key``: "refuse" it (naming the file), or serve it "unguaranteed" (its
    # decisions carry no guarantee).
    on_edited: Literal["refuse", "unguaranteed"] = "refuse"
    # Signed policies: `slotgate tune` signs with this key (SLOTGATE_POLICY__SIGNING_KEY) and
    # the router serves only files signed with it.
    signing_key: SecretStr | None = None

    @property
    def signing_key_bytes(self) -> bytes | None:
        return None if self.signing_key is None else self.signing_key.get_secret_value().encode()

    @property
    def unscoped_mode(self) -> UnscopedMode:
        if self.unscoped is not None:
            return self.unscoped
        return "threshold" if "fallback_threshold" in self.model_fields_set else "escalate"


class MonitoringSettings(Section):
    """Production monitoring of tuned policies (docs/monitoring.md); what to audit and what an
    alarm does are per policy, in the policy files."""

    enabled: bool = True
    audit_queue: int = Field(1000, ge=1)  # audits waiting beyond it are dropped (counted)
    audit_workers: int = Field(2, ge=1)  # concurrent audit calls to the slow model
    # With cache.redis_url: an alarm one replica raises is latched by every replica serving the
    # policy, within alarm_sync_s (router/store/alarm_board.py).
    share_alarms: bool = True
    alarm_sync_s: float = Field(2.0, gt=0)


LabelRole = Literal["refused", "logged", "trusted"]


class FeedbackSettings(Section):
    """Who may label logged decisions (``POST /v1/feedback``) and whose labels the accuracy alarm
    counts, per API key (docs/monitoring.md, "Labels"): "refused" (403), "logged" (the label is
    logged and exported, never counted by the alarm) or "trusted" (counted too). Keys are named
    by their sha256 hex digest, as in ``api_key_hashes``; a key not named gets ``default_role``,
    and so does every caller of a server without API keys."""

    default_role: LabelRole = "logged"
    roles: dict[str, LabelRole] = Field(default_factory=dict)

    @field_validator("roles")
    @classmethod
    def _hex_keys(cls, value: dict[str, LabelRole]) -> dict[str, LabelRole]:
        for h in value:
            if len(h) != 64 or any(c not in "0123456789abcdef" for c in h.lower()):
                raise ValueError(f"feedback.roles: {h!r} is not a sha256 hex digest "
                                 "(64 hex characters) of an API key")
        return {h.lower(): role for h, role in value.items()}

    def role_of(self, namespace: str) -> LabelRole:
        """The role of the caller whose cache namespace is ``namespace``: the admission guard
        names a key's namespace ``key-`` and the first 16 hex digits of its sha256."""
        for digest, role in self.roles.items():
            if namespace == f"key-{digest[:16]}":
                return role
        return self.default_role


class PassthroughSettings(Section):
    """Plain chat and other ``/v1/...`` POSTs to a ``systemone`` tier's own server
    (docs/proxy.md, "Passthrough to the System One server"): a request whose ``model`` names a
    model that server lists on ``GET /v1/models`` is relayed to it as sent, streaming included."""

    enabled: bool = True
    # How long a server's model list is reused; a failed fetch is retried after models_retry_s.
    models_ttl_s: float = Field(30.0, gt=0)
    models_retry_s: float = Field(5.0, gt=0)
    # A relayed call's budget to connect and between bytes (a long generation keeps sending).
    timeout_s: float = Field(600.0, gt=0)
    # Relayed calls open at once per server; past it plus max_queue waiting: 429.
    max_concurrency: int = Field(64, ge=1)


class LogSettings(Section):
    decision_log_path: Path = Path("var/decisions.jsonl")
    redis_stream: str = "slotgate:v1:log"
    # The in-memory index /v1/feedback reads (recent decisions; older ones are found in Redis
    # when configured): bounded by entries and by bytes, whatever the messages' size.
    max_index: int = Field(100_000, ge=1)
    max_index_bytes: int = Field(32 * 2**20, ge=1024)
    # Records answered while the log's file cannot take them (a full disk), kept in memory and
    # written in order when it can; beyond this many bytes they are dropped and counted.
    spool_bytes: int = Field(16 * 2**20, ge=0)


class TracingSettings(Section):
    """OpenTelemetry traces (docs/proxy.md): a span per decision, exported over OTLP/HTTP, the
    W3C ``traceparent`` of a request taken as its parent and sent on to the slow model. Off by
    default; needs the ``tracing`` extra (opentelemetry-sdk and its OTLP exporter)."""

    enabled: bool = False
    # The collector's OTLP/HTTP traces URL; None: the exporter's own default, or the standard
    # OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT variables.
    otlp_endpoint: str | None = Field(None, pattern=r"^https?://")
    service_name: str = Field("slotgate", min_length=1)
    # The decision's message text and answer as span attributes: off, since traces often go to
    # a store with wider access than the decision log.
    record_text: bool = False


class BudgetSettings(Section):
    """An escalation budget per API key (docs/proxy.md): at most ``limit`` units of slow calls
    in each fixed window of ``window_s`` seconds, a slow call costing ``call_cost`` units (1:
    the budget counts calls; a price: it counts money). Shared through Redis when
    ``cache.redis_url`` is set. ``on_spent``: what a decision that needs the slow model gets
    once its key's budget is spent. Off while ``limit`` is unset."""

    limit: float | None = Field(None, gt=0)
    window_s: float = Field(3600.0, gt=0)
    call_cost: float = Field(1.0, gt=0)
    on_spent: Literal["unverified", "refuse", "cheaper_model"] = "refuse"
    cheaper_model: str | None = None  # a litellm model string, for on_spent: cheaper_model
    per_key: dict[str, float] = Field(default_factory=dict)  # key sha256 hex -> its own limit

    @model_validator(mode="after")
    def _consistent(self) -> BudgetSettings:
        if self.on_spent == "cheaper_model" and not self.cheaper_model:
            raise ValueError("budget.cheaper_model: on_spent 'cheaper_model' needs a model to "
                             "answer with (a litellm model string)")
        for digest, limit in self.per_key.items():
            if not re.fullmatch(r"[0-9a-f]{64}", digest):
                raise ValueError(f"budget.per_key: {digest!r} is not a key's sha256 hex digest "
                                 "(64 lowercase hex digits, as in api_key_hashes)")
            if limit <= 0:
                raise ValueError(f"budget.per_key[{digest[:16]}...]: the limit must be > 0")
        return self


class Settings(BaseSettings):
    """slotgate's configuration. Nested fields use ``__`` in the environment, e.g.
    ``SLOTGATE_CACHE__REDIS_URL``. ``SLOTGATE_SLOW_MODEL`` / ``SLOTGATE_SLOW_API_BASE`` are
    accepted as shorthands for ``slow.model`` / ``slow.api_base``."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid"
    )

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    max_body_bytes: int = Field(1_000_000, ge=1024)
    max_options: int = Field(1024, ge=2)
    max_questions: int = Field(64, ge=1)
    max_queue: int = Field(1024, ge=1)  # decisions waiting beyond the backend caps -> 429
    api_key_hashes: list[str] = Field(default_factory=list)  # sha256 hex of client keys; empty = open
    # sha256 hex of the keys that open the operator page (/operator); empty = the page is off
    admin_key_hashes: list[str] = Field(default_factory=list)
    # Per client key (one bucket for all when no keys are configured): requests per second, None = off.
    rate_limit_rps: float | None = Field(None, gt=0)
    rate_limit_burst: int = Field(20, ge=1)
    access_log: bool = False  # uvicorn's line per request (`slotgate serve`); costs 5-9% CPU
    # How long `slotgate serve` keeps an idle keep-alive connection open. Longer than any client
    # pool's idle expiry (httpx 5 s, aiohttp 15 s, load balancers 60 s): a server that closes
    # first races the client reusing the connection, which gets a ReadError (docs/reliability.md).
    keep_alive_s: int = Field(75, ge=1)
    # Open connections `slotgate serve` keeps; past it a new one closes the connection idle
    # longest (router/http/connections.py). None: the open-file limit less 128.
    max_connections: int | None = Field(None, ge=2)
    # The fast tiers in the order a policy reads them. Written once, as ``tiers:`` naming every
    # tier (the first is read first; ``fast:`` left out). The form with the first tier under
    # ``fast:`` and the later ones under ``tiers:`` is read too, and said once at start-up. Once
    # loaded, ``fast`` is the first tier and ``tiers`` the later ones (``all_tiers``: every one).
    fast: FastBackendSettings = Field(default_factory=FastBackendSettings)
    tiers: list[TierSettings] = Field(default_factory=list)
    slow: SlowPathSettings = Field(default_factory=SlowPathSettings)
    cache: CacheSettings = Field(default_factory=CacheSettings)
    policy: PolicySettings = Field(default_factory=PolicySettings)
    log: LogSettings = Field(default_factory=LogSettings)
    monitoring: MonitoringSettings = Field(default_factory=MonitoringSettings)
    feedback: FeedbackSettings = Field(default_factory=FeedbackSettings)
    passthrough: PassthroughSettings = Field(default_factory=PassthroughSettings)
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    budget: BudgetSettings = Field(default_factory=BudgetSettings)
    slow_model: str | None = None  # shorthand, folded into slow.model
    slow_api_base: str | None = None  # shorthand, folded into slow.api_base
    _split_tier_form: bool = PrivateAttr(default=False)

    @field_validator("api_key_hashes", "admin_key_hashes")
    @classmethod
    def _hex_hashes(cls, value: list[str], info: ValidationInfo) -> list[str]:
        for h in value:
            if len(h) != 64 or any(c not in "0123456789abcdef" for c in h.lower()):
                raise ValueError(f"{info.field_name} must be sha256 hex digests (64 hex "
                                 "characters)")
        return [h.lower() for h in value]

    @model_validator(mode="after")
    def _tiers_in_order(self) -> Settings:
        """Every tier named once, in order: ``tiers`` alone lists them all (its first becomes
        ``fast``); ``fast`` with ``tiers`` is the first and the later ones. Names distinct."""
        if "fast" not in self.model_fields_set and self.tiers:
            first, *later = self.tiers
            object.__setattr__(self, "fast", first)
            object.__setattr__(self, "tiers", later)
        elif self.tiers:
            self._split_tier_form = True
        names = [tier.name for tier in self.all_tiers]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise ValueError(f"tiers: tier name {name!r} is used twice (every tier's name "
                                 "must be distinct)")
        return self

    @property
    def all_tiers(self) -> list[FastBackendSettings]:
        """Every fast tier in the order a policy reads them, the first first."""
        return [self.fast, *self.tiers]

    @property
    def split_tier_form(self) -> bool:
        """Whether the tiers were written with the first under ``fast:`` and the later ones
        under ``tiers:`` (read, and said once at start-up)."""
        return self._split_tier_form

    def model_post_init(self, context: Any, /) -> None:
        if self.slow_model and not self.slow.model:
            self.slow.model = self.slow_model
        if self.slow_api_base and not self.slow.api_base:
            self.slow.api_base = self.slow_api_base

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        yaml_file = init_settings.init_kwargs.pop("_yaml_file", None)  # type: ignore[attr-defined]
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if yaml_file is not None:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=yaml_file))
        return tuple(sources)


def load_settings(config: Path | None = None, **overrides: Any) -> Settings:
    """Settings from an optional YAML file plus the environment; ``overrides`` win over both.
    Every problem is a ConfigError whose message says where the bad value came from: the
    ``SLOTGATE_*`` variable that set it, or the config file."""
    if config is not None:
        if not config.is_file():
            raise ConfigError(f"--config {config}: file not found", field="config")
        # Parse once here so a YAML error names the file, not a pydantic internals path.
        try:
            yaml.safe_load(config.read_text(encoding="utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise ConfigError(f"--config {config}: not valid YAML: {exc}", field="config") from exc
    _refuse_unknown_variables()
    try:
        settings = (Settings(_yaml_file=config, **overrides)  # type: ignore[call-arg]
                    if config is not None else Settings(**overrides))
    except SettingsError as exc:  # a SLOTGATE_* value pydantic-settings could not even parse
        raise ConfigError(f"environment: {exc}", field="environment") from exc
    except ValidationError as exc:
        raise ConfigError(_describe(exc, config, overrides), field="settings") from exc
    if settings.split_tier_form:
        logging.getLogger("slotgate").warning(
            "settings: the first fast tier is under `fast:` and the later ones under `tiers:`; "
            "`tiers:` alone can list every tier in read order (%s)",
            ", ".join(t.name for t in settings.all_tiers))
    return settings


def _refuse_unknown_variables() -> None:
    """A ``SLOTGATE_*`` variable whose top-level name is no setting is a ConfigError naming it
    (pydantic-settings would ignore it), as an unknown key inside a section is refused."""
    known = {ENV_PREFIX + name.upper() for name in Settings.model_fields}
    for variable in sorted(os.environ):
        name = variable.upper()
        if (not name.startswith(ENV_PREFIX) or name in NOT_SETTINGS
                or name.split("__")[0] in known):
            continue
        close = difflib.get_close_matches(name, _variable_names(), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(f"environment variable {variable}: no setting is named so{hint}; "
                          f"settings are {ENV_PREFIX}<NAME>, and {ENV_PREFIX}<SECTION>__<KEY> "
                          "inside a section", field="environment")


def _variable_names() -> list[str]:
    """The variables that set each setting and each key of a section."""
    names = []
    for name, field in Settings.model_fields.items():
        names.append(ENV_PREFIX + name.upper())
        section = field.annotation
        if isinstance(section, type) and issubclass(section, BaseModel):
            names += [f"{ENV_PREFIX}{name.upper()}__{key.upper()}"
                      for key in section.model_fields]
    return names


def _describe(exc: ValidationError, config: Path | None, overrides: dict[str, Any]) -> str:
    """Each complaint with its source: the override, the SLOTGATE_* variable holding the field
    (or a parent of it, for JSON values), else the config file."""
    environment = {name.upper(): name for name in os.environ if name.upper().startswith(ENV_PREFIX)}
    lines = []
    for error in exc.errors():
        loc = [str(part) for part in error["loc"]]
        field = ".".join(loc) or "settings"
        source = None
        if loc and loc[0] in overrides:
            source = "command line"
        for depth in range(len(loc), 0, -1):
            name = ENV_PREFIX + "__".join(loc[:depth]).upper()
            if source is None and name in environment:
                source = f"environment variable {environment[name]}"
        if source is None and loc[:1] == ["slow"] and len(loc) > 1:
            shorthand = f"{ENV_PREFIX}SLOW_{loc[1].upper()}"
            if shorthand in environment:
                source = f"environment variable {environment[shorthand]}"
        if source is None:
            source = f"--config {config}" if config is not None else "settings"
        lines.append(f"{source}: {field}: {error['msg']}")
    return "; ".join(lines)
