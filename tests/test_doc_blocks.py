"""Every command block of README.md and docs/*.md runs as written. Blocks are extracted
generically and each gets the runner its kind needs; a block of a kind with no runner fails the
test, so a new block cannot go unchecked. A block that cannot run here (a GPU, an API key, minutes
of compute, a template to fill in) says so right above its fence, ``<!-- not run: why -->``; the
runner counts those and prints how many there are and why.

- ``slotgate ...`` blocks run as written with bash, each document's in order in a fresh folder of
  its own (later blocks read what earlier ones wrote, as a reader following the document would),
  ``$SLOTGATE_DATA_DIR`` naming a folder with seeded samples of BANKING77's ``train.csv`` and
  ``test.csv`` (its ``text`` and ``category`` columns), so that they take seconds.
- A block whose section says what it runs after gets that environment first (``SETTINGS_UP``):
  docs/calibration.md's shadow-mode recipe runs beside a ``slotgate serve`` in shadow mode that
  has logged decisions answered by the disagreeing stand-in LLM, and the policy it tunes must be
  the one that server reloads and serves.
- ``python`` blocks that call ``127.0.0.1:8080`` run against ``slotgate serve`` (a subprocess)
  serving the model and policy the README's CLI block made, with the stand-in LLM as the slow
  model; only the port in ``base_url`` is changed (8080 may be taken on a shared machine). Other
  ``python`` blocks run as they are, in the project's environment.
- ``make`` blocks run with ``make -n`` (dry run: the targets and their commands resolve): really
  running ``make test`` would run this test again, and ``make serve`` installs into .venv.
- ``yaml`` blocks are settings, edits of ``slotgate.yaml``: each is merged over the project's
  ``slotgate.yaml`` in the folder its document's CLI blocks ran in, and the fast tiers and policy
  files it names load as ``slotgate serve`` loads them (``policy.default`` included).
"""

from __future__ import annotations

import concurrent.futures
import csv
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from standins.llm import StandinHandle, estimator_chooser, start_standin
from standins.slow_model import train_slow_model
from tests.conftest import ROOT, free_port
from tests.live import wait_until_up

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
NOT_RUN = re.compile(r"<!-- not run: ([^<>]+?) -->\Z")
ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=\S*$")
DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
SHADOW = ("docs/calibration.md", "Cold start without labels: shadow mode")


@dataclass(frozen=True)
class Block:
    doc: str
    heading: str
    lang: str
    text: str
    not_run: str | None = None  # why, from the marker right above the fence

    @property
    def commands(self) -> list[str]:
        """The program each line runs (after VAR=value assignments; comments and blanks out)."""
        programs = []
        for line in self.text.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            words = [w for w in words if not ASSIGNMENT.match(w.rstrip(";"))] if words else []
            if words:
                programs.append(words[0])
        return programs

    @property
    def kind(self) -> str:
        if self.not_run is not None:
            return "not run"
        if self.lang == "python":
            return "client" if "127.0.0.1:8080" in self.text else "python"
        if self.lang in ("sh", "bash", "shell", "console"):
            if "slotgate" in self.commands and set(self.commands) <= {"slotgate", "mkdir"}:
                return "slotgate"
            if self.commands and all(c == "make" for c in self.commands):
                return "make"
            return "unknown shell: " + ", ".join(sorted(set(self.commands)))
        if self.lang == "yaml":
            return "settings"
        if self.lang in ("", "text", "json") and not any(
                line.split()[:1] in (["slotgate"], ["make"], ["python"]) for line in
                self.text.splitlines()):
            return "text"  # a diagram, a listing or a reply shown, nothing to run
        return f"unknown: {self.lang!r}"


def doc_blocks(doc: str) -> list[Block]:
    text = (ROOT / doc).read_text(encoding="utf-8")
    blocks = []
    for match in FENCE.finditer(text):
        before = text[:match.start()]
        headings = re.findall(r"^#+ (.+)$", before, re.MULTILINE)
        marker = NOT_RUN.search(before.rstrip())
        blocks.append(Block(doc, headings[-1] if headings else "", match.group(1), match.group(2),
                            None if marker is None else " ".join(marker.group(1).split())))
    return blocks


def blocks_of(kind: str, doc: str | None = None) -> list[Block]:
    return [b for d in DOCS if doc in (None, d) for b in doc_blocks(d) if b.kind == kind]


def test_every_block_has_a_runner() -> None:
    kinds = {b.kind for d in DOCS for b in doc_blocks(d)}
    assert kinds <= {"slotgate", "client", "python", "make", "settings", "text", "not run"}, kinds
    assert {"slotgate", "client", "python", "make", "settings"} <= kinds  # still found


def test_blocks_not_run_are_marked_and_counted(request: pytest.FixtureRequest) -> None:
    """Every ``not run`` marker sits right above a block and says why; the count is printed."""
    marked = blocks_of("not run")
    markers = sum(len(re.findall(r"^<!-- not run:", (ROOT / d).read_text(encoding="utf-8"),
                                 re.MULTILINE)) for d in DOCS)
    assert len(marked) == markers, "a <!-- not run: ... --> marker is not right above a fence"
    assert all(len(b.not_run or "") > 10 for b in marked), [b.not_run for b in marked]
    total = sum(len(doc_blocks(d)) for d in DOCS)
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"\ndoc blocks: {total} in {len(DOCS)} documents, {len(marked)} "
                            "marked not run: " + "; ".join(
                                f"{b.doc} ({b.heading}): {b.not_run}" for b in marked))


def test_the_extractor_reads_markers_and_continued_lines() -> None:
    """The parser the runner relies on: a marker applies to the fence right below it only, and
    a command continued over lines is one command."""
    block = Block("x.md", "h", "bash", "D=a W=b\nslotgate train \\\n    --data $D\nmkdir -p $W\n")
    assert block.commands == ["slotgate", "mkdir"] and block.kind == "slotgate"
    text = "<!-- not run: needs a GPU -->\n```sh\nslotgate x\n```\n\n```sh\nslotgate y\n```\n"
    marked = [NOT_RUN.search(text[:m.start()].rstrip()) for m in FENCE.finditer(text)]
    assert marked[0] is not None and marked[0].group(1) == "needs a GPU" and marked[1] is None


def environment(data_dir: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLOTGATE_")}
    env["SLOTGATE_DATA_DIR"] = str(data_dir) if data_dir else os.environ.get("SLOTGATE_DATA_DIR", "")
    env["PYTHONPATH"] = str(ROOT)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def sample_csv(source: Path, target: Path, per_class: int, seed: int) -> None:
    """``per_class`` seeded rows of each intent (every intent keeps enough rows for the docs'
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


# Messages per intent in the samples of train.csv and test.csv a document's blocks read:
# enough for the README's one-tier policy to find a threshold (its client block asks that policy);
# fewer where the blocks only have to run, as the README's second CLI block (the cascade) does.
SAMPLES: dict[str | tuple[str, int], tuple[int, int]] = {
    "README.md": (20, 6), ("README.md", 1): (6, 2), "docs/cascade.md": (6, 2),
    "docs/calibration.md": (6, 3)}


def sample_size(doc: str, index: int | None = None) -> tuple[int, int]:
    """(train, test) messages per intent for ``doc``'s CLI block number ``index`` (from 0)."""
    return SAMPLES.get((doc, index) if index is not None else doc) or SAMPLES.get(
        doc, SAMPLES["README.md"])


@pytest.fixture(scope="module")
def data_dirs(tmp_path_factory: pytest.TempPathFactory, banking77_dir: Path
              ) -> dict[tuple[int, int], Path]:
    """Seeded samples of BANKING77's train.csv and test.csv, one folder per size in ``SAMPLES``
    (what the docs' $SLOTGATE_DATA_DIR names), so the blocks run in seconds."""
    folders: dict[tuple[int, int], Path] = {}
    for train, test in set(SAMPLES.values()):
        folder = folders[train, test] = tmp_path_factory.mktemp(f"data-{train}-{test}")
        sample_csv(banking77_dir / "train.csv", folder / "train.csv", train, seed=0)
        sample_csv(banking77_dir / "test.csv", folder / "test.csv", test, seed=1)
    return folders


Runs = list[tuple[Block, subprocess.CompletedProcess[str]]]


def run_block(block: Block, folder: Path, data: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.text], cwd=folder,
                          env=environment(data), capture_output=True, text=True, timeout=900,
                          check=False)


class DocRuns:
    """Each document's ``slotgate`` blocks (but those with their own environment), run once, in
    order, in a fresh folder per document, when a test first asks for that document."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory,
                 data_dirs: dict[tuple[int, int], Path]):
        self._tmp, self._data = tmp_path_factory, data_dirs
        self._runs: dict[str, tuple[Path, Runs]] = {}

    def folder(self, doc: str) -> Path:
        return self.of(doc)[0]

    def of(self, doc: str) -> tuple[Path, Runs]:
        if doc not in self._runs:
            folder = self._tmp.mktemp(Path(doc).stem)
            self._runs[doc] = folder, [
                (block, run_block(block, folder, self._data[sample_size(doc, index)]))
                for index, block in enumerate(blocks_of("slotgate", doc))
                if (block.doc, block.heading) != SHADOW]
        return self._runs[doc]

    def assert_ran(self, doc: str) -> None:
        _, runs = self.of(doc)
        assert runs, doc
        for block, result in runs:
            assert result.returncode == 0, (block.doc, block.heading, result.stdout[-2000:],
                                            result.stderr[-3000:])


@pytest.fixture(scope="module")
def doc_runs(tmp_path_factory: pytest.TempPathFactory,
             data_dirs: dict[tuple[int, int], Path]) -> DocRuns:
    return DocRuns(tmp_path_factory, data_dirs)


# The documents whose CLI blocks run in a plain folder (the shadow recipe has its own test).
CLI_DOCS = sorted({b.doc for b in blocks_of("slotgate") if (b.doc, b.heading) != SHADOW})


@pytest.mark.long
@pytest.mark.parametrize("doc", CLI_DOCS)
def test_slotgate_blocks_run_as_written(doc_runs: DocRuns, doc: str) -> None:
    assert {"README.md", "docs/cascade.md"} <= set(CLI_DOCS)
    doc_runs.assert_ran(doc)


@pytest.mark.long
@pytest.mark.parametrize("doc", CLI_DOCS)
def test_slotgate_blocks_write_only_where_git_ignores(doc_runs: DocRuns, doc: str) -> None:
    """A newcomer runs the blocks in the checkout: what they write must not show in git status."""
    doc_runs.assert_ran(doc)
    folder = doc_runs.folder(doc)
    written = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert written
    ignored = subprocess.run(["git", "check-ignore", "--no-index", *written], cwd=ROOT,
                             capture_output=True, text=True, check=False).stdout.split()
    assert sorted(ignored) == written, set(written) - set(ignored)


@pytest.mark.long
def test_client_blocks_run_against_a_served_slotgate(
    data_dirs: dict[tuple[int, int], Path], standin: StandinHandle, doc_runs: DocRuns,
) -> None:
    doc_runs.assert_ran("README.md")
    workdir = doc_runs.folder("README.md")
    model, policy = workdir / "var/tune/m.joblib", workdir / "var/tune/policy.json"  # tune block
    port = free_port()
    env = environment() | {
        "SLOTGATE_PORT": str(port), "SLOTGATE_FAST__MODEL_PATH": str(model),
        "SLOTGATE_POLICY__FILES": f'["{policy}"]', "SLOTGATE_POLICY__DEFAULT": policy.stem,
        "SLOTGATE_LOG__DECISION_LOG_PATH": str(workdir / "serve-log.jsonl"),
        "SLOTGATE_SLOW_MODEL": "openai/standin", "SLOTGATE_SLOW_API_BASE": standin.api_base,
        "SLOTGATE_SLOW__API_KEY": "sk-standin-readme"}
    slotgate = str(Path(sys.executable).parent / "slotgate")
    server = subprocess.Popen([slotgate, "serve"], cwd=workdir,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    blocks = blocks_of("client")
    assert blocks
    try:
        wait_until_up(f"http://127.0.0.1:{port}", server, path="/readyz")
        for block in blocks:
            code = block.text.replace("127.0.0.1:8080", f"127.0.0.1:{port}")
            # $SLOTGATE_DATA_DIR: the data the CLI block trained on (the intents it learnt).
            result = subprocess.run([sys.executable, "-c", code], cwd=workdir,
                                    env=environment(data_dirs[sample_size("README.md", 0)]),
                                    capture_output=True, text=True, timeout=120, check=False)
            assert result.returncode == 0, (block.doc, block.heading, result.stderr[-3000:])
            assert result.stdout.strip(), block.heading
            if '"name": "intent"' in code:
                # The README's first example asks the question its policy was tuned on (the
                # json_schema named "intent" over the 77 intents): the policy decides it.
                assert "'guarantee': 'accuracy'" in result.stdout, result.stdout
                assert "'policy_id': 'fallback'" not in result.stdout, result.stdout
    finally:
        server.terminate()
        server.communicate(timeout=30)


def test_python_blocks_run_as_written(tmp_path: Path) -> None:
    blocks = blocks_of("python")
    assert blocks
    for block in blocks:
        result = subprocess.run([sys.executable, "-c", block.text], cwd=tmp_path,
                                env=environment(), capture_output=True, text=True, timeout=120,
                                check=False)
        assert result.returncode == 0, (block.doc, block.heading, result.stderr[-3000:])


def test_make_blocks_resolve() -> None:
    for block in blocks_of("make"):
        script = re.sub(r"(^|\s)make(\s)", r"\1make -n\2", block.text, flags=re.MULTILINE)
        result = subprocess.run(["bash", "-e", "-c", script], cwd=ROOT, env=environment(),
                                capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 0, (block.doc, block.heading, block.text,
                                        result.stderr[-2000:])


def merged(base: dict[str, Any], edit: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``edit``'s keys set, section by section (an edit of slotgate.yaml). An
    edit whose ``tiers:`` lists every tier takes the place of the file's ``fast:`` section, as
    the docs ask."""
    out = dict(base)
    if "tiers" in edit and "fast" not in edit:
        out.pop("fast", None)
    for key, value in edit.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(
            out.get(key), dict) else value
    return out


@pytest.mark.long
def test_settings_blocks_load_with_what_the_cli_blocks_wrote(
    tmp_path: Path, doc_runs: DocRuns,
) -> None:
    """A settings block, merged over slotgate.yaml where its document's commands ran, loads; its
    fast tiers are built and its policy files load against them (a cascade's tiers checked by
    name, order and fingerprint, ``policy.default`` by name), as ``slotgate serve`` does before
    it starts."""
    from router.backends.factory import build_backend
    from router.routing.registry import PolicyRegistry
    from router.settings import load_settings

    blocks = blocks_of("settings")
    assert blocks
    base = yaml.safe_load((ROOT / "slotgate.yaml").read_text(encoding="utf-8"))
    cwd = Path.cwd()
    try:
        for block in blocks:
            doc_runs.assert_ran(block.doc)
            os.chdir(doc_runs.folder(block.doc))  # the block's relative paths are the CLI's
            config = merged(base, yaml.safe_load(block.text))
            (tmp_path / "slotgate.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
            settings = load_settings(tmp_path / "slotgate.yaml")
            first = build_backend(settings.fast)
            tiers = [(settings.fast.name, first.fingerprint)] + [
                (tier.name, build_backend(tier).fingerprint) for tier in settings.tiers]
            registry = PolicyRegistry.load(settings.policy, backend_fingerprint=first.fingerprint,
                                           tiers=tiers)
            assert registry.loaded(), (block.doc, block.text)
    finally:
        os.chdir(cwd)


def test_merged_edits_section_by_section() -> None:
    base = {"fast": {"kind": "sklearn", "timeout_s": 0.25}, "policy": {"default": "banking77"}}
    edit = {"fast": {"model_path": "m.joblib"}, "policy": {"files": ["p.json"]}, "tiers": []}
    assert merged(base, edit) == {
        "fast": {"kind": "sklearn", "timeout_s": 0.25, "model_path": "m.joblib"},
        "policy": {"default": "banking77", "files": ["p.json"]}, "tiers": []}
    listed = merged(base, {"tiers": [{"name": "a"}, {"name": "b"}]})
    assert "fast" not in listed and listed["tiers"] == [{"name": "a"}, {"name": "b"}]


# What `make serve` builds into var/ (the Makefile's var/policy.json recipe), as `slotgate` arguments.
MAKE_SERVE_ARTIFACTS = [
    ("train --data {data}/train.csv --label-column category --question intent "
     "--out var/banking77-tfidf.joblib --cv 5 --oof-out var/banking77-oof.jsonl --seed 0"),
    ("tune --preds var/banking77-oof.jsonl --model var/banking77-tfidf.joblib "
     "--out var/policy.json --target-accuracy 0.95 --name banking77")]


def ask_intent(url: str, text: str, intents: list[str]) -> None:
    response = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
        "model": "any", "messages": [{"role": "user", "content": text}],
        "response_format": {"type": "json_schema", "json_schema": {
            "name": "intent", "schema": {"type": "string", "enum": intents}}}})
    assert response.status_code == 200, response.text


@pytest.mark.long
def test_the_shadow_recipe_tunes_the_policy_the_server_reloads(
        tmp_path: Path, data_dirs: dict[tuple[int, int], Path]) -> None:
    """docs/calibration.md's shadow recipe, where it says it runs: beside `make serve`'s server
    (its config and artifacts) in shadow mode, `SLOTGATE_POLICY__SHADOW=true`, with the
    disagreeing stand-in LLM as the slow model and decisions logged; the recipe's commands, run as
    written, write the policy that server reloads (no restart) and routes with."""
    blocks = [b for b in blocks_of("slotgate", SHADOW[0]) if b.heading == SHADOW[1]]
    assert len(blocks) == 1
    data_dir = data_dirs[sample_size(SHADOW[0])]
    shutil.copy(ROOT / "slotgate.yaml", tmp_path)
    (tmp_path / "var").mkdir()
    slotgate = str(Path(sys.executable).parent / "slotgate")
    for command in MAKE_SERVE_ARTIFACTS:  # the Makefile's, on the sampled rows
        built = subprocess.run([slotgate, *shlex.split(command.format(data=data_dir))], cwd=tmp_path,
                               env=environment(data_dir), capture_output=True, text=True,
                               timeout=300, check=False)
        assert built.returncode == 0, (command, built.stderr[-3000:])
    standin = start_standin(chooser=estimator_chooser(train_slow_model(data_dir / "train.csv")))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "serve.log"
    with log_path.open("w", encoding="utf-8") as log_file:
        server = subprocess.Popen([slotgate, "serve"], cwd=tmp_path, env=environment(data_dir) | {
            "SLOTGATE_POLICY__SHADOW": "true", "SLOTGATE_PORT": str(port),
            "SLOTGATE_SLOW_MODEL": "openai/standin", "SLOTGATE_SLOW_API_BASE": standin.api_base},
            stdout=log_file, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until_up(url, server, path="/readyz", output=log_path.read_text)
        shadowed = httpx.get(f"{url}/readyz", timeout=10).json()["policies"]
        assert [(p["name"], p["shadow"]) for p in shadowed] == [("banking77", True)], shadowed
        with (data_dir / "test.csv").open(newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        intents = sorted({row["category"] for row in rows})
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda row: ask_intent(url, row["text"], intents), rows))
        result = run_block(blocks[0], tmp_path, data_dir)
        assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-3000:])
        deadline = time.monotonic() + 60
        while True:  # the file watch reloads the policy the recipe wrote
            policies = httpx.get(f"{url}/readyz", timeout=10).json()["policies"]
            if [p["policy_id"] for p in policies] != [p["policy_id"] for p in shadowed]:
                break
            assert time.monotonic() < deadline and server.poll() is None, "no reload"
            time.sleep(0.2)
        assert [(p["name"], p["shadow"]) for p in policies] == [("banking77", False)], policies
    finally:
        server.terminate()
        server.wait(timeout=30)
        standin.stop()
    log = log_path.read_text(encoding="utf-8")
    assert "refused" not in log, log[-3000:]
