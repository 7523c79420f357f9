"""deploy/kubernetes, rendered by ``kubectl kustomize`` (the base, and the overlay of
docs/kubernetes.md with a tuned policy file) and each manifest checked: the probes on the
endpoints they mean, the policy ConfigMap mounted where the settings name it, the image, Redis
behind the address the settings give, and a PodDisruptionBudget over the server's pods. No
cluster here: this proves what is applied, not that a cluster runs it."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from policies.file import PolicyFile
from router.http.app import SHUTDOWN_DRAIN_S
from router.settings import Settings
from tests.conftest import ROOT
from tests.policies.test_file import make_policy
from tests.test_doc_blocks import doc_blocks

BASE = ROOT / "deploy" / "kubernetes"


def kustomize(folder: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    # .ci/run installs kubectl when the machine lacks it: a skip here would hide a broken base.
    assert kubectl is not None, "kubectl is not installed (.ci/run installs kubernetes-client)"
    done = subprocess.run([kubectl, "kustomize", str(folder)], check=False, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [m for m in yaml.safe_load_all(done.stdout) if m]


def reads_directories_as_resources() -> bool:
    """kubectl 1.21 and later (kustomize v4+); Debian 12's kubectl 1.20 reads a base directory
    only under ``bases:``."""
    done = subprocess.run(["kubectl", "version", "--client"], check=False, capture_output=True,
                          text=True, timeout=30)
    found = re.search(r"v1\.(\d+)", done.stdout)
    return found is None or int(found.group(1)) >= 21


def one(manifests: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [m for m in manifests if m["kind"] == kind and m["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name}: {len(found)} rendered"
    return found[0]


def config_map(manifests: list[dict[str, Any]], prefix: str) -> dict[str, Any]:
    """The ConfigMap kustomize generated from ``prefix`` (its name carries a content hash)."""
    found = [m for m in manifests if m["kind"] == "ConfigMap"
             and re.fullmatch(rf"{prefix}-[a-z0-9]{{10}}", m["metadata"]["name"])]
    assert len(found) == 1, [m["metadata"]["name"] for m in manifests]
    return found[0]


def server(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    container: dict[str, Any] = one(manifests, "StatefulSet", "slotgate")["spec"]["template"][
        "spec"]["containers"][0]
    return container


def settings_of(manifests: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings as a replica reads them: the settings ConfigMap's entries as its environment."""
    for name, value in config_map(manifests, "slotgate-settings")["data"].items():
        monkeypatch.setenv(name, value)
    return Settings()


def test_the_base_probes_readiness_and_liveness_where_they_mean_it() -> None:
    manifests = kustomize(BASE)
    container = server(manifests)
    assert container["image"] == "slotgate"
    assert container["ports"] == [{"name": "http", "containerPort": 8080}]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    # model loading precedes listening: liveness waits behind a startup probe of minutes
    startup = container["startupProbe"]
    assert startup["httpGet"]["path"] == "/healthz"
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120
    pod = one(manifests, "StatefulSet", "slotgate")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > SHUTDOWN_DRAIN_S
    assert pod["securityContext"]["runAsUser"] == 10001  # the Dockerfile's user


def test_the_base_mounts_the_policy_config_map_and_keeps_the_log_on_a_volume(
        monkeypatch: pytest.MonkeyPatch) -> None:
    manifests = kustomize(BASE)
    container = server(manifests)
    statefulset = one(manifests, "StatefulSet", "slotgate")
    policies = config_map(manifests, "slotgate-policies")
    volumes = {v["name"]: v for v in statefulset["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert volumes["policies"]["configMap"]["name"] == policies["metadata"]["name"]
    assert mounts["policies"] == {"name": "policies", "mountPath": "/etc/slotgate/policies",
                                  "readOnly": True}
    settings = settings_of(manifests, monkeypatch)
    log_dir = str(settings.log.decision_log_path.parent)
    claims = [c["metadata"]["name"] for c in statefulset["spec"]["volumeClaimTemplates"]]
    assert mounts["var"]["mountPath"] == log_dir and "var" in claims
    env_from = container["envFrom"]
    assert env_from[0] == {"configMapRef": {"name": config_map(
        manifests, "slotgate-settings")["metadata"]["name"]}}
    assert env_from[1] == {"secretRef": {"name": "slotgate-secrets", "optional": True}}


def test_the_base_runs_redis_where_the_settings_look_for_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    manifests = kustomize(BASE)
    redis_url = settings_of(manifests, monkeypatch).cache.redis_url
    assert redis_url == "redis://slotgate-redis:6379/0"
    service = one(manifests, "Service", "slotgate-redis")
    assert service["spec"]["ports"][0]["port"] == 6379
    redis = one(manifests, "Deployment", "slotgate-redis")["spec"]["template"]
    assert service["spec"]["selector"].items() <= redis["metadata"]["labels"].items()
    container = redis["spec"]["containers"][0]
    assert container["image"].startswith("redis:")
    assert container["readinessProbe"]["exec"]["command"] == ["redis-cli", "ping"]


def test_the_disruption_budget_and_services_select_the_server_pods() -> None:
    manifests = kustomize(BASE)
    labels = one(manifests, "StatefulSet", "slotgate")["spec"]["template"]["metadata"]["labels"]
    budget = one(manifests, "PodDisruptionBudget", "slotgate")
    assert budget["apiVersion"] == "policy/v1" and budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    for name in ("slotgate", "slotgate-pods"):
        spec = one(manifests, "Service", name)["spec"]
        assert spec["selector"].items() <= labels.items()
        assert spec["ports"][0]["targetPort"] == "http"


def test_the_documented_overlay_serves_its_policy_file_with_its_image(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    overlay = [b.text for b in doc_blocks("docs/kubernetes.md")
               if b.lang == "yaml" and "kind: Kustomization" in b.text]
    assert len(overlay) == 1
    text = overlay[0]
    if not reads_directories_as_resources():
        text = text.replace("resources:\n  - ../kubernetes", "bases:\n  - ../kubernetes")
    shutil.copytree(BASE, tmp_path / "kubernetes")
    (tmp_path / "production").mkdir()
    (tmp_path / "production" / "kustomization.yaml").write_text(text)
    tuned = make_policy(name="banking77")
    tuned.write(tmp_path / "production" / "banking77.json")

    manifests = kustomize(tmp_path / "production")
    assert server(manifests)["image"] == "registry.example.com/slotgate:0.1.0"
    files = config_map(manifests, "slotgate-policies")["data"]
    assert PolicyFile.model_validate_json(files["banking77.json"]).policy_id == tuned.policy_id
    settings = settings_of(manifests, monkeypatch)
    mount = next(m["mountPath"] for m in server(manifests)["volumeMounts"]
                 if m["name"] == "policies")
    assert settings.policy.files == [Path(mount) / "banking77.json"]
    assert settings.policy.default == "banking77" and settings.fast.kind == "vllm"
    # the base's own settings survive the merge
    assert settings.cache.redis_url == "redis://slotgate-redis:6379/0"
