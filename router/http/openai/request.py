"""The request models of the OpenAI chat-completions subset slotgate speaks: the fields it reads,
every other field kept and forwarded untouched; clients' credentials refused."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from router.errors import Forbidden

# Body fields that would let a client pick the upstream or its credentials (``extra_body`` would
# smuggle any of them): refused on every request, decision or passthrough, with a 403 naming it.
CREDENTIAL_FIELDS = frozenset({
    "api_base", "base_url", "api_key", "api_version", "custom_llm_provider", "extra_headers",
    "headers", "organization", "deployment_id", "litellm_params", "aws_access_key_id",
    "aws_secret_access_key", "vertex_credentials", "azure_ad_token", "extra_body",
})


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class SlotgateOptions(BaseModel):
    """slotgate's own request extension (``extra_body={"slotgate": {...}}`` in the OpenAI SDK)."""

    model_config = ConfigDict(extra="forbid")

    policy: str | None = Field(None, min_length=1, max_length=200)


class ChatCompletionRequest(BaseModel):
    """The fields slotgate reads; every other field is kept and forwarded untouched."""

    model_config = ConfigDict(extra="allow")

    # Optional only for the example server's chat variant (its README's call names none); every
    # other chat request needs it (routes.py answers its absence as pydantic did).
    model: str | None = Field(None, min_length=1)
    messages: list[ChatMessage] = Field(min_length=1)
    response_format: ResponseFormat | None = None
    structured_outputs: dict[str, Any] | None = None  # vLLM: {"choice": [...]} among others
    guided_choice: list[Any] | None = None  # vLLM's older spelling
    stream: bool = False
    n: int | None = None
    slotgate: SlotgateOptions | None = None

    @model_validator(mode="after")
    def _no_client_credentials(self) -> ChatCompletionRequest:
        # Forbidden is not a ValueError, so pydantic lets it through to the app's error mapping
        # as the 403 it is (a ValueError would become a 400 validation error).
        chosen = sorted(CREDENTIAL_FIELDS & set(self.model_extra or {}))
        if chosen:
            raise Forbidden(f"{chosen[0]} cannot be set by clients; the upstream is configured "
                            "by the operator", field=chosen[0])
        return self

    def upstream_body(self) -> dict[str, Any]:
        """The request as the client sent it, minus slotgate's own extension."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True, exclude={"slotgate"})
