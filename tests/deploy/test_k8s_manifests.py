"""k8s/ holds the chart's defaults rendered for users without Helm; it must not drift from the chart."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "k8s"


def test_manifests_match_helm_template(helm_bin: str, tmp_path: Path) -> None:
    out = subprocess.run(["sh", str(K8S / "render.sh"), str(tmp_path)], env=os.environ | {"HELM": helm_bin},
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    for name in ("dppo.yaml", "monitoring.yaml"):
        expected = (tmp_path / name).read_text()
        assert (K8S / name).read_text() == expected, f"k8s/{name} is stale: run `HELM={helm_bin} k8s/render.sh`"


def test_manifests_hold_the_expected_kinds_and_no_namespace() -> None:
    run = [d for d in yaml.safe_load_all((K8S / "dppo.yaml").read_text()) if d]
    assert sorted(d["kind"] for d in run) == ["ConfigMap", "NetworkPolicy", "RayJob", "Service"]
    assert all("namespace" not in d["metadata"] for d in run), "kubectl apply -n picks the namespace"
    monitoring = [d for d in yaml.safe_load_all((K8S / "monitoring.yaml").read_text()) if d]
    assert sorted(d["kind"] for d in monitoring) == ["ConfigMap", "PodMonitor", "PodMonitor"]
