"""Writes the generated parts of docs/backends.md (never typed by hand): the torch backend's speed
options table from ``TorchOptions``' field descriptions, and the current GPU figures, one table
per GPU, from bench/results/gpu_read*.json (each file one ``bench.gpu_read`` run, stamped with
its command and code commit). Each part sits between its ``<!-- name:begin -->`` and
``<!-- name:end -->`` markers; the text around them is the doc's own.

    python -m bench.torch_docs [--check]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from router.backends.torch.options import GRAPH_OPTIONS, SPEED_OPTIONS, TorchOptions

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "backends.md"
RESULTS = ROOT / "bench" / "results"


def _default(name: str) -> str:
    value = TorchOptions.model_fields[name].default
    return "unset" if value is None else f"`{json.dumps(value)}`"


def options_table() -> str:
    """The speed options: name, default, what it trades; then the graph shapes' names."""
    rows = ["| option | default | what it trades |", "| --- | --- | --- |"]
    for name in SPEED_OPTIONS:
        description = TorchOptions.model_fields[name].description or ""
        rows.append(f"| `{name}` | {_default(name)} | {description} |")
    shapes = ", ".join(f"`{name}`" for name in GRAPH_OPTIONS)
    return "\n".join(rows) + (f"\n\nGraph shapes (the buckets warm-up captures; a read is padded up "
                              f"to the smallest that holds it): {shapes}.\n")


def _ms(value: Any) -> str:
    return f"{value:.1f}" if isinstance(value, (int, float)) else "-"


def _depth(run: dict[str, Any]) -> str:
    """"the full architecture", or its first N layers where the run's command cut it (--layers N)."""
    words = str(run.get("command", "")).split()
    layers = words[words.index("--layers") + 1] if "--layers" in words[:-1] else "0"
    return f"the architecture's first {layers} layers" if layers != "0" else "the full architecture"


def figures(results: dict[str, dict[str, Any]]) -> str:
    """One table a run (a file), ordered by GPU: the shipped backend's single reads and its
    reads/s by concurrent callers (each run's ``backend`` block), with its command and commit."""
    out = []
    for name, run in sorted(results.items(), key=lambda kv: (str(kv[1].get("device")), kv[0])):
        backend = run.get("backend") or {}
        if "curve" not in backend:
            continue
        out.append(f"#### {run.get('device', 'unknown GPU')} (`bench/results/{name}`)\n")
        out.append(f"Code {run.get('code_commit', 'unknown')}, measured {run.get('measured_on', '-')}, "
                   f"torch {run.get('torch', '-')}, transformers {run.get('transformers', '-')}; "
                   f"`{run.get('command', '-')}`. Random bf16 weights of {_depth(run)} "
                   f"({run.get('params_b', '-')} B parameters), a {backend.get('prefix_tokens', '-')}-token "
                   f"cached prefix, {backend.get('suffix_tokens', '-')}-token prompt rests, "
                   f"{run.get('options', '-')} options"
                   + (f", requests spread over {backend['questions']} questions (each its own "
                      "prefix)" if backend.get("questions", 1) > 1 else "") + ".\n")
        targets = run.get("targets") or {}
        out.append("| figure | value | target |\n| --- | ---: | ---: |")
        out.append(f"| single read p50 / p99 ms | {_ms(backend.get('single_p50_ms'))} / "
                   f"{_ms(backend.get('single_p99_ms'))} | {targets.get('single_p50_ms', '-')} |")
        out.append(f"| 4 draws p50 ms | {_ms(backend.get('draws4_p50_ms'))} | - |")
        out.append(f"| reads/s at 32 callers | {_ms(backend.get('concurrent32_reads_per_s'))} | "
                   f"{targets.get('concurrent32_reads_per_s', '-')} |\n")
        out.append("| callers | reads/s | p50 ms | p99 ms | mean batch | reader ms a batch |")
        out.append("| ---: | ---: | ---: | ---: | ---: | ---: |")
        for callers, row in sorted(backend["curve"].items(), key=lambda kv: int(kv[0])):
            if "reads_per_s" not in row:
                continue
            out.append(f"| {callers} | {_ms(row['reads_per_s'])} | {_ms(row['p50_ms'])} | "
                       f"{_ms(row['p99_ms'])} | {_ms(row['mean_batch'])} | "
                       f"{_ms(row['reader_ms_per_batch'])} |")
        out.append("")
    return "\n".join(out) if out else "No GPU run is committed.\n"


def load_results(folder: Path = RESULTS) -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(folder.glob("gpu_read*.json"))}


PARTS: dict[str, Callable[[], str]] = {
    "torch-options": options_table,
    "gpu-figures": lambda: figures(load_results()),
}


def render(text: str) -> str:
    """``text`` with each part between its markers written anew."""
    for name, make in PARTS.items():
        begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
        if begin not in text or end not in text:
            raise ValueError(f"docs/backends.md lacks the {begin} ... {end} markers")
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = f"{head}{begin}\n{make().rstrip()}\n{end}{tail}"
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when docs/backends.md differs from what would be written")
    args = parser.parse_args()
    text = DOC.read_text()
    new = render(text)
    if args.check:
        if new != text:
            print("docs/backends.md is stale: run python -m bench.torch_docs", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(new)
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
