"""The real image: `make image` builds the project's Dockerfile (unchanged) with buildah (once per session,
tests/deploy/image_build.py, with a stand-in for Ray's base image where Docker Hub is unreachable), Docker's
daemon runs it as uid 1000 with a read-only root filesystem; its RUN steps installed the pinned Ray and the CPU
torch, and `dppo --help` and a short CartPole `dppo train` work in it; the final image holds no wheels or build
trees. What the stand-in does not prove: Ray's own image (conda Python, its extra packages and size), the CUDA
variant, and pulls from a registry.

Then the chart's pods as containers of the real image (built by `make image`, tests/deploy/image_build.py): the
rendered head and worker pods run in Docker with each pod's user, security context and env, the command KubeRay
gives them (`ray start ... --block` with the rendered rayStartParams), the ConfigMap mounted where the pod mounts
it and the checkpoint volume where persistence puts it; the entrypoint is submitted from a container of the image
as KubeRay's submitter does (`ray job submit --no-wait`, then `ray job logs --follow`). Mid-run one worker
container is killed whole (its node is lost) and started again as a new container (a rescheduled pod): the run
goes on and finishes.

Local substitutions, as in tests/deploy/test_chart_emulation.py: host networking with 127.0.0.1 as every node's
IP and the dashboard's and metrics server's address (only loopback is touched; the ports KubeRay fixes would
collide on one host, so each container gets free ones), a small object store per node, a host directory for the
PersistentVolumeClaim. Every container started here is removed at the end.

Both tests share the image: the module runs on one worker (tests/conftest.py ONE_WORKER_MODULES).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from image_build import LEFTOVERS, RAY_VERSION, TORCH_VERSION, DockerImage
from test_chart_emulation import container_env, flags, group_resource_flags, http_status, render

from dppo.distributed.ports import free_ports

# pytest-timeout counts a test's fixtures too, and the first test here bears the session's image build: 654 s and
# 880 s of it in two clean-clone CIs of one evening, the second past the suite's 900 s while its container trained.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]


def submit(pods: Pods, submitter: list[str], address: str, args: list[str], tries: int = 3) -> None:
    """`ray job submit` from a container of the image, as KubeRay's submitter Job: a try that finds the dashboard
    not listening is tried again (the Job's backoffLimit, 2 by default) once it answers again. A clean-clone CI on
    a loaded machine had the dashboard refuse the submit after its health check had answered."""
    for attempt in range(1, tries + 1):
        deadline = time.monotonic() + 120
        while not http_status(f"{address}/api/version"):  # any answer (401 without the token): it listens
            assert time.monotonic() < deadline, f"the dashboard stopped listening\n{pods.head_logs()}"
            time.sleep(1)
        done = subprocess.run(["docker", "run", "--rm", *submitter, pods.image.name, "ray", "job", "submit",
                               "--address", address, *args], env=pods.image.env, capture_output=True, text=True,
                              timeout=600)
        if done.returncode == 0:
            return
        refused = "Connection refused" in done.stderr
        assert refused and attempt < tries, f"ray job submit -> {done.returncode} (try {attempt})\n" \
            f"{done.stderr[-3000:]}\n--- head\n{pods.head_logs()}"


def test_image_builds_and_trains(tmp_path: Path, docker_image: DockerImage) -> None:
    image, timings = docker_image.name, dict(docker_image.timings)
    print(f"\nbuild: base {docker_image.base}, {json.dumps({k: round(v, 1) for k, v in timings.items()})}")
    size = int(docker_image.docker("image", "inspect", "--format", "{{.Size}}", image).stdout)
    user = docker_image.docker("image", "inspect", "--format", "{{.Config.User}}", image).stdout.strip()
    assert user == "1000:100"

    # No wheel or build tree that the build added (image_build.LEFTOVERS says what), beside what the base holds.
    added = set(docker_image.docker("run", "--rm", "--network", "host", "--user", "0", "--entrypoint", "bash", image,
                                    "-c", LEFTOVERS).stdout.split())
    assert added - docker_image.base_leftovers == set(), \
        f"the base ({docker_image.base}) itself holds {sorted(docker_image.base_leftovers)}"

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.chown(run_dir, 1000, 100)
    sandbox = ["run", "--rm", "--network", "host", "--user", "1000:100", "--read-only",
               "--tmpfs", "/tmp:rw,exec,size=2g", "--shm-size", "512m", "--cap-drop", "ALL",
               "--security-opt", "no-new-privileges", "-v", f"{run_dir}:/data",
               # As KubeRay does in the chart's pods. Without a token a new local Ray 2.60 cluster
               # turns token auth on and writes ~/.ray/auth_token, which a read-only root refuses.
               "-e", "RAY_AUTH_MODE=token", "-e", f"RAY_AUTH_TOKEN={secrets.token_hex(32)}"]
    help_text = docker_image.docker(*sandbox, image, "dppo", "--help").stdout
    assert "train" in help_text
    # What the RUN steps installed: the pinned Ray and the CPU build of the pinned torch, not a CUDA one.
    versions = docker_image.docker(*sandbox, image, "python", "-c",
                                   "import ray, torch; print(ray.__version__, torch.__version__)").stdout.split()
    assert versions[0] == RAY_VERSION, versions
    assert versions[1].startswith(TORCH_VERSION) and "+cu" not in versions[1], versions
    start = time.monotonic()
    train = docker_image.docker(*sandbox, image, "dppo", "train", "--env", "CartPole-v1", "--actors", "2",
                                "--run-dir", "/data/cartpole", "--set", "run.total_steps=2048")
    timings["train in container"] = time.monotonic() - start
    summary = json.loads((run_dir / "cartpole" / "summary.json").read_text())
    assert summary["env_steps"] >= 2048, train.stdout + train.stderr
    assert "iter=" in (run_dir / "cartpole" / "train.log").read_text()
    report = {"base": docker_image.base, "image_bytes": size, **{k: round(v, 1) for k, v in timings.items()}}
    print(f"\nimage report: {json.dumps(report)}")


TOTAL_STEPS = 40_000  # 2 actors, E = 4, T = 64, every env step 1 ms: about 30 s of training
ROUNDS_DOWN = 3  # rounds trained on one actor while the worker's node is lost, before the pod is rescheduled


def docker_flags(pod: dict[str, Any], container: dict[str, Any], env: dict[str, str]) -> list[str]:
    """A rendered pod's container as `docker run` flags: its user, security context and environment."""
    pod_security, security = pod.get("securityContext", {}), container.get("securityContext", {})
    out = ["--network", "host", "--user", f"{pod_security['runAsUser']}:{pod_security['runAsGroup']}",
           "--shm-size", "512m"]  # KubeRay gives each Ray pod a memory-backed /dev/shm
    if security.get("capabilities", {}).get("drop") == ["ALL"]:
        out += ["--cap-drop", "ALL"]
    if security.get("allowPrivilegeEscalation") is False:
        out += ["--security-opt", "no-new-privileges"]
    if security.get("readOnlyRootFilesystem"):
        out += ["--read-only", "--tmpfs", "/tmp:rw,exec,size=1g"]
    assert pod_security.get("seccompProfile", {}).get("type") == "RuntimeDefault"  # Docker's default profile
    for key, value in (container_env(container) | env).items():
        out += ["-e", f"{key}={value}"]
    return out


class Pods:
    """Containers named after this test's own prefix; all removed by ``remove()``."""

    def __init__(self, docker_image: Any) -> None:
        self.image, self.prefix, self.names = docker_image, f"dppo-emu-{secrets.token_hex(3)}", []

    def run(self, name: str, args: list[str], command: list[str]) -> str:
        full = f"{self.prefix}-{name}"
        self.image.docker("run", "-d", "--name", full, *args, self.image.name, *command)
        self.names.append(full)
        return full

    def logs(self, name: str) -> str:
        out = self.image.docker("logs", name)
        return out.stdout + out.stderr

    def running(self, name: str) -> bool:
        return self.image.docker("inspect", "-f", "{{.State.Running}}", name).stdout.strip() == "true"

    def wait_for_log(self, name: str, text: str, timeout: float = 120) -> None:
        """``text`` in the container's output; its exiting first, or the deadline, fails the test with its log."""
        deadline = time.monotonic() + timeout
        while text not in self.logs(name):
            if not self.running(name):
                assert text in self.logs(name), f"{name}: exited before {text!r}\n{self.logs(name)[-3000:]}"
                return
            assert time.monotonic() < deadline, f"{name}: no {text!r}\n{self.logs(name)[-3000:]}"
            time.sleep(1)

    def head_logs(self) -> str:
        """The head container's output and its dashboard's log (the first container is the head)."""
        dashboard = subprocess.run(["docker", "exec", self.names[0], "bash", "-c",
                                    "tail -c 3000 /tmp/ray/session_latest/logs/dashboard.log"],
                                   env=self.image.env, capture_output=True, text=True, timeout=60)
        return f"{self.logs(self.names[0])[-3000:]}\n--- dashboard.log\n{dashboard.stdout}{dashboard.stderr}"

    def remove(self) -> None:
        if self.names:
            subprocess.run(["docker", "rm", "-f", *self.names], env=self.image.env, capture_output=True,
                           timeout=120, check=False)


def progress(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "progress.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_chart_pods_as_containers_train_and_survive_a_lost_worker(helm_bin: str, docker_image: Any,
                                                                  tmp_path: Path) -> None:
    gcs, dash, client, metrics, *node_ports = free_ports(4 + 4 * 3)
    release = f"emu{secrets.token_hex(3)}"
    objects = render(helm_bin, release, "--set", f"metrics.port={metrics}", "--set", "persistence.enabled=true",
                     "--set", f"totalSteps={TOTAL_STEPS}", "--set", "envsPerActor=4", "--set", "segmentLength=64",
                     "--set", "config.env.latency_ms=1", "--set", "config.ppo.minibatch_size=128")
    spec = next(o for o in objects if o["kind"] == "RayJob")["spec"]
    cluster = spec["rayClusterSpec"]
    head_pod = cluster["headGroupSpec"]["template"]["spec"]
    head = head_pod["containers"][0]
    mounts = {m["name"]: m["mountPath"] for m in head["volumeMounts"]}
    config = yaml.safe_load(next(o for o in objects if o["kind"] == "ConfigMap")["data"]["config.yaml"])
    config["metrics"]["host"] = "127.0.0.1"
    config_dir, data_dir = tmp_path / "config", tmp_path / "data"
    for directory in (config_dir, data_dir):
        directory.mkdir()
    (config_dir / "config.yaml").write_text(yaml.safe_dump(config))
    os.chown(data_dir, head_pod["securityContext"]["runAsUser"], head_pod["securityContext"]["fsGroup"])
    run_dir = data_dir / Path(config["run"]["run_dir"]).relative_to(mounts["checkpoints"])
    token = secrets.token_hex(32)
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}  # what KubeRay injects for authOptions token
    pods = Pods(docker_image)
    try:
        params = dict(cluster["headGroupSpec"]["rayStartParams"])
        assert params.pop("dashboard-host") == "0.0.0.0"
        pods.run("head", [*docker_flags(head_pod, head, auth), "-v", f"{config_dir}:{mounts['config']}:ro",
                          "-v", f"{data_dir}:{mounts['checkpoints']}"],
                 ["ray", "start", "--head", "--block", *flags(params), "--dashboard-host=127.0.0.1",
                  "--include-dashboard=true", f"--port={gcs}", f"--dashboard-port={dash}",
                  f"--ray-client-server-port={client}", f"--metrics-export-port={node_ports[0]}",
                  f"--dashboard-agent-listen-port={node_ports[1]}", f"--dashboard-agent-grpc-port={node_ports[2]}",
                  f"--runtime-env-agent-port={node_ports[3]}", "--object-store-memory=100000000",
                  "--node-ip-address=127.0.0.1", "--disable-usage-stats"])
        # A worker's `ray start` looks the head node up in the GCS 20 times, 2 s apart, and exits if it is not there:
        # the head's node must have registered (its own wait: 120 s, the image's ENV), not only its GCS answer.
        pods.wait_for_log(pods.names[0], "Ray runtime started", timeout=240)
        deadline = time.monotonic() + 60
        while http_status(f"http://127.0.0.1:{dash}/api/gcs_healthz") != 200:
            assert time.monotonic() < deadline, pods.logs(pods.names[0])[-3000:]
            time.sleep(1)
        group = cluster["workerGroupSpecs"][0]
        worker_pod = group["template"]["spec"]
        worker_args = docker_flags(worker_pod, worker_pod["containers"][0], auth)

        def worker_command(i: int) -> list[str]:
            p = node_ports[4 + 4 * i: 8 + 4 * i]
            return ["ray", "start", f"--address=127.0.0.1:{gcs}", "--block", *flags(group["rayStartParams"]),
                    *group_resource_flags(group.get("resources", {})), f"--metrics-export-port={p[0]}",
                    f"--dashboard-agent-listen-port={p[1]}", f"--dashboard-agent-grpc-port={p[2]}",
                    f"--runtime-env-agent-port={p[3]}", "--object-store-memory=100000000",
                    "--node-ip-address=127.0.0.1", "--disable-usage-stats"]

        workers = []
        for i in range(group["replicas"]):  # one at a time, as pods usually come up
            workers.append(pods.run(f"worker-{i}", worker_args, worker_command(i)))
            # Its `ray start` waits itself: 60 s per try for a busy GCS to answer, 120 s to register (the image's ENV)
            pods.wait_for_log(workers[-1], "Ray runtime started", timeout=300)
        submitter_pod = spec["submitterPodTemplate"]["spec"]
        submitter = docker_flags(submitter_pod, submitter_pod["containers"][0], auth)
        address = f"http://127.0.0.1:{dash}"
        submit(pods, submitter, address, ["--submission-id", release, "--no-wait", "--", *spec["entrypoint"].split()])
        follow = pods.run("submitter", submitter, ["ray", "job", "logs", "--address", address, "--follow", release])

        deadline = time.monotonic() + 300
        while len(progress(run_dir)) < 3:  # a few iterations with both workers
            assert time.monotonic() < deadline, pods.logs(follow)[-3000:]
            time.sleep(0.5)
        docker_image.docker("kill", workers[1])  # the node goes away whole: raylet, agents and its actor
        killed_at = len(progress(run_dir))
        while sum(r["segments"] == 1 for r in progress(run_dir)[killed_at:]) < ROUNDS_DOWN:  # training goes on
            assert time.monotonic() < deadline, pods.logs(follow)[-3000:]
            time.sleep(0.5)
        pods.run("worker-1-again", worker_args, worker_command(1))  # the pod, rescheduled

        exit_code = docker_image.docker("wait", follow, timeout=600).stdout.strip()
        learner_log = pods.logs(follow)
        status = docker_image.docker("run", "--rm", *submitter, docker_image.name, "ray", "job", "status",
                                     "--address", address, release).stdout
        assert exit_code == "0" and f"Job {release!r} succeeded" in status, learner_log[-4000:]
        summary = json.loads((run_dir / "summary.json").read_text())
        records = progress(run_dir)
        assert summary["reason"] == "total_steps" and summary["env_steps"] >= TOTAL_STEPS
        assert summary["node_losses"] >= 1 and summary["actor_crashes"] == 0, summary
        assert "lost with its node" in learner_log and " back after " in learner_log, learner_log[-4000:]
        assert [r["iteration"] for r in records] == list(range(1, len(records) + 1))
        assert records[-1]["segments"] == 2  # both actors again after the worker came back
        print(f"\ncontainers: iterations {len(records)}, on one actor {sum(r['segments'] == 1 for r in records)}, "
              f"env steps {summary['env_steps']}, node losses {summary['node_losses']}")
    finally:
        pods.remove()
