"""The cost-accuracy frontier as a PNG: overall accuracy against the share of decisions sent to
the slow tier, one curve per fast tier, the tuned operating points marked with their targets."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

COLOURS = {"tfidf": "tab:blue", "wordllama": "tab:orange"}


def frontier_png(path: Path, *, curves: Mapping[str, Mapping[str, list[float]]],
                 rows: Sequence[Mapping[str, Any]], slow_accuracy: float, title: str) -> Path:
    """``curves[tier]`` holds ``escalation_rate`` and ``accuracy`` lists; ``rows`` the operating
    points (``tier``, ``target`` or None, ``escalation_rate``, ``accuracy``, optional ``live``)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, headless
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8.0, 5.5), layout="constrained")
    ax = figure.add_subplot()
    for tier, curve in curves.items():
        colour = COLOURS.get(tier, "tab:green")
        ax.plot(curve["escalation_rate"], curve["accuracy"], color=colour, linewidth=1.2,
                alpha=0.6, label=f"{tier} + LR -> MiniLM + LR (any threshold)")
        for row in rows:
            if row["tier"] != tier:
                continue
            x, y = row["escalation_rate"], row["accuracy"]
            ax.plot([x], [y], "o", color=colour, markersize=6)
            text = f"{row['target']:g}" if row.get("target") else "fast alone"
            ax.annotate(text, (x, y), textcoords="offset points", xytext=(6, -12), fontsize=8,
                        color=colour)
            live = row.get("live")
            if live:  # the proxy's measured escalation on the sent subset
                ax.plot([live["escalation_rate"]], [live["accuracy"]], "x", color=colour,
                        markersize=6)
    ax.axhline(slow_accuracy, color="grey", linestyle="--", linewidth=1)
    ax.plot([1.0], [slow_accuracy], "s", color="grey")
    ax.annotate(f"slow alone (MiniLM + LR) {slow_accuracy:.3f}", (1.0, slow_accuracy),
                textcoords="offset points", xytext=(-170, 6), fontsize=8, color="grey")
    ax.plot([], [], "o", color="black", label="tuned policy (offline, all of test.csv)")
    ax.plot([], [], "x", color="black", label="same policy through the proxy (sent subset)")
    ax.set_xlabel("escalation rate (share of decisions sent to the slow tier)")
    ax.set_ylabel("overall accuracy on BANKING77 test")
    ax.set_xlim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(title, fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png", dpi=120)
    return path
