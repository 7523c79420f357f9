"""``slotgate monitor``: the state of each policy's production monitoring, replayed from a decision
log, as a table (or JSON) and a PNG over time (accept share, audited accuracy with its confidence
sequence, the drift martingale, alarm points)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:  # numpy and the monitors load with the command, not with every CLI start
    from router.monitoring.replay import Series


def monitor(
    log: Annotated[Path, typer.Option(help="Decision log JSONL (the proxy's log.decision_log_path).")],
    policy: Annotated[list[str], typer.Option(help="Policy the proxy served: a policy file, or "
                                              "the id or name of one ./slotgate.yaml loads; "
                                              "repeat the option for several.")],
    plot: Annotated[Path | None, typer.Option(help="PNG to write (one row of panels per "
                                              "policy); none without it.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Replay a decision log's monitoring: accept share against the tuning rows, audited
    accuracy with its anytime-valid bounds, the drift martingale, and alarms."""
    from router.cli.common import check_out, fail, show_table
    from router.cli.policy_ref import read_policy
    from router.monitoring.replay import LogError, replay_log
    from router.monitoring.watch import ACCEPT_WINDOW

    policies = [read_policy(p)[1] for p in policy]
    files = {p.policy_id: p for p in policies}
    if plot is not None:
        check_out(plot, "--plot")
    try:
        series = replay_log(log, policies)
    except LogError as exc:
        fail(f"--log: {exc}")
    if plot is not None:
        write_plot(plot, series)
    if as_json:
        typer.echo(json.dumps({"policies": [s.as_json() for s in series]}))
        return
    for s in series:
        state = s.state
        show_table(f"monitoring of {s.policy_id} ({log.name})", [
            ("decisions (accepted)", f"{state['decisions']} ({state['accepted']})"),
            (f"accept share: last {min(state['decisions'], ACCEPT_WINDOW)} / tuning rows",
             f"{fmt(state['accept_share'])} / {fmt(state['reference_accept_share'])}"),
            ("drift martingale (log) / alarm at",
             "no tuning summary: no drift test" if s.drift_threshold is None else
             f"{fmt(state['drift_log_martingale'])} / {fmt(s.drift_threshold)}"),
            ("labelled accepted decisions (audits, weighted)", str(state["labels"])),
            ("accepted accuracy, weighted (anytime-valid bounds)",
             (f"{fmt(state['accuracy'])} [{fmt(state['accuracy_lower'])}, "
             f"{fmt(state['accuracy_upper'])}] (target {state['target_accuracy']})")),
            ("trusted labels (accuracy)",
             f"{state['trusted_labels']} ({fmt(state['trusted_accuracy'])})"),
            ("alarm (replayed)", "none" if not s.alarms else
             f"{s.alarms[0]['kind']} at decision {s.alarms[0]['decision'] + 1}: "
             f"{s.alarms[0]['detail']}"),
            ("alarms the proxy logged", str(len(s.logged_alarms))),
            ("decisions not replayed (read does not fit) / damaged log lines",
             f"{s.unfit} / {s.damaged_lines}"),
        ])
        cascade = files[s.policy_id].cascade
        if cascade is not None:
            show_table(f"tiers of {s.policy_id}: answered share, live / tuning rows", [
                row for tier in cascade.tiers for row in tier_rows(tier, s)])
        if s.per_answer:
            show_table(f"accepted accuracy per answer, worst first (95% Clopper-Pearson; "
                       f"{len(s.per_answer)} answers)", s.per_answer_rows())
    if plot is not None:
        typer.echo(f"wrote {plot}")


def tier_rows(tier: Any, series: Series) -> list[tuple[str, str]]:
    """A cascade tier's rows: how many decisions it read and answered, its answered share live
    against the tuning rows', and the labels of its answers (the promise is on all tiers'
    answers together; one tier's accuracy may sit under the target by design)."""
    from calibration.metrics import proportion_ci

    tally = series.tiers.get(tier.name)
    n = len(series.accepted)
    read, answered = (0, 0) if tally is None else (tally.read, tally.answered)
    rows = [(f"{tier.name}: read / answered",
             f"{read} / {answered} (threshold {fmt(tier.threshold)})"),
            (f"{tier.name}: answered share, live / tuning rows",
             f"{fmt(answered / n if n else None)} / {fmt(tier.coverage)}")]
    if tally is not None and tally.drift is not None:
        rows.append((f"{tier.name}: drift of its accepted reads (log) / alarm at",
                     f"{fmt(tally.drift)} / {fmt(series.drift_threshold)}" + (
                         "" if tally.drift_alarm is None
                         else f"; passed at decision {tally.drift_alarm + 1}")))
        rows.append((f"{tier.name}: traffic test on all its reads",
                     "quiet" if tally.traffic_tripped_at is None
                     else f"tripped at decision {tally.traffic_tripped_at + 1}"))
    if tally is not None and tally.labelled:
        low, high = proportion_ci(tally.correct, tally.labelled)
        shown = (f"{fmt(tally.correct / tally.labelled)} [{fmt(low)}, {fmt(high)}] "
                 f"({tally.correct}/{tally.labelled})")
        rows.append((f"{tier.name}: labelled accuracy of its answers", shown))
    return rows


def fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def write_plot(path: Path, series: list[Series]) -> Path:
    """Per policy: accept share (rolling) against the tuning rows', the audited accuracy's
    confidence sequence against the target, the drift martingale against its alarm level."""
    from calibration.plots import new_figure, save_figure

    figure = new_figure(15.0, 4.0 * len(series))
    grid = figure.subplots(len(series), 3, squeeze=False)
    for (share_ax, accuracy_ax, drift_ax), s in zip(grid, series, strict=True):
        x = range(1, len(s.accepted) + 1)
        share_ax.plot(x, s.rolling_accept_share(), color="tab:blue", label="accept share "
                      "(last 200)")
        if s.reference_accept_share is not None:
            share_ax.axhline(s.reference_accept_share, color="grey", linestyle="--",
                             label="tuning rows")
        share_ax.set_ylim(0, 1.02)
        share_ax.set_title(f"{s.policy_id}: accept share")
        if s.labels:
            at = [i + 1 for i, *_ in s.labels]
            running = s.running_accuracy()
            accuracy_ax.fill_between(at, [lo for *_, lo, _ in s.labels],
                                     [hi for *_, hi in s.labels], color="tab:green", alpha=0.25,
                                     step="post", label="confidence sequence")
            accuracy_ax.plot(at, running, color="tab:green", drawstyle="steps-post",
                             label="audited accuracy")
        accuracy_ax.axhline(s.target_accuracy, color="tab:red", linestyle="--", label="target")
        accuracy_ax.set_ylim(0, 1.02)
        accuracy_ax.set_title(f"accepted accuracy ({len(s.labels)} labels)")
        if s.drift:
            drift_ax.plot(x, s.drift, color="tab:purple", label="log martingale")
            assert s.drift_threshold is not None
            # The drift test holds half the policy's alarm_alpha (the accuracy test the other).
            drift_ax.axhline(s.drift_threshold, color="tab:red", linestyle="--",
                             label=f"alarm level log(2/alarm_alpha) = {s.drift_threshold:.2f}")
        drift_ax.set_title("drift martingale" if s.drift else "no tuning summary: no drift test")
        for ax in (share_ax, accuracy_ax, drift_ax):
            for alarm in s.alarms:
                ax.axvline(alarm["decision"] + 1, color="black", linewidth=1.5,
                           label=f"{alarm['kind']} alarm")
            ax.set_xlim(0, len(s.accepted) + 1)
            ax.set_xlabel("decision")
            ax.grid(alpha=0.3)
            ax.legend(loc="best", fontsize=8)
    return save_figure(figure, path)
