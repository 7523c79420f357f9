"""The architecture as a test: the import contracts of pyproject.toml's
``[tool.importlinter]`` hold (``lint-imports``, the same check ``make lint`` runs), each contract
catches the kind of import it forbids, no two modules import each other even through others, and
the pairs most prone to it depend one way at most, with no exception. The import graph is grimp's (import-linter's engine), built
from the source files; nothing here is a hand-written list of imports.

TYPE_CHECKING-only and function-local imports count, here and in the contracts (why: the comment
above ``[tool.importlinter]``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path

import grimp
import pytest

from tests.conftest import ROOT

PACKAGES = ("calibration", "policies", "router")
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def contracts() -> list[dict[str, object]]:
    with (ROOT / "pyproject.toml").open("rb") as file:
        config = tomllib.load(file)["tool"]["importlinter"]
    found: list[dict[str, object]] = config["contracts"]
    return found


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    # Wide columns: contract names and import chains stay on one line in a failure message.
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_the_import_contracts_hold() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Contracts: {len(contracts())} kept, 0 broken." in result.stdout


# One new module per contract, each importing what that contract forbids (new files, so the
# probe does not depend on any existing module's name or imports). A new contract needs a probe
# here: the test below wants every contract broken.
VIOLATIONS = {
    "calibration/_probe_upward.py": "import policies\n",
    "policies/_probe_redis.py": "import redis\n",
    "router/routing/_probe_upward.py": "import router.monitoring\n",
    "router/tuning/_probe_cli.py": "import typer\n",
    "router/store/_probe_litellm.py": "import litellm\n",
    "router/http/systemone/_probe_openai.py": "import router.http.openai\n",
    "policies/_probe_bench.py": "import bench\n",
    "router/backends/torch/kernels/_probe_upward.py": "import router.backends.torch.serve\n",
    "router/store/_probe_cycle_a.py": "import router.store._probe_cycle_b\n",
    "router/store/_probe_cycle_b.py": "import router.store._probe_cycle_a\n",
}


def test_every_contract_catches_what_it_forbids(tmp_path: Path) -> None:
    """A copy of the tree with one forbidden import per contract breaks every contract: no
    contract is vacuous (a misspelt module, a layer nobody imports)."""
    for folder in (*PACKAGES, "bench", "standins"):
        shutil.copytree(ROOT / folder, tmp_path / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "results"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for path, text in VIOLATIONS.items():
        (tmp_path / path).write_text(text)
    result = lint_imports(tmp_path)
    n = len(contracts())
    assert result.returncode != 0
    assert f"Contracts: 0 kept, {n} broken." in result.stdout, result.stdout


def known_cycle_edges() -> set[tuple[str, str]]:
    """The acyclic contract's exceptions (each a known cycle, named for its owner to cut)."""
    edges = set()
    for contract in contracts():
        if contract["type"] == "acyclic_siblings":
            ignored = contract.get("ignore_imports", [])
            assert isinstance(ignored, list)
            for line in ignored:
                importer, imported = (part.strip() for part in str(line).split("->"))
                edges.add((importer, imported))
    return edges


def import_cycles(graph: grimp.ImportGraph) -> set[tuple[str, ...]]:
    """Every import a -> b whose b reaches a again, as the shortest cycle through it."""
    cycles = set()
    for importer in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(importer):
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back is not None:
                cycles.add((importer, *back))
    return cycles


def project_graph() -> grimp.ImportGraph:
    return grimp.build_graph(*PACKAGES, cache_dir=None)


def without(graph: grimp.ImportGraph, edges: Iterable[tuple[str, str]]) -> grimp.ImportGraph:
    for importer, imported in edges:
        assert graph.direct_import_exists(importer=importer, imported=imported), (
            f"{importer} -> {imported} is listed as a known cycle but no longer imported: "
            "delete its ignore_imports line")
        graph.remove_import(importer=importer, imported=imported)
    return graph


def test_no_module_imports_itself_through_others() -> None:
    """Module level, across rooms too: the acyclic contract checks cycles between siblings of a
    package and the layers contract between router's rooms, but settings and backends share a
    layer, so a module cycle between them is only caught here."""
    cycles = import_cycles(without(project_graph(), known_cycle_edges()))
    assert not cycles, "\n".join(" -> ".join(cycle) for cycle in sorted(cycles))


def test_the_cycle_finder_finds_a_cycle_through_another_room() -> None:
    graph = grimp.ImportGraph()
    graph.add_import(importer="router.settings", imported="router.backends.options")
    graph.add_import(importer="router.backends.options", imported="router.backends.knobs")
    graph.add_import(importer="router.backends.knobs", imported="router.settings")
    graph.add_import(importer="router.settings", imported="router.errors")
    cycles = import_cycles(graph)
    assert ("router.settings", "router.backends.options", "router.backends.knobs",
            "router.settings") in cycles
    assert not any("router.errors" in cycle for cycle in cycles)


@pytest.mark.parametrize("a, b", [
    ("router.backends.options", "router.backends.torch.options"),
    ("router.store.decision_log", "router.store.redis_log"),
    ("router.monitoring.monitor", "router.routing.registry"),
])
def test_paired_modules_depend_one_way_at_most(a: str, b: str) -> None:
    """Backend options and the torch backend's options, the JSONL and Redis logs, the monitor and
    the policy registry: neither of a pair reaches the other through any chain, whatever the
    known-cycle exceptions list."""
    graph = project_graph()
    both_ways = (graph.chain_exists(importer=a, imported=b)
                 and graph.chain_exists(importer=b, imported=a))
    assert not both_ways, (graph.find_shortest_chain(importer=a, imported=b),
                           graph.find_shortest_chain(importer=b, imported=a))


# The README's Layout block: an entry is a name at an even indent below the description column
# (`router/`, `  cli/`), nested by indent; the description may name files or folders
# (`settings.py`, `openai/ (routes.py)`), found in the folder it last named, beside the entry, or
# from the project root, the first that exists.
NAMED = re.compile(
    r"(?<![\w./<-])((?:[\w-]+/)*[\w-]+(?:\.(?:py|md|yaml|toml|json|sh)\b|/(?!\w)))")


def layout_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"^```\n(.*?)^```", section, re.MULTILINE | re.DOTALL)
    assert block is not None, "README's Layout section has no ``` block"
    return block.group(1).splitlines()


def layout_paths(lines: list[str]) -> tuple[list[str], list[str]]:
    """(entries, every path named), each relative to the project root."""
    first = re.match(r"\S+ +", lines[0])
    assert first is not None, lines[0]
    column = first.end()  # where descriptions start; an entry's name starts left of it
    parents: list[str] = []
    entries: list[str] = []
    named: list[str] = []
    last_folder = ""
    for line in lines:
        indent = len(line) - len(line.lstrip())
        if indent < column:
            name, _, description = line.strip().partition(" ")
            depth = indent // 2
            parents = parents[:depth]
            entries.append("".join(parents) + name)
            parents.append(name if name.endswith("/") else "")
            last_folder = ""
        else:
            description = line
        folder = "".join(parents)
        for word in NAMED.findall(description):
            places = [folder + last_folder + word, folder + word, word]
            path = next((place for place in places if (ROOT / place).exists()), folder + word)
            named.append(path)
            if word.endswith("/"):
                last_folder = word
    return entries, entries + named


def test_every_path_the_readme_layout_names_exists() -> None:
    entries, paths = layout_paths(layout_block())
    assert len(entries) > 10
    missing = [path for path in paths if not (ROOT / path).exists()]
    assert not missing, f"README's Layout names paths that are not in the tree: {missing}"


def test_the_readme_layout_names_every_package_folder() -> None:
    """The other direction, for folders: a new package (a room of router/, torch/) is placed."""
    _, paths = layout_paths(layout_block())
    named = {path.rstrip("/") for path in paths}
    packages = sorted(str(init.parent.relative_to(ROOT)) for package in PACKAGES
                      for init in (ROOT / package).rglob("__init__.py"))
    unnamed = [package for package in packages if package not in named]
    assert not unnamed, f"README's Layout does not name these packages: {unnamed}"


def test_the_layout_parser_resolves_nested_entries_and_names() -> None:
    lines = ["router/        settings.py and one room each:",
             "  backends/      base.py; torch/ its own folder (backend.py)",
             "                 (torch/fused.py), no I/O, factory.py; pyproject.toml",
             "bench/         results under bench/results/, make_docs.py; nothere.py"]
    entries, paths = layout_paths(lines)
    assert entries == ["router/", "router/backends/", "bench/"]
    assert paths[3:] == ["router/settings.py", "router/backends/base.py",
                         "router/backends/torch/", "router/backends/torch/backend.py",
                         "router/backends/torch/fused.py", "router/backends/factory.py",
                         "pyproject.toml", "bench/results/", "bench/make_docs.py",
                         "bench/nothere.py"]


ROOTED = re.compile(r"(?<![\w./-])((?:router|policies|calibration|bench|standins|tests|docs|deploy)/"
                    r"(?:[\w.-]+/)*(?:[\w-]+\.(?:py|md|yaml|json|sh)\b)?)")


@pytest.mark.parametrize("doc", ["README.md", *sorted(
    str(path.relative_to(ROOT)) for path in (ROOT / "docs").glob("*.md"))])
def test_every_project_path_a_doc_names_exists(doc: str) -> None:
    """The docs' file maps: a path from the project root (`router/store/records.py`,
    `tests/reliability/`) that a document names is in the tree."""
    named = ROOTED.findall((ROOT / doc).read_text())
    missing = sorted({path for path in named if not (ROOT / path).exists()})
    assert not missing, f"{doc} names paths that are not in the tree: {missing}"
