"""Every command block of README.md runs as written. Blocks are extracted
generically and each gets the runner its kind needs; a block of a kind with no runner fails the
test, so a new README block cannot go unchecked.

- ``slotgate ...`` blocks run as written with bash in a fresh folder, ``$SLOTGATE_DATA_DIR``
  naming a folder with seeded samples of BANKING77's ``train.csv`` and ``test.csv`` (its ``text``
  and ``category`` columns), so that they take seconds.
- ``python`` blocks run against ``slotgate serve`` (a subprocess) serving the model and policy the
  CLI block made, with the stand-in LLM as the slow model; only the port in ``base_url`` is
  changed (8080 may be taken on a shared machine).
- ``make`` blocks run with ``make -n`` (dry run: the targets and their commands resolve): really
  running ``make test`` would run this test again, and ``make serve`` installs into .venv.
- ``yaml`` blocks are settings: each loads as ``slotgate.yaml`` in the folder the CLI blocks ran
  in, and the fast tiers and policy files it names load as ``slotgate serve`` loads them.
"""

from __future__ import annotations

import csv
import os
import random
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from standins.llm import StandinHandle
from tests.conftest import ROOT, free_port
from tests.live import wait_until_up

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=\S*$")


@dataclass(frozen=True)
class Block:
    heading: str
    lang: str
    text: str

    @property
    def commands(self) -> list[str]:
        """The program each line runs (after VAR=value assignments; comments and blanks out)."""
        programs = []
        for line in self.text.splitlines():
            words = shlex.split(line, comments=True)
            words = [w for w in words if not ASSIGNMENT.match(w)] if words else []
            if words:
                programs.append(words[0])
        return programs

    @property
    def kind(self) -> str:
        if self.lang == "python":
            return "python"
        if self.lang in ("sh", "bash", "shell", "console"):
            if "slotgate" in self.commands and set(self.commands) <= {"slotgate", "mkdir"}:
                return "slotgate"
            if self.commands and all(c == "make" for c in self.commands):
                return "make"
            return "unknown shell: " + ", ".join(sorted(set(self.commands)))
        if self.lang == "yaml":
            return "settings"
        if self.lang == "" and not any(
                line.split()[:1] in (["slotgate"], ["make"], ["python"]) for line in
                self.text.splitlines()):
            return "text"  # a diagram or listing, nothing to run
        return f"unknown: {self.lang!r}"


def readme_blocks() -> list[Block]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = []
    for match in FENCE.finditer(text):
        headings = re.findall(r"^#+ (.+)$", text[:match.start()], re.MULTILINE)
        blocks.append(Block(headings[-1] if headings else "", match.group(1), match.group(2)))
    return blocks


def blocks_of(kind: str) -> list[Block]:
    return [b for b in readme_blocks() if b.kind == kind]


def test_every_readme_block_has_a_runner() -> None:
    kinds = {b.kind for b in readme_blocks()}
    assert kinds <= {"slotgate", "python", "make", "settings", "text"}, kinds
    assert {"slotgate", "python", "make"} <= kinds  # the extractor still finds them


def environment(data_dir: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLOTGATE_")}
    env["SLOTGATE_DATA_DIR"] = str(data_dir) if data_dir else os.environ.get("SLOTGATE_DATA_DIR", "")
    env["PYTHONPATH"] = str(ROOT)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def sample_csv(source: Path, target: Path, per_class: int, seed: int) -> None:
    """``per_class`` seeded rows of each intent (every intent keeps enough rows for the README's
    5-fold cross-fitting)."""
    with source.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    by_class: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        by_class.setdefault(row["category"], []).append(row)
    rng = random.Random(seed)
    picked = [row for name in sorted(by_class) for row in rng.sample(by_class[name], per_class)]
    with target.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=["text", "category"])
        writer.writeheader()
        writer.writerows({"text": r["text"], "category": r["category"]} for r in picked)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory, banking77_dir: Path) -> Path:
    """A fresh folder; its data/ holds seeded samples of BANKING77's train.csv and test.csv
    (20 and 6 messages of each intent; what the README's $SLOTGATE_DATA_DIR names), so the
    blocks run in seconds."""
    folder = tmp_path_factory.mktemp("readme")
    (folder / "data").mkdir()
    sample_csv(banking77_dir / "train.csv", folder / "data" / "train.csv", 20, seed=0)
    sample_csv(banking77_dir / "test.csv", folder / "data" / "test.csv", 6, seed=1)
    return folder


@pytest.fixture(scope="module")
def slotgate_runs(workdir: Path) -> list[tuple[Block, subprocess.CompletedProcess[str]]]:
    """Every ``slotgate`` block run once, in order, in ``workdir`` (later blocks may read what
    earlier ones wrote, as a reader following the README would)."""
    runs = []
    for block in blocks_of("slotgate"):
        runs.append((block, subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", block.text], cwd=workdir,
            env=environment(workdir / "data"), capture_output=True, text=True, timeout=900,
            check=False)))
    return runs


@pytest.mark.long
def test_slotgate_blocks_run_as_written(
    slotgate_runs: list[tuple[Block, subprocess.CompletedProcess[str]]]
) -> None:
    assert slotgate_runs
    for block, result in slotgate_runs:
        assert result.returncode == 0, (block.heading, result.stdout[-2000:], result.stderr[-3000:])


@pytest.mark.long
def test_slotgate_blocks_write_only_where_git_ignores(
    workdir: Path, slotgate_runs: list[tuple[Block, subprocess.CompletedProcess[str]]]
) -> None:
    """A newcomer runs the blocks in the checkout: what they write must not show in git status."""
    test_slotgate_blocks_run_as_written(slotgate_runs)
    written = sorted(str(p.relative_to(workdir)) for p in workdir.rglob("*")
                     if p.is_file() and p.relative_to(workdir).parts[0] != "data")
    assert written
    ignored = subprocess.run(["git", "check-ignore", "--no-index", *written], cwd=ROOT,
                             capture_output=True, text=True, check=False).stdout.split()
    assert sorted(ignored) == written, set(written) - set(ignored)


@pytest.mark.long
def test_python_blocks_run_against_a_served_slotgate(
    workdir: Path, standin: StandinHandle,
    slotgate_runs: list[tuple[Block, subprocess.CompletedProcess[str]]],
) -> None:
    test_slotgate_blocks_run_as_written(slotgate_runs)  # the model and policy the README made
    models, policies = sorted(workdir.rglob("*.joblib")), sorted(workdir.rglob("policy*.json"))
    assert models and policies, sorted(p.name for p in workdir.iterdir())
    port = free_port()
    env = environment() | {
        "SLOTGATE_PORT": str(port), "SLOTGATE_FAST__MODEL_PATH": str(models[0]),
        "SLOTGATE_POLICY__FILES": f'["{policies[0]}"]', "SLOTGATE_POLICY__DEFAULT": policies[0].stem,
        "SLOTGATE_LOG__DECISION_LOG_PATH": str(workdir / "serve-log.jsonl"),
        "SLOTGATE_SLOW_MODEL": "openai/standin", "SLOTGATE_SLOW_API_BASE": standin.api_base,
        "SLOTGATE_SLOW__API_KEY": "sk-standin-readme"}
    slotgate = str(Path(sys.executable).parent / "slotgate")
    server = subprocess.Popen([slotgate, "serve"], cwd=workdir,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until_up(f"http://127.0.0.1:{port}", server, path="/readyz")
        for block in blocks_of("python"):
            code = block.text.replace("127.0.0.1:8080", f"127.0.0.1:{port}")
            # $SLOTGATE_DATA_DIR: the data the CLI block trained on (the intents it learnt).
            result = subprocess.run([sys.executable, "-c", code], cwd=workdir,
                                    env=environment(workdir / "data"),
                                    capture_output=True, text=True, timeout=120, check=False)
            assert result.returncode == 0, (block.heading, result.stderr[-3000:])
            assert result.stdout.strip(), block.heading
            if '"name": "intent"' in code:
                # The README's first example asks the question its policy was tuned on (the
                # json_schema named "intent" over the 77 intents): the policy decides it.
                assert "'guarantee': 'accuracy'" in result.stdout, result.stdout
                assert "'policy_id': 'fallback'" not in result.stdout, result.stdout
    finally:
        server.terminate()
        server.communicate(timeout=30)


def test_make_blocks_resolve() -> None:
    for block in blocks_of("make"):
        script = re.sub(r"(^|\s)make(\s)", r"\1make -n\2", block.text, flags=re.MULTILINE)
        result = subprocess.run(["bash", "-e", "-c", script], cwd=ROOT, env=environment(),
                                capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 0, (block.heading, block.text, result.stderr[-2000:])


@pytest.mark.long
def test_settings_blocks_load_with_what_the_cli_blocks_wrote(
    workdir: Path, tmp_path: Path,
    slotgate_runs: list[tuple[Block, subprocess.CompletedProcess[str]]],
) -> None:
    """A settings block, read where the README's commands ran, loads; its
    fast tiers are built and its policy files load against them (a cascade's tiers checked by
    name, order and fingerprint), as ``slotgate serve`` does before it starts."""
    from router.backends.factory import build_backend
    from router.routing.registry import PolicyRegistry
    from router.settings import load_settings

    test_slotgate_blocks_run_as_written(slotgate_runs)
    blocks = blocks_of("settings")
    assert blocks
    cwd = Path.cwd()
    os.chdir(workdir)  # the block's relative paths are the CLI blocks' (run in workdir)
    try:
        for block in blocks:
            (tmp_path / "slotgate.yaml").write_text(block.text, encoding="utf-8")
            settings = load_settings(tmp_path / "slotgate.yaml")
            first = build_backend(settings.fast)
            tiers = [(settings.fast.name, first.fingerprint)] + [
                (tier.name, build_backend(tier).fingerprint) for tier in settings.tiers]
            registry = PolicyRegistry.load(settings.policy, backend_fingerprint=first.fingerprint,
                                           tiers=tiers)
            assert registry.loaded(), block.text
    finally:
        os.chdir(cwd)
