"""`dppo status` against a loopback HTTP server that stands in for the Kubernetes API server: it serves
only the few paths the command reads (no API server runs on this machine)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

import pytest
import yaml
from conftest import require

from dppo.commands import status
from dppo.errors import UsageError

METRICS = """\
# HELP dppo_env_steps_total Env steps collected by all actors.
# TYPE dppo_env_steps_total counter
dppo_env_steps_total 123456.0
# HELP dppo_episode_return_mean Mean return of the last 100 finished episodes.
# TYPE dppo_episode_return_mean gauge
dppo_episode_return_mean 187.25
# HELP dppo_actors_alive Actors currently alive.
# TYPE dppo_actors_alive gauge
dppo_actors_alive 7.0
# HELP dppo_actors_pending Replacements of lost actors waiting for the cluster to place and start them.
# TYPE dppo_actors_pending gauge
dppo_actors_pending 1.0
# HELP dppo_run_info Constant 1, labelled with the run's env id and name.
# TYPE dppo_run_info gauge
dppo_run_info{env="LunarLander-v3",run="big-dppo"} 1.0
"""


def rayjob(name: str, namespace: str, deployment: str, job: str, ready: int, desired: int, actors: int,
           env: str) -> dict[str, Any]:
    """A RayJob as the API server returns it for the chart's object (status filled in by KubeRay)."""
    return {
        "apiVersion": "ray.io/v1", "kind": "RayJob",
        "metadata": {
            "name": name, "namespace": namespace, "labels": {"app.kubernetes.io/name": "dppo"},
            "annotations": {"dppo.io/actors": str(actors), "dppo.io/env": env,
                            "dppo.io/metrics-service": f"{name}-metrics", "dppo.io/metrics-port": "dppo-metrics"},
        },
        "spec": {"entrypoint": "dppo train --config /etc/dppo/config.yaml"},
        "status": {"jobStatus": job, "jobDeploymentStatus": deployment,
                   "rayClusterStatus": {"readyWorkerReplicas": ready, "desiredWorkerReplicas": desired}},
    }


JOBS = [
    rayjob("big-dppo", "ml", "Running", "RUNNING", 2, 2, 8, "LunarLander-v3"),
    rayjob("cartpole-dppo", "ml", "Complete", "SUCCEEDED", 0, 2, 2, "CartPole-v1"),
]


class StandIn(ThreadingHTTPServer):
    rayjobs_status = 200
    requests: list[str]


class Handler(BaseHTTPRequestHandler):
    server: StandIn

    def do_GET(self) -> None:
        self.server.requests.append(unquote(self.path))  # the client sends "svc:port" as "svc%3Aport"
        url = urlparse(unquote(self.path))
        selector = parse_qs(url.query).get("labelSelector", [""])[0]
        if url.path in ("/apis/ray.io/v1/namespaces/ml/rayjobs", "/apis/ray.io/v1/rayjobs"):
            if self.server.rayjobs_status != 200:
                self.reply(self.server.rayjobs_status, {"kind": "Status", "code": self.server.rayjobs_status})
                return
            items = JOBS if selector == "app.kubernetes.io/name=dppo" else []
            self.reply(200, {"apiVersion": "ray.io/v1", "kind": "RayJobList", "items": items})
        elif url.path == "/apis/ray.io/v1/namespaces/other/rayjobs":
            self.reply(200, {"apiVersion": "ray.io/v1", "kind": "RayJobList", "items": []})
        elif url.path == "/api/v1/namespaces/ml/services/big-dppo-metrics:dppo-metrics/proxy/metrics":
            body = METRICS.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.reply(404, {"kind": "Status", "code": 404})

    def reply(self, code: int, payload: dict[str, Any]) -> None:
        body = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def api_server() -> Iterator[StandIn]:
    server = StandIn(("127.0.0.1", 0), Handler)
    server.requests = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def kubeconfig(api_server: StandIn, tmp_path: Path) -> Path:
    host, port = api_server.server_address[:2]
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "standin",
        "clusters": [{"name": "standin", "cluster": {"server": f"http://{host}:{port}"}}],
        "users": [{"name": "me", "user": {"token": "not-a-secret"}}],
        "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "me", "namespace": "ml"}},
                     {"name": "other", "context": {"cluster": "standin", "user": "me", "namespace": "other"}}],
    }))
    return path


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


def test_real_cli_prints_the_table_and_exits_2_on_an_api_error(kubeconfig: Path, api_server: StandIn) -> None:
    """The real CLI: `dppo status` is wired in, and bad input exits 2 with one line."""
    help_out = subprocess.run([sys.executable, "-m", "dppo", "--help"], capture_output=True, text=True, timeout=60,
                              check=False)
    require("status" in help_out.stdout, "dppo.commands.parser does not register the status command yet")
    out = subprocess.run([sys.executable, "-m", "dppo", "status", "--kubeconfig", str(kubeconfig)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert "big-dppo" in out.stdout and "123,456" in out.stdout
    api_server.rayjobs_status = 404
    out = subprocess.run([sys.executable, "-m", "dppo", "status", "--kubeconfig", str(kubeconfig)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and "KubeRay" in out.stderr


def test_no_kubernetes_import_at_startup() -> None:
    code = "import sys, dppo.commands.status; print('kubernetes' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"
