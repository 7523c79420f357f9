"""The Grafana dashboard under deploy/ is checked statically: valid JSON of the shape Grafana
imports, panels that do not overlap, and queries that name only metrics slotgate exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from router.store.metrics import Metrics

DASHBOARD = Path(__file__).resolve().parent.parent / "deploy/grafana/slotgate-monitoring.json"


def exported_metric_names() -> set[str]:
    metrics = Metrics()
    metrics.policy_state({"policy_id": "p@1", "accept_share": 0.8, "reference_accept_share": 0.8,
                          "accuracy_lower": 0.9, "accuracy_upper": 1.0, "labels": 3,
                          "drift_log_martingale": 0.1, "alarm": None})
    metrics.audit("p@1", "done")
    metrics.decision(route="fast", escalated=False)
    names = set()
    for line in metrics.render().decode().splitlines():
        if line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def test_dashboard_is_importable_and_queries_only_exported_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and isinstance(dashboard["schemaVersion"], int)
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "policy"} <= variables
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    exported = exported_metric_names()
    queried = set()
    for panel in panels:
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24, panel["title"]
        area = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not area & cells, f"panel {panel['title']!r} overlaps another"
        cells |= area
        assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"]
        for target in panel["targets"]:
            expr = target["expr"]
            assert expr.count("(") == expr.count(")"), expr
            for name in re.findall(r"\bslotgate_[a-z_]+", expr):
                assert name in exported, f"{panel['title']!r} queries {name}, not exported"
                queried.add(name)
    for gauge in ("slotgate_policy_accept_share", "slotgate_policy_accuracy_lower_bound",
                  "slotgate_policy_alarm", "slotgate_audits_total"):
        assert gauge in queried
