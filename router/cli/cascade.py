"""What ``slotgate tune`` and ``slotgate eval`` print and parse for a policy of several fast
tiers (docs/cascade.md): the ``--tier NAME=COST`` flags, what tuning chose per tier, and the
metrics per tier and for the whole. The commands themselves are ``router.cli.policy``'s."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from router.cli.common import (
    fail,
    fmt,
    show_table,
)

if TYPE_CHECKING:
    from policies.file import PolicyFile
    from policies.policy import Policy, TierCost


def tier_costs(values: list[str] | None, *, n_files: int) -> list[TierCost]:
    """--tier NAME=COST, one per --preds, names distinct; exits 2 naming the flag."""
    from policies.policy import TierCost

    if values is None or len(values) != n_files:
        fail(f"--tier: a cascade of {n_files} --preds needs one --tier NAME=COST per file, in "
             f"their order (got {0 if values is None else len(values)})")
    costs = []
    for value in values:
        tier_name, sep, raw = value.rpartition("=")
        try:
            cost = float(raw)
        except ValueError:
            cost = math.nan
        if not sep or not tier_name.strip() or not math.isfinite(cost) or cost < 0:
            fail(f"--tier: {value!r} is not NAME=COST with a name and a finite cost >= 0 "
                 "(e.g. fast=0.2)")
        costs.append(TierCost(tier_name.strip(), cost))
    names = [cost.name for cost in costs]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        fail(f"--tier: tier names must be distinct ({', '.join(repeated)} repeats)")
    return costs


def show_cascade(policy: PolicyFile, fitted: Policy, *, out: Path, n_slow: int,
                 n_labelled: int) -> None:
    """What tuning a cascade chose: each tier's threshold, the share of threshold rows it
    answered and its cost; the slow model's share; the expected cost; the joint bound."""
    chosen, cascade = fitted.thresholds_, policy.cascade
    assert cascade is not None
    fitted_question = None if policy.question is None else policy.question.question()
    rows = [
        ("tuning", "split"),
        ("rows: calibration / threshold", f"{fitted.n_calibration_} / {fitted.n_tune_}"),
        ("guarantee", policy.guarantee + (f" ({n_slow} of {n_labelled} labels are the slow "
                                          "model's answers)" if n_slow else "")),
    ]
    for k, tier in enumerate(cascade.tiers):
        rows.append((f"tier {k + 1} {tier.name!r} (cost {tier.cost:g})",
                     "not read" if tier.threshold is None
                     else f"threshold {tier.threshold:.4f}, answers {tier.coverage:.4f}"))
    rows += [
        (f"slow model (cost {cascade.slow_cost:g})", f"answers {cascade.slow_coverage:.4f}"
         + ("" if cascade.max_slow_share is None else
            f" (cap {cascade.max_slow_share}, bound {cascade.slow_share_bound:.4f})")),
        ("expected cost per decision (threshold rows)", f"{cascade.expected_cost:.4g}"),
        (f"accuracy lower bound, all tiers (1-delta = {1 - policy.delta:.2f})",
         f"{policy.bound:.4f}"),
        ("passed", "yes" if chosen.passed_ else f"no: {chosen.reason_}"),
        ("question", "one logged question (its signature)" if fitted_question is None
         else fitted_question.describe()),
        ("backend fingerprints", ", ".join(t.backend_fingerprint for t in cascade.tiers)),
        *cost_rows(policy),
    ]
    show_table(f"policy {policy.policy_id} -> {out}", rows)


def cost_rows(policy: PolicyFile) -> list[tuple[str, str]]:
    """The cost promise's rows of a tuned policy's table (none without one)."""
    cost = policy.cost_promise
    if cost is None:
        return []
    return [
        (f"cost promise (1-delta = {1 - cost.delta:.2f})",
         (f"slow share <= {cost.share:g} in each block of {cost.block}: bound "
          f"{cost.block_bound:.4f} (escalated {cost.n_escalated} of {cost.n} threshold rows, "
          f"upper bound {cost.escalation_upper:.4f}; live check at {cost.live_cap:.4f})")),
        ("coverage: both promises / accuracy alone",
         f"{policy.coverage:.4f} / {cost.coverage_alone:.4f}"),
    ]


def show_block_shares(blocks: dict[str, Any]) -> None:
    """``slotgate eval``'s line on a cost promise (``policies.evaluation.block_shares``)."""
    if not blocks["blocks"]:
        typer.echo(f"cost promise: these rows fill no block of {blocks['block']} decisions")
        return
    typer.echo(f"cost promise: {blocks['blocks_over']} of {blocks['blocks']} blocks of "
               f"{blocks['block']} rows (in file order) over the slow share {blocks['share']:g};"
               f" worst block {blocks['worst_block_share']:.4f}, all rows "
               f"{blocks['slow_share']:.4f}")


def show_cascade_metrics(metrics: dict[str, Any], tuned: PolicyFile, *, n_files: int) -> None:
    """A cascade's evaluation as a table: each tier's threshold, cost, answered share and
    accepted accuracy; the slow model's share; the whole cascade's accuracy, coverage, cost."""
    rows = [
        ("rows (labelled)", str(metrics["n"])
         + (f", {metrics['n_novel']} of them novel (counted wrong)" if metrics["n_novel"] else "")),
    ]
    for k, tier in enumerate(metrics["tiers"]):
        label = f"tier {k + 1} {tier['name']!r}"
        if tier["threshold"] is None:
            rows.append((label, "not read"))
            continue
        rows += [
            (f"{label}: threshold, cost", f"{tier['threshold']:.4f}, {tier['cost']:g}"),
            (f"{label}: answered share", fmt(tier["answered_share"], tier["answered_share_ci"])),
            (f"{label}: accepted accuracy",
             fmt(tier["accepted_accuracy"], tier["accepted_accuracy_ci"])),
        ]
    rows += [
        (f"slow model (cost {metrics['slow_cost']:g}): share",
         fmt(metrics["escalation_rate"], metrics["escalation_rate_ci"])),
        ("accepted accuracy, all tiers",
         fmt(metrics["accepted_accuracy"], metrics["accepted_accuracy_ci"])),
        ("target accuracy", f"{tuned.target_accuracy} (delta {tuned.delta})"),
        ("coverage, all tiers", fmt(metrics["coverage"], metrics["coverage_ci"])),
        ("expected cost per decision", f"{metrics['expected_cost']:.4g}"),
    ]
    show_table(f"{tuned.policy_id} on {n_files} tiers' predictions (95% intervals)", rows)
