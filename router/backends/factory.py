"""Builds the configured fast backend. Each backend module is imported only when its kind is
configured, so a deployment never loads torch or an HTTP client it does not use."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from policies.types import DecisionRequest
from router.backends.base import FastBackend
from router.backends.options import MockOptions
from router.errors import BackendError, ConfigError
from router.settings import FastBackendSettings

# kind -> (module, class). A module may instead offer ``build(settings) -> FastBackend``;
# otherwise the class is built with ``from_settings(settings)``, or from ``model_path`` alone.
_BACKENDS = {
    "sklearn": ("router.backends.sklearn", "SklearnBackend"),
    "embedding": ("router.backends.embedding", "EmbeddingBackend"),
    "systemone": ("router.backends.systemone", "SystemOneBackend"),
    "vllm": ("router.backends.vllm", "VllmBackend"),
    "torch": ("router.backends.torch.backend", "TorchBackend"),
}
_FROM_MODEL_PATH = ("sklearn", "embedding")  # their constructors take the artifact path only


async def learn_upstreams(backends: Sequence[tuple[str, FastBackend]], *,
                          strict: bool = True) -> None:
    """Each (config field, backend) learns what its server says of itself before its
    fingerprint is used. ``strict``: a server that cannot be asked is a ConfigError naming the
    field (``cache purge --tier`` needs the fingerprint). Not strict (the server's start-up): the
    tier's reads fail, so its decisions escalate, until a readiness probe reaches the server,
    as with any fast-tier outage; /readyz says not ready meanwhile."""
    for field, backend in backends:
        try:
            await backend.learn_upstream(strict=strict)
        except BackendError as exc:
            raise ConfigError(
                f"{field}: cannot learn which model the {backend.name} server serves (GET "
                f"/v1/models): {exc}; start it first: each policy is checked against the model "
                "it was tuned on", field=field) from exc


def build_backend(settings: FastBackendSettings) -> FastBackend:
    """The backend ``settings.kind`` names; ConfigError (naming the kind) when it cannot be built."""
    if settings.kind == "mock":
        return _mock_backend(settings)
    module_name, class_name = _BACKENDS[settings.kind]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"fast backend kind {settings.kind!r}: cannot import {module_name} ({exc})") from exc
    cls: Any = getattr(module, class_name, None)
    try:
        if hasattr(module, "build"):
            backend = module.build(settings)
        elif cls is not None and hasattr(cls, "from_settings"):
            backend = cls.from_settings(settings)
        elif cls is not None and settings.kind in _FROM_MODEL_PATH:
            backend = cls(settings.model_path)
        else:
            raise ConfigError(
                f"fast backend kind {settings.kind!r}: {module_name} has neither build(settings) "
                f"nor {class_name}.from_settings(settings)")
    except ConfigError as exc:
        raise ConfigError(f"fast backend kind {settings.kind!r}: {exc.message}",
                          field=exc.field) from exc
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"fast backend kind {settings.kind!r}: {exc}") from exc
    if not isinstance(backend, FastBackend):
        raise ConfigError(f"fast backend kind {settings.kind!r} did not build a FastBackend")
    return backend


def _mock_backend(settings: FastBackendSettings) -> FastBackend:
    """A demo backend: ``options.top_proba`` on the first option (default: uniform)."""
    from router.backends.mock import MockBackend

    top = settings.options_as(MockOptions).top_proba

    def handler(request: DecisionRequest) -> Sequence[float]:
        k = len(request.options)
        if top is None:
            return [1.0 / k] * k
        return [top] + [(1.0 - top) / (k - 1)] * (k - 1)

    return MockBackend(handler, label=f"config-mock:{top}")
