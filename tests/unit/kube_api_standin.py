"""A loopback HTTP server that stands in for the Kubernetes API server in the tests of `dppo status` (unit and
integration): it serves only the few paths the command reads (no API server runs on this machine)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

import yaml

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


@contextmanager
def serving() -> Iterator[StandIn]:
    """The stand-in, serving on a free loopback port until the block ends."""
    server = StandIn(("127.0.0.1", 0), Handler)
    server.requests = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def write_kubeconfig(server: StandIn, path: Path) -> Path:
    """A kubeconfig whose current context ("standin", namespace ml) points at ``server``; context "other" at
    namespace other."""
    host, port = server.server_address[:2]
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "standin",
        "clusters": [{"name": "standin", "cluster": {"server": f"http://{host}:{port}"}}],
        "users": [{"name": "me", "user": {"token": "not-a-secret"}}],
        "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "me", "namespace": "ml"}},
                     {"name": "other", "context": {"cluster": "standin", "user": "me", "namespace": "other"}}],
    }))
    return path
