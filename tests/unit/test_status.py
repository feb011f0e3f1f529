"""`dppo status` in-process against a loopback HTTP server that stands in for the Kubernetes API server
(kube_api_standin); the real CLI's run is in tests/integration/test_status_cli.py."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kube_api_standin import StandIn, serving, write_kubeconfig

from dppo.commands import status
from dppo.errors import UsageError


@pytest.fixture
def api_server() -> Iterator[StandIn]:
    with serving() as server:
        yield server


@pytest.fixture
def kubeconfig(api_server: StandIn, tmp_path: Path) -> Path:
    return write_kubeconfig(api_server, tmp_path / "kubeconfig")


def run_status(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="dppo")
    status.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["status", *argv])
    return args.func(args)


def test_table_shows_every_run_and_reads_metrics_of_the_live_one_only(
        kubeconfig: Path, api_server: StandIn, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_status("--kubeconfig", str(kubeconfig)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "ENV", "JOB", "DEPLOYMENT", "WORKERS", "ACTORS", "PENDING", "ENV", "STEPS",
                                 "RETURN"]
    assert lines[1].split() == ["big-dppo", "LunarLander-v3", "RUNNING", "Running", "2/2", "7/8", "1", "123,456",
                                 "187.2"]
    assert lines[2].split() == ["cartpole-dppo", "CartPole-v1", "SUCCEEDED", "Complete", "0/2", "-/2", "-", "-", "-"]
    # The namespace came from the kubeconfig context; RayJobs were found by the chart's label; metrics
    # were read only for the live run, through the service proxy.
    assert api_server.requests[0].startswith("/apis/ray.io/v1/namespaces/ml/rayjobs?")
    assert "labelSelector=app.kubernetes.io/name=dppo" in api_server.requests[0]
    assert api_server.requests[1:] == ["/api/v1/namespaces/ml/services/big-dppo-metrics:dppo-metrics/proxy/metrics"]


def test_json_output_for_all_namespaces_lists_every_run(
        kubeconfig: Path, api_server: StandIn, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_status("--kubeconfig", str(kubeconfig), "-A", "-o", "json") == 0
    runs = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in runs] == ["big-dppo", "cartpole-dppo"]
    assert runs[0]["env_steps"] == 123456 and runs[0]["actors_alive"] == 7 and runs[0]["actors_desired"] == 8
    assert runs[0]["actors_pending"] == 1
    assert runs[0]["episode_return_mean"] == pytest.approx(187.25)
    assert api_server.requests[0].startswith("/apis/ray.io/v1/rayjobs?")


def test_other_context_without_runs_says_so_naming_its_namespace(
        kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_status("--kubeconfig", str(kubeconfig), "--context", "other") == 0
    assert capsys.readouterr().out.strip() == "no dppo runs in namespace 'other'"


@pytest.mark.parametrize(("code", "message"), [(404, "install the KubeRay operator"), (403, "check your credentials")])
def test_api_errors_are_one_line_naming_the_fix(kubeconfig: Path, api_server: StandIn, code: int, message: str) -> None:
    api_server.rayjobs_status = code
    with pytest.raises(UsageError, match=message) as err:
        run_status("--kubeconfig", str(kubeconfig))
    assert "\n" not in str(err.value)


def test_missing_kubeconfig_and_unreachable_server_are_usage_errors(
        tmp_path: Path, kubeconfig: Path, api_server: StandIn) -> None:
    with pytest.raises(UsageError, match="no usable Kubernetes config"):
        run_status("--kubeconfig", str(tmp_path / "absent"))
    port = api_server.server_address[1]
    api_server.shutdown()
    api_server.server_close()
    dead = yaml.safe_load(kubeconfig.read_text())
    dead["clusters"][0]["cluster"]["server"] = f"http://127.0.0.1:{port}"
    kubeconfig.write_text(yaml.safe_dump(dead))
    with pytest.raises(UsageError, match="cannot reach the Kubernetes API server"):
        run_status("--kubeconfig", str(kubeconfig))
