"""The base of every fast backend's options model, alone in its module so that options models
living beside their backends (``torch/options.py``) and the registry of them (``options.py``)
both import it without importing each other (tests/test_architecture.py checks the pair)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class BackendOptions(BaseModel):
    """Base of every backend's options: unknown keys are refused, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)
