"""``--policy`` as every command takes it: a policy file's path, or the id or name of a policy
the server's configuration loads (./slotgate.yaml's ``policy.files``), so `eval`, `monitor` and
`alarms` accept what `tune` writes and what `alarms list` and /metrics show alike."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from router.cli.common import fail

if TYPE_CHECKING:
    from policies.file import PolicyFile


def read_policy(value: str) -> tuple[Path, PolicyFile]:
    """The policy ``value`` names: the file at that path, else the configured policy whose id
    (``name@hash``) or name it is. Exits 2 naming the flag, and the configured policies, when
    it is neither."""
    from policies.file import PolicyFileError, load_policy

    path = Path(value)
    if path.is_file():
        try:
            return path, load_policy(path)
        except PolicyFileError as exc:
            fail(f"--policy: {exc}")
    configured = configured_policies()
    for file, policy in configured:
        if value in (policy.policy_id, policy.name):
            return file, policy
    shown = ", ".join(f"{p.policy_id} ({file})" for file, p in configured) or "none"
    fail(f"--policy: {value!r} is neither a policy file nor the id or name of a configured "
         f"policy (./slotgate.yaml policy.files: {shown})")


def configured_policies() -> list[tuple[Path, PolicyFile]]:
    """The readable policy files ./slotgate.yaml (and SLOTGATE_*) configure; none when there is
    no usable configuration."""
    from policies.file import PolicyFileError, load_policy
    from router.errors import ConfigError
    from router.http.server import default_config
    from router.settings import load_settings

    try:
        files = load_settings(default_config(None)).policy.files
    except ConfigError:
        return []
    loaded = []
    for file in files:
        try:
            loaded.append((file, load_policy(file)))
        except PolicyFileError:
            continue  # named where it is used: `serve` refuses it
    return loaded


def policy_id(value: str) -> str:
    """The policy id ``value`` names: a policy file's id when it is a file's path (or a
    configured policy's name), else ``value`` itself (an id, as `alarms list` shows it)."""
    path = Path(value)
    if path.is_file():
        return read_policy(value)[1].policy_id
    for _, policy in configured_policies():
        if value == policy.name:
            return policy.policy_id
    return value
