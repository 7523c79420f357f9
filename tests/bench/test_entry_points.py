"""The benchmarks' safety net: every module under bench/ imports and every runnable one builds
its command line and answers ``--help``, in this process (the ``__main__`` block run as
``python -m`` runs it); and, under ``make bench-smoke`` only, every benchmark with a ``--quick``
path runs it to the end in a fresh interpreter, as a user types it.

What each benchmark reports is checked for meaning, on data small enough to take seconds, by the
tests beside this one (test_shadow.py, test_guarantee.py, ...); the quick runs here add the real
sizes and the peers (the LiteLLM proxy, installed into bench/.venv-litellm on first use).

Result files go to a temporary folder (``SLOTGATE_BENCH_RESULTS``, ``--out``, ``--work``), never
over the committed bench/results/."""

from __future__ import annotations

import contextlib
import importlib
import os
import pkgutil
import runpy
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import bench
from tests.conftest import ROOT

# every module, those of bench's packages (bench/candidates/) too: "candidates.flex_attention"
MODULES = sorted(m.name for m in pkgutil.walk_packages(bench.__path__) if not m.ispkg)


def source(module: str) -> str:
    return (ROOT / "bench" / f"{module.replace('.', '/')}.py").read_text()


RUNNABLE = [m for m in MODULES if '__name__ == "__main__"' in source(m)]
HAS_QUICK = {m for m in RUNNABLE if '"--quick"' in source(m)}

# Extra arguments of each quick run: where it may write ({tmp} is the test's folder).
QUICK_ARGS: dict[str, list[str]] = {
    "auditor_evidence": ["--work", "{tmp}/work", "--out", "{tmp}/auditor_evidence.json"],
    "break_power": ["--work", "{tmp}/work", "--out", "{tmp}/break_power.json"],
    "cache": [],
    "cascade": ["--work", "{tmp}/work", "--out", "{tmp}/cascade.json",
                "--png", "{tmp}/cascade.png"],
    "decision_log_cost": [],
    "drift": ["--work", "{tmp}/work", "--out", "{tmp}/drift.json"],
    "guarantee": ["--out", "{tmp}/guarantee.json"],
    "host_path": ["--out", "host_path.json"],
    "load": [],
    "log_memory": [],
    "overhead": [],
    "tiers": ["--work", "{tmp}/work", "--out", "{tmp}/tiers.json"],
    "watch": ["--work", "{tmp}/work", "--out", "{tmp}/watch.json"],
}
# Benchmarks with a --quick path that is still not a smoke run here, and why (--help only).
QUICK_SKIPPED = {
    "ab": "compares two commits' servers (needs --before <commit> and a second checkout)",
    "moe_kernels": "times CUDA kernels (needs a CUDA device; its kernels run in the CPU tests under "
                   "Triton's interpreter: tests/router/backends/torch/test_triton_moe.py)",
}
# Quick runs another test already makes, asserting the benchmark's targets: not run twice.
QUICK_RUN_ELSEWHERE = {"drift": "tests/bench/test_drift.py", "watch": "tests/bench/test_watch.py"}
# Quick runs that print their figures and write no file (by design: a smoke run).
QUICK_PRINTS_ONLY = {"log_memory"}
QUICK_TIMEOUT_S = 900


def test_every_quick_benchmark_is_run_or_excused() -> None:
    """A new benchmark with --quick joins QUICK_ARGS (or QUICK_SKIPPED, with a reason)."""
    assert set(QUICK_ARGS) | set(QUICK_SKIPPED) == HAS_QUICK
    assert not set(QUICK_ARGS) & set(QUICK_SKIPPED)


@pytest.mark.parametrize("module", MODULES)
def test_bench_module_imports(module: str) -> None:
    importlib.import_module(f"bench.{module}")


@pytest.mark.parametrize("module", RUNNABLE)
def test_bench_command_line_builds(module: str, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str],
                                   _results_elsewhere: Path) -> None:
    """``python -m bench.<module> --help``, in this process: the parser is built and prints its
    usage, and nothing runs."""
    path = ROOT / "bench" / f"{module}.py"
    monkeypatch.setattr(sys, "argv", [str(path), "--help"])
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(str(path), run_name="__main__")
    assert exited.value.code in (0, None)
    assert "usage:" in capsys.readouterr().out
    assert not _results_elsewhere.exists()  # --help ran nothing


def left_running(session: int) -> dict[int, str]:
    """Processes (pid: command) still alive in the session ``session``: what a run started as its
    own session's leader started and left behind (a child keeps its parent's session unless it
    calls setsid; redis-server does not, and it rewrites its own environment, so no marker there
    survives)."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == session and fields[0] != "Z":
                cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ")
                found[int(stat.parent.name)] = cmdline.decode(errors="replace").strip()
        except (OSError, ValueError, IndexError):  # gone meanwhile
            continue
    return found


def run_module(module: str, *args: str, tmp_path: Path, timeout_s: float) -> str:
    """Runs ``python -m bench.<module> args`` as the leader of a session of its own; fails when
    it fails, or when anything it started outlives it (killed here): a benchmark that started
    its redis-server twice on one port lost the first one's handle, which outlived every run."""
    env = {**os.environ, "SLOTGATE_BENCH_RESULTS": str(tmp_path / "results"),
           "PYTHONPATH": str(ROOT)}
    with subprocess.Popen([sys.executable, "-m", f"bench.{module}", *args], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
    output = stdout + stderr
    assert proc.returncode == 0, f"python -m bench.{module} {' '.join(args)} -> " \
                                 f"{proc.returncode}:\n{output[-4000:]}"
    deadline = time.monotonic() + 10  # what it stopped may take a moment to exit
    while (leaked := left_running(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in leaked:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not leaked, f"python -m bench.{module} {' '.join(args)} left running: {leaked}"
    return output


@pytest.mark.bench_smoke
@pytest.mark.timeout(QUICK_TIMEOUT_S + 60)
@pytest.mark.parametrize("module", sorted(set(QUICK_ARGS) - set(QUICK_RUN_ELSEWHERE)))
def test_bench_quick(module: str, tmp_path: Path) -> None:
    args = [a.format(tmp=tmp_path) for a in QUICK_ARGS[module]]
    run_module(module, "--quick", *args, tmp_path=tmp_path, timeout_s=QUICK_TIMEOUT_S)
    # Its result went where it was told (so not over the committed bench/results/, which other
    # people's benchmark runs may be writing meanwhile: not compared here).
    written = [p for p in tmp_path.rglob("*.json") if "work" not in p.relative_to(tmp_path).parts]
    assert written or module in QUICK_PRINTS_ONLY, \
        f"python -m bench.{module} --quick wrote no result under {tmp_path}"
