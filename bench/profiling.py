"""Where a benchmarked server spends its time: py-spy attached to it (Profiler), a summary of
the collapsed stacks (profile_top), and what one full garbage collection costs in a process
holding slotgate's modules and litellm (gc_probe)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


class Profiler:
    """py-spy attached to a running server (``--pid``), sampling until ``stop()``; its output is
    collapsed stacks (one ``frame;frame;... count`` line per distinct stack)."""

    def __init__(self, pid: int, out: Path, *, rate_hz: int = 250) -> None:
        spy = Path(sys.executable).parent / "py-spy"
        if not spy.exists():
            raise RuntimeError("py-spy not installed: .venv/bin/pip install py-spy")
        self.out = out
        self.proc = subprocess.Popen(
            [str(spy), "record", "--pid", str(pid), "--format", "raw", "--rate", str(rate_hz),
             "--function", "--nonblocking", "--output", str(out)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)

    def stop(self) -> Path | None:
        self.proc.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        return self.out if self.out.exists() else None


def profile_top(collapsed: Path, *, n: int = 15) -> dict[str, Any]:
    """Top costs in py-spy's collapsed stacks (``frame;frame;... count``, idle samples already
    left out by py-spy): self time per function, inclusive time per project function
    (router/, policies/, calibration/), and self time per package."""
    self_n: dict[str, int] = {}
    incl_n: dict[str, int] = {}
    pkg_n: dict[str, int] = {}
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not count_s.isdigit():
            continue
        frames = [_short(f) for f in stack.split(";") if "(" in f]
        if not frames:
            continue
        count = int(count_s)
        total += count
        self_n[frames[-1]] = self_n.get(frames[-1], 0) + count
        pkg = _package(frames[-1])
        pkg_n[pkg] = pkg_n.get(pkg, 0) + count
        for f in set(frames):
            if _package(f) in ("router", "policies", "calibration"):
                incl_n[f] = incl_n.get(f, 0) + count

    def top(d: dict[str, int], k: int = n) -> list[dict[str, Any]]:
        ranked = sorted(d.items(), key=lambda kv: -kv[1])[:k]
        return [{"frame": f, "share": c / total} for f, c in ranked]

    return {"samples": total, "top_self": top(self_n), "top_inclusive_project": top(incl_n),
            "self_by_package": top(pkg_n, 12)}


def _short(frame: str) -> str:
    """'func (/long/path/site-packages/pkg/mod.py)' -> 'func (pkg/mod.py)'."""
    name, _, where = frame.rpartition(" (")
    where = where.rstrip(")").split("site-packages/")[-1].split("python3.11/")[-1]
    where = where.removeprefix(str(ROOT) + "/")
    return f"{name} ({where.rsplit(':', 1)[0]})"


def _package(frame: str) -> str:
    where = frame.rpartition(" (")[2].rstrip(")")
    return where.split("/")[0] if "/" in where else where.removesuffix(".py")


GC_PROBE = """
import gc, json, os, sys, time
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
sys.path.insert(0, sys.argv[1])
import router.http.app, router.routing.service, router.routing.slow, router.http.server
before = len(gc.get_objects())
t = time.perf_counter(); import litellm; import_s = time.perf_counter() - t
def full_collect_ms():
    t = time.process_time(); gc.collect(); return (time.process_time() - t) * 1000
gc.collect()
out = {"objects_router_only": before, "objects_with_litellm": len(gc.get_objects()),
       "litellm_import_s": import_s, "full_collect_cpu_ms": min(full_collect_ms() for _ in range(3))}
gc.freeze()
out["full_collect_cpu_ms_after_freeze"] = min(full_collect_ms() for _ in range(3))
print(json.dumps(out))
"""


def gc_probe() -> dict[str, Any]:
    """What a full collection costs in a process holding slotgate's modules and litellm (CPU
    time, so a loaded machine does not inflate it), and after ``gc.freeze()``."""
    done = subprocess.run([sys.executable, "-c", GC_PROBE, str(ROOT)], capture_output=True,
                          text=True, check=False, timeout=120)
    lines = done.stdout.strip().splitlines()
    return json.loads(lines[-1]) if done.returncode == 0 and lines else {"error": done.stderr[-500:]}
