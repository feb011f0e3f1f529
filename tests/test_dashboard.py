"""The committed Grafana dashboard: generated from dppo/dashboard.py, well-formed, complete, valid PromQL.

Whether each query returns data against a real Prometheus is tests/test_prometheus_e2e.py's job.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import require

from dppo.ops import dashboard
from dppo.ops.metrics import Metrics

COMMITTED = json.loads(dashboard.DASHBOARD_PATH.read_text())
PANELS = [p for p in COMMITTED["panels"] if p["type"] != "row"]
METRIC_NAME = re.compile(r"\bdppo_[a-z0-9_]+\b")


SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"), "gauge": ("",)}


def registry_samples() -> tuple[set[str], set[str]]:
    """(family names, exposed series names) of a fresh Metrics registry, labelled children or not."""
    families = list(Metrics("CartPole-v1", "test").registry.collect())
    return {f.name for f in families}, {f.name + suffix for f in families for suffix in SUFFIXES[f.type]}


def test_committed_json_is_the_generators_output() -> None:
    assert dashboard.DASHBOARD_PATH.read_text() == dashboard.render(), "run: python -m dppo.ops.dashboard"


def test_fixed_uid_and_variables() -> None:
    assert COMMITTED["uid"] == "dppo-training"
    variables = {v["name"]: v for v in COMMITTED["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["run"]["definition"] == "label_values(dppo_run_info, run)"
    assert variables["run"]["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


@pytest.mark.parametrize("panel", PANELS, ids=[p["title"] for p in PANELS])
def test_every_panel_uses_the_datasource_variable_and_the_run_variable(panel: dict[str, Any]) -> None:
    assert panel["datasource"]["uid"] == "${datasource}"
    assert panel["description"]
    assert panel["targets"]
    for t in panel["targets"]:
        assert t["datasource"]["uid"] == "${datasource}"
        assert 'dppo_run_info{run=~"$run"}' in t["expr"], f"{panel['title']} does not select by run"
    if panel["type"] != "heatmap":
        assert panel["fieldConfig"]["defaults"]["unit"], f"{panel['title']} has no unit"


def test_layout_is_a_grid_without_overlaps() -> None:
    ids = [p["id"] for p in COMMITTED["panels"]]
    assert len(ids) == len(set(ids))
    occupied: set[tuple[int, int]] = set()
    for panel in COMMITTED["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        cells = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not cells & occupied, f"{panel['title']} overlaps another panel"
        occupied |= cells


def test_the_issues_panels_are_there() -> None:
    titles = " | ".join(p["title"].lower() for p in PANELS)
    for words in ("episode return", "distribution", "env steps per second", "episodes per second",
                  "phase duration", "policy loss", "value loss", "entropy", "approx kl", "clip fraction",
                  "explained variance", "learning rate", "policy version", "actors alive", "actor restarts",
                  "checkpoints"):
        assert words in titles, f"no panel about {words!r}"


def test_queries_use_only_registered_metrics_and_show_every_metric() -> None:
    families, samples = registry_samples()
    used = {name for _, expr in dashboard.queries(COMMITTED) for name in METRIC_NAME.findall(expr)}
    assert used <= samples, f"unknown metrics in the dashboard: {sorted(used - samples)}"
    shown = {f for f in families if any(name == f or name.startswith(f + "_") for name in used)}
    assert shown == families, f"metrics missing from the dashboard: {sorted(families - shown)}"


def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses each query as a recording rule (no server needed)."""
    promtool = shutil.which("promtool")
    require(promtool is not None, "promtool not found; `apt-get install prometheus` provides it")
    rules = [{"record": f"dppo:panel_{i}", "expr": expr.replace("$__rate_interval", "1m").replace("$run", ".*")}
             for i, (_, expr) in enumerate(dashboard.queries(COMMITTED))]
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    check = subprocess.run([str(promtool), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr


def test_check_mode_detects_a_stale_file(tmp_path: Path) -> None:
    stale = tmp_path / "dppo.json"
    stale.write_text("{}\n")
    assert dashboard.main(["--check", "-o", str(stale)]) == 1
    assert dashboard.main(["-o", str(stale)]) == 0
    assert dashboard.main(["--check", "-o", str(stale)]) == 0
