"""compose.yaml and the Dockerfile, checked statically: Docker cannot run on the development
machine, so this proves the files parse and wire what the design says, not that images build."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import yaml

from router.backends.options import VllmOptions
from router.settings import Settings
from tests.conftest import ROOT


def compose() -> dict[str, Any]:
    parsed: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text())
    return parsed


def test_compose_wires_slotgate_redis_and_vllm_by_service_name() -> None:
    services = compose()["services"]
    assert set(services) == {"slotgate", "redis", "vllm"}
    slotgate = services["slotgate"]
    assert slotgate["build"] == {"context": ".", "dockerfile": "Dockerfile"}
    env = slotgate["environment"]
    assert env["SLOTGATE_CACHE__REDIS_URL"] == "redis://redis:6379/0"
    assert env["SLOTGATE_FAST__KIND"] == "vllm" and env["SLOTGATE_FAST__URL"] == "http://vllm:8000"
    assert json.loads(env["SLOTGATE_FAST__OPTIONS"])["model"] == "dgemma"
    assert slotgate["depends_on"]["redis"]["condition"] == "service_healthy"
    assert "vllm" in slotgate["depends_on"]
    assert services["redis"]["healthcheck"]["test"][-1] == "ping"


def test_compose_environment_is_what_settings_accept(monkeypatch: Any) -> None:
    env = compose()["services"]["slotgate"]["environment"]
    for name, value in env.items():
        if name.startswith("SLOTGATE_"):
            monkeypatch.setenv(name, re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", str(value)))
    settings = Settings()
    assert settings.cache.redis_url == "redis://redis:6379/0"
    assert settings.fast.kind == "vllm" and settings.fast.url == "http://vllm:8000"
    assert settings.fast.options_as(VllmOptions).model == "dgemma"
    assert settings.slow.model is None  # SLOTGATE_SLOW_MODEL unset: escalation unavailable


def test_vllm_serves_diffusiongemma_with_the_protocol_flags_on_a_gpu() -> None:
    vllm = compose()["services"]["vllm"]
    args = [str(a) for a in vllm["command"]]
    assert vllm["entrypoint"] == ["vllm", "serve"]
    assert args[0] == "google/diffusiongemma-26B-A4B-it"
    flags = dict(itertools.pairwise(args))
    assert json.loads(flags["--diffusion-config"]) == {"canvas_length": 64}
    assert flags["--max-logprobs"] == "32" and flags["--served-model-name"] == "dgemma"
    assert "--enable-prefix-caching" in args and flags["--port"] == "8000"
    [device] = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]


def test_dockerfile_installs_the_package_without_torch_and_serves() -> None:
    text = (ROOT / "Dockerfile").read_text()
    lines = [line for line in text.splitlines() if line and not line.lstrip().startswith("#")]
    assert lines[0] == "FROM python:3.11-slim"
    assert any(re.match(r"RUN pip install \.( |$)", line) for line in lines)
    assert "torch" not in " ".join(lines)
    cmd = json.loads(next(line for line in lines if line.startswith("CMD "))[4:])
    assert cmd[:2] == ["slotgate", "serve"] and "0.0.0.0" in cmd
    for line in lines:  # everything copied into the image exists in the repository
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), f"Dockerfile copies {source}, which is missing"
    assert Path(ROOT / "pyproject.toml").is_file()
