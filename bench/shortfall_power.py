"""How large a break of the accuracy promise the accuracy alarm detects, and after how many
labels: the proxy's betting test (``AccuracyShortfallTest``, alpha = alarm_alpha / 2) fed
labels of accepted answers that are right with probability ``accuracy`` below the target, until
it alarms. Rows to detection follow at a given audit rate: labels / (audit rate x accept share).

    python -m bench.shortfall_power [--target 0.95] [--runs 40] [--out FILE]

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from calibration.monitoring import AccuracyShortfallTest

ACCURACIES = (0.945, 0.94, 0.93, 0.92, 0.90, 0.85)


def labels_to_alarm(accuracy: float, *, target: float, alpha: float, cap: int,
                    seed: int) -> int | None:
    test = AccuracyShortfallTest(target, alpha=alpha)
    draw = random.Random(seed)
    for n in range(1, cap + 1):
        if test.update(draw.random() < accuracy):
            return n
    return None


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--target", type=float, default=0.95)
    parser.add_argument("--alarm-alpha", type=float, default=0.05)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--cap", type=int, default=40_000, help="labels per run at most")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    rows = []
    for accuracy in ACCURACIES:
        found = [labels_to_alarm(accuracy, target=args.target, alpha=args.alarm_alpha / 2,
                                 cap=args.cap, seed=run) for run in range(args.runs)]
        hits = [n for n in found if n is not None]
        median = float(np.median([args.cap + 1 if n is None else n for n in found]))
        rows.append({"accuracy": accuracy, "detected_share": len(hits) / args.runs,
                     "labels_median": median,
                     "rows_median_at_audit_rate_0.1_accept_share_0.8": round(median / 0.08)})
        print(json.dumps(rows[-1]), flush=True)
    result = {"target": args.target, "alpha": args.alarm_alpha / 2, "runs": args.runs,
              "cap": args.cap, "levels": rows}
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
