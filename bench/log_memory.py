"""Peak memory of ``slotgate monitor --plot`` and ``slotgate export-log`` on a large decision log:
both stream the log, so their peak RSS must stay under 300 MiB whatever the log's size. The log
has the demo's shape (77 options, their raw probabilities, a message), every other decision has
feedback, a tenth an audit; the policy is tuned by ``slotgate tune`` on synthetic labelled reads.

Run: python -m bench.log_memory [--mib 200] [--quick]  ->  bench/results/log_memory.json
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from bench.common import ROOT, machine_info, print_table, write_json

LIMIT_MIB = 300
N_OPTIONS = 77
CLI = "from router.cli.app import app; app()"


def synthetic_reads(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Reads sharp enough to tune on, and labels drawn from them (calibrated by construction)."""
    proba = rng.dirichlet(np.full(N_OPTIONS, 0.05), size=n)
    labels = np.array([rng.choice(N_OPTIONS, p=p) for p in proba])
    return proba, labels


def tune_policy(workdir: Path, options: list[str], rng: np.random.Generator) -> tuple[Path, str]:
    proba, labels = synthetic_reads(3000, rng)
    preds = workdir / "tune.jsonl"
    with preds.open("wb") as f:
        for i, (p, y) in enumerate(zip(proba, labels, strict=True)):
            f.write(orjson.dumps({"id": f"t{i}", "options": options, "proba": p.tolist(),
                                  "label": options[y]}) + b"\n")
    policy = workdir / "policy.json"
    run_cli(["tune", "--preds", str(preds), "--target-accuracy", "0.9", "--out", str(policy),
             "--question", "intent"])
    from policies.file import load_policy

    return policy, load_policy(policy).policy_id


def write_log(path: Path, *, mib: float, policy_id: str, options: list[str],
              rng: np.random.Generator) -> int:
    """Decisions (and their labels) until the file holds ``mib`` MiB; returns the decisions."""
    words = ["my", "card", "has", "not", "arrived", "yet", "and", "I", "would", "like", "to",
             "know", "when", "it", "will", "come"]
    n, size = 0, 0
    with path.open("wb") as f:
        while size < mib * 2**20:
            proba, labels = synthetic_reads(500, rng)
            for p, y in zip(proba, labels, strict=True):
                answer = options[int(np.argmax(p))]
                text = " ".join(rng.choice(words, size=int(rng.integers(20, 60))))
                lines = [{"type": "decision", "decision_id": f"d{n}", "time": float(n),
                          "namespace": "default", "policy_id": policy_id, "options": options,
                          "proba": p.tolist(), "answer": answer, "route": "fast",
                          "escalated": False, "signature": "sig", "fingerprint": "fp",
                          "text": text}]
                if n % 2 == 0:
                    lines.append({"type": "feedback", "decision_id": f"d{n}",
                                  "label": options[y], "time": float(n) + 0.5})
                if n % 10 == 0:
                    lines.append({"type": "audit", "decision_id": f"d{n}", "label": answer,
                                  "policy_id": policy_id, "answer": answer, "correct": True})
                data = b"".join(orjson.dumps(line) + b"\n" for line in lines)
                f.write(data)
                size += len(data)
                n += 1
    return n


def run_cli(args: list[str]) -> dict[str, Any]:
    """Run one slotgate command under /usr/bin/time -v: its peak RSS and wall time."""
    started = time.perf_counter()
    done = subprocess.run(["/usr/bin/time", "-v", sys.executable, "-c", CLI, *args], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"slotgate {args[0]} failed ({done.returncode}): {done.stderr[-2000:]}")
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    assert peak is not None, done.stderr[-500:]
    return {"peak_rss_mib": round(int(peak.group(1)) / 1024, 1),
            "wall_s": round(time.perf_counter() - started, 2), "stdout": done.stdout}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=float, default=200.0, help="log size to build (MiB)")
    parser.add_argument("--quick", action="store_true", help="a 20 MiB log (CI)")
    args = parser.parse_args(argv)
    mib = 20.0 if args.quick else args.mib
    rng = np.random.default_rng(0)
    options = [f"intent_{k:02d}_of_the_banking_demo" for k in range(N_OPTIONS)]
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        policy, policy_id = tune_policy(workdir, options, rng)
        log = workdir / "decisions.jsonl"
        n = write_log(log, mib=mib, policy_id=policy_id, options=options, rng=rng)
        log_mib = round(log.stat().st_size / 2**20, 1)
        monitor = run_cli(["monitor", "--log", str(log), "--policy", str(policy), "--plot",
                           str(workdir / "monitor.png"), "--json"])
        [state] = json.loads(monitor.pop("stdout"))["policies"]
        export = run_cli(["export-log", "--log", str(log), "--out", str(workdir / "p.jsonl")])
        export.pop("stdout")
        exported = sum(1 for _ in (workdir / "p.jsonl").open("rb"))
    within = max(monitor["peak_rss_mib"], export["peak_rss_mib"]) < LIMIT_MIB
    result = {"log_mib": log_mib, "decisions": n, "limit_mib": LIMIT_MIB, "within_limit": within,
              "monitor": monitor | {"decisions_replayed": state["decisions"],
                                    "labels": state["labels"],
                                    "trusted_labels": state["trusted_labels"]},
              "export_log": export | {"rows": exported}, "machine": machine_info()}
    print_table(f"peak RSS on a {log_mib} MiB log ({n} decisions)", ["command", "peak RSS MiB",
                "wall s"], [["monitor --plot", monitor["peak_rss_mib"], monitor["wall_s"]],
                            ["export-log", export["peak_rss_mib"], export["wall_s"]]])
    if not args.quick:
        write_json("log_memory.json", result)
    print(json.dumps({k: v for k, v in result.items() if k != "machine"}))
    if not within:
        raise SystemExit(f"peak RSS over {LIMIT_MIB} MiB: the log is not streamed")
    return result


if __name__ == "__main__":
    main()
