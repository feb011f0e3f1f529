"""Run what the chart's pods would run, as local processes (no cluster here; see DESIGN.md, "How the
chart is verified here").

The chart is rendered, and from the RayJob we take the head's and the worker group's rayStartParams
and container env, the worker replica count, the entrypoint and the ConfigMap's training config. Then,
as KubeRay would: one `ray start --head --block` plus one `ray start --address=<head> --block` per
worker replica, each rayStartParams key turned into `--key=value`; the token-auth variables KubeRay
injects (RAY_AUTH_MODE, RAY_AUTH_TOKEN) with a token made here; and the submitter's commands,
`ray job submit --no-wait ... -- <entrypoint>` followed by `ray job logs --follow`.

One cluster serves the module (the fixture `emulated`): the pods of one render, started as KubeRay starts them
(a head, four one-CPU actor pods, two learner pods). What the tests' values change in the cluster is only how
many pods and CPUs it has (each test checks its own render), so each test renders its own values and submits its
own rendered entrypoint, ConfigMap and runtime env to it. A test that loses a head starts a cluster of its own.

Persistence and one retry are on, as for a long run: the first attempt's driver is killed after its
first checkpoint (as when the head pod dies) and the entrypoint is submitted again, as KubeRay does on a retry (the
same PersistentVolumeClaim), so it must resume and finish.

Local substitutions, each a stand-in for something the pod has and this machine does not:
- 127.0.0.1 as every node's IP and instead of 0.0.0.0 for the dashboard and the metrics server (only
  loopback is touched);
- free ports for the GCS, dashboard, client server, agents and Ray's metrics (KubeRay's 6379, 8265,
  10001, 52365, 8080 may be taken by another Ray on this machine); the metrics port is a chart value;
- a small object store per node (a pod gets 30% of its memory limit; three nodes share this box);
- the ConfigMap content written to a temp file, and the entrypoint's /etc/dppo path pointed at it;
- persistence.mountPath set to a temp dir (the PVC); a retry reuses the module's cluster;
- each worker node's runtime_env directory bind-mounted from a private dir in its own mount namespace
  (pods do not share a filesystem; `unshare`, as root).
Every process started here is in its own process group and is killed by group at the end: no global
`ray stop`, which would hit other Ray clusters on the machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from runs import progress_records

from dppo.distributed.cluster import RAY_PROCESS_ENV
from dppo.distributed.ports import free_ports

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "dppo"
BIN = Path(sys.executable).parent
TOTAL_STEPS = 16384  # 16 iterations of 2 actors x 8 envs x 64 steps (CartPole preset), about 10 s
LINGER_S = 10

pytestmark = pytest.mark.slow  # its module's tests run on one worker (tests/conftest.py ONE_WORKER_MODULES)


def flags(params: dict[str, str]) -> list[str]:
    """KubeRay's translation of rayStartParams: every key becomes --key=value."""
    return [f"--{key}={value}" for key, value in params.items()]


def group_resource_flags(resources: dict[str, str]) -> list[str]:
    """KubeRay's translation of a group's `resources` map (the keys the chart sets): CPU and GPU become
    --num-cpus and --num-gpus, the rest one --resources JSON object."""
    named = {"CPU": "--num-cpus", "GPU": "--num-gpus"}
    custom = {k: float(v) for k, v in resources.items() if k not in named}
    return ([f"{flag}={resources[key]}" for key, flag in named.items() if key in resources]
            + ([f"--resources={json.dumps(custom)}"] if custom else []))


def container_env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


class LocalCluster:
    """The head and worker pods as process groups on this machine."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, args: list[str], env: dict[str, str], log_name: str) -> None:
        log = open(self.root / log_name, "wb")  # noqa: SIM115 (closed with the process group's life)
        self.procs.append(subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True))

    def stop(self) -> None:
        """Every pod killed at once (how Ray stops is not the subject here), then what left their groups."""
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in self.procs:
            proc.wait(timeout=60)
        # Ray processes that left the groups (workers, agents) still name our temp dir on their command line.
        marker = str(self.root).encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if marker in (entry / "cmdline").read_bytes():
                    os.kill(int(entry.name), signal.SIGKILL)
            except (OSError, ProcessLookupError):
                continue

    def wait_for_log(self, name: str, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while text not in (self.root / name).read_text(errors="replace"):
            assert time.monotonic() < deadline, f"{name}: no {text!r}\n" + self.logs()
            assert self.procs[-1].poll() is None, f"{name} exited\n" + self.logs()
            time.sleep(0.5)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted(self.root.glob("*.log")))


@pytest.fixture
def cluster_root(tmp_path: Path) -> Path:
    """A test's own files: the ConfigMap's content, the claim, the run directory."""
    return tmp_path


def render(helm_bin: str, release: str, *args: str) -> list[dict[str, Any]]:
    out = subprocess.run([helm_bin, "template", release, str(CHART), *args],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def scrape(port: int) -> dict[str, float] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


def http_status(url: str, headers: dict[str, str] | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return 0  # not listening (yet)


def start_rendered_cluster(local: LocalCluster, cluster: dict[str, Any], cluster_root: Path, gcs: int, dash: int,
                           client: int, node_ports: list[int]) -> tuple[str, dict[str, str], str]:
    """The rendered head and worker pods as local processes; returns (dashboard address, env, token)."""
    head = cluster["headGroupSpec"]
    head_container = head["template"]["spec"]["containers"][0]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    token = secrets.token_hex(32)
    # What KubeRay injects into every Ray container and the submitter for authOptions.mode token.
    assert cluster["authOptions"] == {"mode": "token"}
    env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    env |= RAY_PROCESS_ENV  # what the image's ENV gives every process of a pod (Dockerfile)
    ray = str(BIN / "ray")
    head_params = dict(head["rayStartParams"])
    assert head_params.pop("dashboard-host") == "0.0.0.0"
    local.start([ray, "start", "--head", "--block", *flags(head_params),
                 "--dashboard-host=127.0.0.1", "--include-dashboard=true", f"--port={gcs}",
                 f"--dashboard-port={dash}", f"--ray-client-server-port={client}",
                 f"--metrics-export-port={node_ports[0]}", f"--dashboard-agent-listen-port={node_ports[1]}",
                 f"--dashboard-agent-grpc-port={node_ports[2]}", f"--runtime-env-agent-port={node_ports[3]}",
                 "--object-store-memory=100000000", "--node-ip-address=127.0.0.1", f"--temp-dir={cluster_root}",
                 "--disable-usage-stats"],
                env | container_env(head_container), "head.log")
    wait_until_started(local, "head.log")
    address = f"http://127.0.0.1:{dash}"
    deadline = time.monotonic() + 90
    while http_status(f"{address}/api/gcs_healthz") != 200:
        assert time.monotonic() < deadline, "head never became healthy\n" + local.logs()
        time.sleep(0.5)
    # Each pod has its own filesystem; here the nodes share one. Ray keeps runtime_env files (a working_dir
    # unpacked on every node) under the session directory, so each worker node gets a private one in its
    # own mount namespace: otherwise a worker's unpacking would replace the directory the driver runs in.
    i = 0
    for group in cluster["workerGroupSpecs"]:
        for _ in range(group["replicas"]):
            start_worker(local, group, cluster_root, gcs, node_ports[4 + 4 * i: 8 + 4 * i], env, f"worker-{i}")
            i += 1
    return address, env, token


def start_worker(local: LocalCluster, group: dict[str, Any], cluster_root: Path, gcs: int, ports: list[int],
                 env: dict[str, str], name: str) -> subprocess.Popen[bytes]:
    """One pod of a rendered worker group, as KubeRay starts it, once Ray says it runs (its process: PID 1 of the
    pod)."""
    resources = (cluster_root / "session_latest").resolve() / "runtime_resources"
    resources.mkdir(parents=True, exist_ok=True)
    private = cluster_root / f"{name}-runtime-resources"
    private.mkdir()
    own_files = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                 'mount --bind "$1" "$2" && shift 2 && exec "$@"', "sh", str(private), str(resources)]
    local.start([*own_files, str(BIN / "ray"), "start", f"--address=127.0.0.1:{gcs}", "--block",
                 *flags(group["rayStartParams"]), *group_resource_flags(group.get("resources", {})),
                 f"--metrics-export-port={ports[0]}", f"--dashboard-agent-listen-port={ports[1]}",
                 f"--dashboard-agent-grpc-port={ports[2]}", f"--runtime-env-agent-port={ports[3]}",
                 "--object-store-memory=100000000", "--node-ip-address=127.0.0.1", "--disable-usage-stats"],
                env | container_env(group["template"]["spec"]["containers"][0]), f"{name}.log")
    # One at a time, as pods would usually come up.
    wait_until_started(local, f"{name}.log")
    return local.procs[-1]


def wait_until_started(local: LocalCluster, log: str, timeout: float = 240) -> None:
    """The node started last says Ray runs; its `ray start` exiting first, or the head's, fails the test (Ray's own
    wait for the node to register, RAY_PROCESS_ENV's 120 s, ends first)."""
    deadline = time.monotonic() + timeout
    while "Ray runtime started" not in (local.root / log).read_text(errors="replace"):
        assert time.monotonic() < deadline, f"{log}: Ray never started\n" + local.logs()
        assert local.procs[-1].poll() is None and local.procs[0].poll() is None, f"{log}: exited\n" + local.logs()
        time.sleep(0.5)


@dataclass
class Emulated:
    """The module's cluster: its processes, the job API's address, the environment that reaches it (KubeRay's
    token variables) and the token."""

    local: LocalCluster
    address: str
    env: dict[str, str]
    token: str


@pytest.fixture(scope="module")
def emulated(helm_bin: str) -> Iterator[Emulated]:
    """The pods of one render (four actor pods of one CPU: as many as the sweep's two pods of two; two learner
    pods), started as KubeRay starts them, for every job of the module."""
    objects = render(helm_bin, "emu", "--set", "actors=4", "--set", "actorsPerPod=1", "--set", "learners.replicas=2",
                     "--set", "learners.cpus=1")
    cluster = next(o for o in objects if o["kind"] == "RayJob")["spec"]["rayClusterSpec"]
    assert [g["replicas"] for g in cluster["workerGroupSpecs"]] == [4, 2]
    root = Path(tempfile.mkdtemp(prefix="dppo-emu-", dir="/tmp"))  # short: Ray's Unix sockets (108 bytes)
    local = LocalCluster(root)
    try:
        gcs, dash, client, *node_ports = free_ports(3 + 4 * 7)
        address, env, token = start_rendered_cluster(local, cluster, root, gcs, dash, client, node_ports)
        yield Emulated(local, address, env, token)
    finally:
        local.stop()
        shutil.rmtree(root, ignore_errors=True)


def local_job(objects: list[dict[str, Any]], cluster_root: Path) -> tuple[dict[str, Any], dict[str, Any], Path, str]:
    """The rendered RayJob's spec; the ConfigMap's config (metrics on 127.0.0.1, run dir under cluster_root)
    written where the local head reads it; that run dir; the entrypoint pointed at the written config."""
    spec = next(o for o in objects if o["kind"] == "RayJob")["spec"]
    config = yaml.safe_load(next(o for o in objects if o["kind"] == "ConfigMap")["data"]["config.yaml"])
    config["metrics"]["host"] = "127.0.0.1"
    run_dir = cluster_root / "run"
    config["run"]["run_dir"] = str(run_dir)
    config_file = cluster_root / "config.yaml"
    config_file.write_text(yaml.safe_dump(config))
    head_container = spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    config_mount = next(m for m in head_container["volumeMounts"] if m["name"] == "config")["mountPath"]
    return spec, config, run_dir, spec["entrypoint"].replace(f"{config_mount}/config.yaml", str(config_file))


def run_job(emulated: Emulated, job_id: str, entrypoint: str, *options: str) -> subprocess.CompletedProcess[str]:
    """The entrypoint submitted as KubeRay's submitter does and waited for (it must succeed); what it printed."""
    done = subprocess.run(["bash", "-c", f"{BIN / 'ray'} job submit --address {emulated.address} --submission-id "
                           f"{job_id} {' '.join(options)} -- {entrypoint}"], env=emulated.env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr + emulated.local.logs()
    return done


def ray_list(address: str, env: dict[str, str], what: str) -> list[dict[str, Any]]:
    out = subprocess.run([str(BIN / "ray"), "list", what, "--address", address, "--format", "json", "--detail",
                          "--limit", "1000"], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def job_actors(emulated: Emulated, job_id: str) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """The actors of one submitted job (a placed one has a node; the job supervisor left out) and the nodes."""
    (job,) = [j for j in ray_list(emulated.address, emulated.env, "jobs") if j.get("submission_id") == job_id]
    actors = [a for a in ray_list(emulated.address, emulated.env, "actors")
              if a["job_id"] == job["job_id"] and a["class_name"] != "JobSupervisor"]
    return actors, {n["node_id"]: n for n in ray_list(emulated.address, emulated.env, "nodes")}


def assert_actors_on_workers_only(emulated: Emulated, job_id: str, min_actors: int) -> None:
    """The head offers no CPUs: every actor of the job ran on a worker pod."""
    actors, nodes = job_actors(emulated, job_id)
    assert len(actors) >= min_actors, actors
    for actor in actors:
        assert actor["node_id"] and not nodes[actor["node_id"]]["is_head_node"], f"{actor['class_name']} on the head"


@pytest.mark.timeout(300)
def test_rendered_chart_trains_and_its_retry_resumes_from_the_checkpoint(helm_bin: str, cluster_root: Path,
                                                                           emulated: Emulated) -> None:
    """Chart defaults (token auth on) plus persistence and a retry; a tiny run and free local ports."""
    metrics = free_ports(1)[0]
    release = f"emu{secrets.token_hex(3)}"
    pvc = cluster_root / "pvc"
    pvc.mkdir()
    objects = render(helm_bin, release, "--set", f"metrics.port={metrics}",
                     "--set", f"metrics.lingerSeconds={LINGER_S}", "--set", f"totalSteps={TOTAL_STEPS}",
                     "--set", "actors=2", "--set", "actorsPerPod=1", "--set", "envsPerActor=8",
                     "--set", "segmentLength=64", "--set", "config.ppo.minibatch_size=256",
                     "--set", "persistence.enabled=true",
                     "--set", f"persistence.mountPath={pvc}", "--set", "job.backoffLimit=1",
                     "--set", "config.run.checkpoint_every=1",
                     # a round of at least 256 ms on any machine: the 15 after the first checkpoint outlast the test's
                     # reading of it (0.5 s apart) and its kill, where a fast machine would do them in about a second
                     # (in e-notation: `--set` passes 0.5 as a string, which the schema refuses)
                     "--set", "config.env.latency_ms=5e-1")
    rayjob = next(o for o in objects if o["kind"] == "RayJob")
    config_text = next(o for o in objects if o["kind"] == "ConfigMap")["data"]["config.yaml"]
    spec = rayjob["spec"]
    cluster = spec["rayClusterSpec"]
    head = cluster["headGroupSpec"]
    assert [g["replicas"] for g in cluster["workerGroupSpecs"]] == [2]
    head_container = head["template"]["spec"]["containers"][0]
    config_mount = next(m for m in head_container["volumeMounts"] if m["name"] == "config")["mountPath"]
    declared_metrics = next(p for p in head_container["ports"] if p["name"] == "dppo-metrics")["containerPort"]
    assert declared_metrics == metrics

    # The ConfigMap, where the head pod would have it mounted.
    config = yaml.safe_load(config_text)
    config["metrics"]["host"] = "127.0.0.1"
    run_dir = Path(config["run"]["run_dir"])
    assert run_dir.parent == pvc
    assert any(m["mountPath"] == str(pvc) for m in head_container["volumeMounts"])
    assert spec["entrypoint"].endswith(" --auto-resume") and spec["backoffLimit"] == 1
    config_file = cluster_root / "config.yaml"
    config_file.write_text(yaml.safe_dump(config))
    entrypoint = spec["entrypoint"].replace(f"{config_mount}/config.yaml", str(config_file))
    assert entrypoint != spec["entrypoint"]

    ray = str(BIN / "ray")
    address, env, token, local = emulated.address, emulated.env, emulated.token, emulated.local
    followers: list[subprocess.Popen[str]] = []
    try:
        # The job API refuses a request without the token (or with a wrong one), and takes the right one.
        assert http_status(f"{address}/api/jobs/") == 401
        assert http_status(f"{address}/api/jobs/", {"Authorization": "Bearer wrong"}) == 403
        assert http_status(f"{address}/api/jobs/", {"Authorization": f"Bearer {token}"}) == 200

        # The submitter pod's commands (KubeRay K8sJobMode): KubeRay joins them with spaces and runs them
        # with `bash -c`, so the entrypoint is split by the shell.
        def submit(job_id: str) -> subprocess.Popen[str]:
            out = subprocess.run(["bash", "-c", f"{ray} job submit --address {address} --no-wait --submission-id "
                                  f"{job_id} -- {entrypoint}"],
                                 env=env, capture_output=True, text=True, timeout=120, check=False)
            assert out.returncode == 0, out.stdout + out.stderr
            follow = subprocess.Popen([ray, "job", "logs", "--address", address, "--follow", job_id], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True)
            followers.append(follow)
            return follow

        def wait_for_metrics(follow: subprocess.Popen[str], name: str, at_least: float) -> dict[str, float]:
            """Poll the declared metrics port on the head until `name` reaches `at_least`."""
            deadline = time.monotonic() + 180
            while True:
                if follow.poll() is not None:
                    pytest.fail(f"job ended before {name} reached {at_least}\n" + follow.communicate()[0]
                                + local.logs())
                assert time.monotonic() < deadline, f"{name} never reached {at_least}\n" + local.logs()
                sample = scrape(metrics)
                if sample and sample.get(name, 0) >= at_least:
                    return sample
                time.sleep(0.5)

        def job_status(job_id: str) -> str:
            request = urllib.request.Request(f"{address}/api/jobs/{job_id}",
                                             headers={"Authorization": f"Bearer {token}"})
            with urllib.request.urlopen(request, timeout=10) as resp:
                return json.load(resp)["status"]

        # Attempt 1: the driver (the entrypoint's processes, ours alone) is killed after its first checkpoint.
        first = submit(f"{release}-attempt-1")
        wait_for_metrics(first, "dppo_checkpoints_written_total", 1)
        driver = [int(e.name) for e in Path("/proc").iterdir()
                  if e.name.isdigit() and str(config_file).encode() in _cmdline(e)]
        assert driver, "driver process not found"
        for pid in driver:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        first.communicate(timeout=60)
        assert job_status(f"{release}-attempt-1") == "FAILED"
        assert not (run_dir / "summary.json").exists()

        # The retry: same entrypoint, same volume. The declared metrics port answers on the head during
        # training and while the driver lingers.
        second = submit(f"{release}-attempt-2")
        final = wait_for_metrics(second, "dppo_env_steps_total", TOTAL_STEPS)
        output, _ = second.communicate(timeout=LINGER_S + 60)
        assert job_status(f"{release}-attempt-2") == "SUCCEEDED", output
        # The driver's iteration lines reach the submitter's log, numbered on from the checkpoint.
        assert f"iter={TOTAL_STEPS // 1024}" in output, output
        assert "iter=1 " not in output, f"the retry started over instead of resuming\n{output}"
        assert final["dppo_actors_alive"] == 2
        assert final["dppo_run_info"] == 1
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["env_steps"] >= TOTAL_STEPS
        # KubeRay deletes a failed attempt's pods and submitter at once: the volume keeps both attempts' log.
        train_log = (run_dir / "train.log").read_text()
        assert "iter=1 " in train_log and f"iter={TOTAL_STEPS // 1024}" in train_log, train_log

        assert_actors_on_workers_only(emulated, f"{release}-attempt-2", 2)
    finally:
        for follow in followers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(follow.pid, signal.SIGKILL)


@contextlib.contextmanager
def serve_directory(directory: Path) -> Iterator[int]:
    """A static HTTP server on 127.0.0.1 (a stand-in for the bucket a runtime_env URI points at)."""
    from functools import partial
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
    from threading import Thread

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(directory)))
    thread = Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.timeout(420)
def test_chart_trains_the_example_env_shipped_by_runtime_env(helm_bin: str, cluster_root: Path,
                                                             emulated: Emulated) -> None:
    """examples/custom-env through the chart's runtimeEnv: a zip served on 127.0.0.1 becomes the job's
    working_dir on the head and the workers; the driver and both actors import the package from it."""
    import importlib.util

    assert importlib.util.find_spec("dppo_example_env") is None, "the example must not be installed here"
    example = REPO / "examples" / "custom-env"
    served = cluster_root / "bucket"
    served.mkdir()
    shutil.make_archive(str(served / "custom-env"), "zip", root_dir=example.parent, base_dir=example.name)
    metrics = free_ports(1)[0]
    with serve_directory(served) as http_port:
        url = f"http://127.0.0.1:{http_port}/custom-env.zip"
        objects = render(helm_bin, f"emu{secrets.token_hex(3)}", "-f", str(example / "values.yaml"),
                         "--set", f"runtimeEnv.working_dir={url}", "--set", f"metrics.port={metrics}",
                         "--set", "metrics.lingerSeconds=0")
        spec, config, run_dir, entrypoint = local_job(objects, cluster_root)
        runtime_env = yaml.safe_load(spec["runtimeEnvYAML"])
        assert runtime_env == {"working_dir": url}
        assert config["env"]["id"] == "dppo_example_env:DppoExample/Corridor-v0"
        # KubeRay's submitter passes runtimeEnvYAML to `ray job submit` as --runtime-env-json.
        done = run_job(emulated, "corridor", entrypoint, f"--runtime-env-json '{json.dumps(runtime_env)}'")
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["env"] == "dppo_example_env:DppoExample/Corridor-v0"
        assert summary["solved"] and summary["episode_return_mean"] >= 0.9, (summary, done.stdout[-2000:])
        assert spec["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] == 2
        assert_actors_on_workers_only(emulated, "corridor", 2)


@pytest.mark.timeout(420)
def test_chart_runs_two_learner_pods(helm_bin: str, cluster_root: Path, emulated: Emulated) -> None:
    """learners.replicas=2: the rendered learner group as two more nodes; the run's two learners (one
    torch.distributed gloo group) run there and only there, the actors only on the actor nodes."""
    metrics = free_ports(1)[0]
    objects = render(helm_bin, f"emu{secrets.token_hex(3)}", "--set", f"metrics.port={metrics}",
                     "--set", "metrics.lingerSeconds=0", "--set", "totalSteps=2048", "--set", "actors=2",
                     "--set", "envsPerActor=4", "--set", "segmentLength=64", "--set", "learners.replicas=2",
                     "--set", "learners.cpus=1", "--set", "config.ppo.minibatch_size=128")
    spec, config, run_dir, entrypoint = local_job(objects, cluster_root)
    actor_group, learner_group = spec["rayClusterSpec"]["workerGroupSpecs"]
    assert config["run"]["learners"] == 2 and learner_group["replicas"] == 2
    assert learner_group["resources"] == {"CPU": "0", "dppo_learner": "1"}
    run_job(emulated, "learners", entrypoint)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] >= 2048 and summary["learner_restarts"] == 0
    actors, nodes = job_actors(emulated, "learners")
    learner_nodes = {i for i, n in nodes.items() if "dppo_learner" in n["resources_total"]}
    assert len(learner_nodes) == 2 and all(nodes[i]["resources_total"].get("CPU", 0) == 0 for i in learner_nodes)
    learners = [a for a in actors if a["class_name"] == "Learner"]
    # placed ones: an actor still pending when the job ended (a replacement the cluster had no room for yet)
    # has no node, and ran nowhere
    samplers = [a for a in actors if a["class_name"] != "Learner" and a["node_id"]]
    assert len(learners) == 2 and {a["node_id"] for a in learners} == learner_nodes, learners
    assert len(samplers) >= actor_group["replicas"], actors
    assert all(a["node_id"] not in learner_nodes and not nodes[a["node_id"]]["is_head_node"] for a in samplers), actors


@pytest.mark.timeout(420)
def test_chart_trains_a_policy_map(helm_bin: str, cluster_root: Path, emulated: Emulated) -> None:
    """The policies values example (simple_adversary, a policy per role) through the rendered RayJob: the run
    trains both policies with its actors in the worker pods (the render's one pod of two CPUs: the pods are not
    the subject) and reports each in its iteration lines and progress.jsonl."""
    metrics = free_ports(1)[0]
    objects = render(helm_bin, f"emu{secrets.token_hex(3)}", "-f", str(REPO / "tests/deploy/values/policies.yaml"),
                     "--set", f"metrics.port={metrics}", "--set", "metrics.lingerSeconds=0", "--set",
                     "totalSteps=4800", "--set", "actors=2", "--set", "actorsPerPod=2", "--set", "envsPerActor=2",
                     "--set", "segmentLength=50", "--set", "config.ppo.minibatch_size=100", "--set",
                     "config.run.tensorboard=false")
    spec, config, run_dir, entrypoint = local_job(objects, cluster_root)
    assert config["policies"] == {"adversary": ["adversary_*"], "agent": ["agent_*"]}
    assert spec["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] == 1
    done = run_job(emulated, "policies", entrypoint)
    assert "| adversary return=" in done.stdout and "| agent return=" in done.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] == 4800 and summary["env"] == "mpe2.simple_adversary_v3"
    last = progress_records(run_dir)[-1]
    assert {"adversary/episode_return_mean", "agent/episode_return_mean"} <= set(last)
    assert_actors_on_workers_only(emulated, "policies", 2)


@pytest.mark.timeout(420)
def test_chart_runs_a_sweep_through_the_rendered_rayjob(helm_bin: str, cluster_root: Path,
                                                        emulated: Emulated) -> None:
    """sweep.enabled: the rendered entrypoint `dppo sweep` on the ConfigMap's sweep.yaml, in the rendered cluster
    (the worker group sized for two concurrent trials): both trials train in the worker pods, the results land on
    the claim, and the head's declared metrics port serves every trial's metrics with its trial label."""
    metrics = free_ports(1)[0]
    pvc = cluster_root / "pvc"
    pvc.mkdir()
    values = cluster_root / "sweep-values.yaml"
    values.write_text(yaml.safe_dump({
        "metrics": {"port": metrics, "lingerSeconds": 5}, "totalSteps": 4096, "actors": 1, "actorsPerPod": 2,
        "envsPerActor": 4, "segmentLength": 64, "config": {"ppo": {"minibatch_size": 128},
                                                            "run": {"tensorboard": False}},
        "persistence": {"enabled": True, "mountPath": str(pvc), "accessModes": ["ReadWriteMany"]},
        "sweep": {"enabled": True, "space": {"ppo.learning_rate": "choice([0.0003, 0.001])"}, "trials": 2,
                  "concurrent": 2}}))
    objects = render(helm_bin, f"emu{secrets.token_hex(3)}", "-f", str(values))
    spec = next(o for o in objects if o["kind"] == "RayJob")["spec"]
    (workers,) = spec["rayClusterSpec"]["workerGroupSpecs"]
    assert workers["replicas"] == 2  # ceil(2 trials x (1 actor + 1 learner) / 2 per pod)
    # The ConfigMap where the head pod has it mounted; the sweep's metrics on 127.0.0.1 instead of 0.0.0.0.
    mounted = cluster_root / "etc"
    mounted.mkdir()
    data = next(o for o in objects if o["kind"] == "ConfigMap")["data"]
    sweep_file = yaml.safe_load(data["sweep.yaml"])
    sweep_file["metrics"]["host"] = "127.0.0.1"
    (mounted / "sweep.yaml").write_text(yaml.safe_dump(sweep_file))
    (mounted / "config.yaml").write_text(data["config.yaml"])
    entrypoint = spec["entrypoint"].replace("/etc/dppo/sweep.yaml", str(mounted / "sweep.yaml"))
    out_dir = Path(entrypoint.split("--out-dir ")[1].split()[0])
    assert out_dir.parent == pvc and entrypoint.endswith("--auto-resume")
    address, env = emulated.address, emulated.env
    follow = None
    try:
        submitted = subprocess.run(["bash", "-c", f"{BIN / 'ray'} job submit --address {address} --no-wait "
                                    f"--submission-id sweep -- {entrypoint}"],
                                   env=env, capture_output=True, text=True, timeout=120, check=False)
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        follow = subprocess.Popen([str(BIN / "ray"), "job", "logs", "--address", address, "--follow", "sweep"],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  start_new_session=True)
        labelled: set[str] = set()
        deadline = time.monotonic() + 300
        while follow.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=2) as resp:
                    text = resp.read().decode()
                labelled |= {s.labels["trial"] for family in text_string_to_metric_families(text)
                             for s in family.samples if s.name == "dppo_iteration"}
            time.sleep(0.5)
        output, _ = follow.communicate(timeout=60)
        rows = list(__import__("csv").DictReader((out_dir / "trials.csv").open()))
        assert [r["state"] for r in rows] == ["TERMINATED", "TERMINATED"], output + emulated.local.logs()
        trials = {r["trial"] for r in rows}
        assert labelled == trials, (labelled, trials)
        for trial in trials:
            assert json.loads((out_dir / "trials" / trial / "summary.json").read_text())["env_steps"] >= 4096
        assert (out_dir / "best-config.yaml").is_file() and "started" in output
        actors, nodes = job_actors(emulated, "sweep")
        trained = [a for a in actors if a["class_name"] in ("ImplicitFunc", "Actor")]
        assert {a["class_name"] for a in trained} == {"ImplicitFunc", "Actor"}, trained
        assert all(not nodes[a["node_id"]]["is_head_node"] for a in trained), "a trial ran on the head"
    finally:
        if follow is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(follow.pid, signal.SIGKILL)


def progress(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "progress.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")] if path.exists() else []


def submitter(address: str, job_id: str, entrypoint: str, env: dict[str, str],
              local: LocalCluster) -> subprocess.Popen[str]:
    """The submitter pod of K8sJobMode: KubeRay v1.7.0's command (common/job.go, BuildJobSubmitCommand) after its wait
    for the head, run with `bash -c`: submit unless the job exists, then follow its logs."""
    ray = BIN / "ray"
    command = (f"if ! {ray} job status --address {address} {job_id} >/dev/null 2>&1 ; then {ray} job submit "
               f"--address {address} --no-wait --submission-id {job_id} -- {entrypoint} ; fi ; "
               f"{ray} job logs --address {address} --follow {job_id}")
    proc = subprocess.Popen(["bash", "-c", command], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    local.procs.append(proc)  # type: ignore[arg-type]
    return proc


def wait_for(metrics_port: int, name: str, at_least: float, proc: subprocess.Popen[str], local: LocalCluster,
             timeout: float = 240) -> dict[str, float]:
    """Poll the driver's metrics until ``name`` reaches ``at_least`` (the submitter must still be following)."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            pytest.fail(f"the submitter ended before {name} reached {at_least}\n{proc.communicate()[0]}{local.logs()}")
        assert time.monotonic() < deadline, f"{name} never reached {at_least}\n" + local.logs()
        sample = scrape(metrics_port)
        if sample and sample.get(name, 0) >= at_least:
            return sample
        time.sleep(0.5)


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it: what runs in its container."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo += children.get(found[-1], [])
    return found


class MetricsProxy:
    """The API server's service proxy as `dppo status` calls it, reaching the driver's metrics port here."""

    def __init__(self, port: int) -> None:
        self.port = port

    def connect_get_namespaced_service_proxy_with_path(self, _service: str, _namespace: str, path: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/{path}", timeout=5) as resp:
            return resp.read().decode()


@pytest.mark.timeout(420)
def test_a_lost_head_fails_the_run_at_once_and_the_retry_resumes(helm_bin: str, cluster_root: Path,
                                                                 emulated: Emulated) -> None:
    """The head container dies mid-run (every process of the head pod killed, as when it runs out of memory or its
    node goes). As rendered: the head pod does not restart (restartPolicy Never, and KubeRay told not to re-create
    it), and the submitter pod, KubeRay's own command, exits non-zero within seconds: with the rendered
    submitterConfig.backoffLimit 0 its Job fails, and KubeRay marks the RayJob Failed (SubmissionFailed) instead of
    leaving it Running. job.backoffLimit's retry (a new cluster: the module's, the same claim) resumes from the newest
    checkpoint, and `dppo status` says which attempt it is and the iteration it resumed from."""
    from dppo.commands import status

    metrics = free_ports(1)[0]
    pvc = cluster_root / "pvc"
    pvc.mkdir()
    objects = render(helm_bin, f"emu{secrets.token_hex(3)}", "--set", f"metrics.port={metrics}",
                     "--set", "metrics.lingerSeconds=5", "--set", "totalSteps=12288", "--set", "actors=1",
                     "--set", "envsPerActor=8", "--set", "segmentLength=64", "--set", "config.ppo.minibatch_size=256",
                     "--set", "config.run.checkpoint_every=1", "--set", "persistence.enabled=true",
                     "--set", f"persistence.mountPath={pvc}", "--set", "job.backoffLimit=1",
                     "--set", "config.env.latency_ms=5e-1")  # 256 ms a round at least: the run outlasts the head's kill
    spec, _config, run_dir, entrypoint = local_job(objects, cluster_root)
    rayjob = next(o for o in objects if o["kind"] == "RayJob")
    head_pod = spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert head_pod["restartPolicy"] == "Never" and spec["submitterConfig"]["backoffLimit"] == 0
    assert rayjob["metadata"]["annotations"]["ray.io/disable-provisioned-head-restart"] == "true"
    assert spec["backoffLimit"] == 1 and entrypoint.endswith("--auto-resume")

    first_root = Path(tempfile.mkdtemp(prefix="dppo-emu-", dir="/tmp"))  # short: Ray's Unix sockets (108 bytes)
    first = LocalCluster(first_root)
    try:
        gcs, dash, client, *node_ports = free_ports(3 + 4 * 2)
        address, env, _token = start_rendered_cluster(first, spec["rayClusterSpec"], first_root, gcs, dash, client,
                                                      node_ports)
        follow = submitter(address, "attempt-1", entrypoint, env, first)
        wait_for(metrics, "dppo_checkpoints_written_total", 2, follow, first)
        for pid in descendants(first.procs[0].pid):  # the head pod, whole
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        output, _ = follow.communicate(timeout=120)  # it ends by itself: it does not wait for a head to come back
        assert follow.returncode != 0, f"the submitter did not fail when its head was lost\n{output}"
        assert not (run_dir / "summary.json").exists()
    finally:
        first.stop()
        shutil.rmtree(first_root, ignore_errors=True)
    checkpoints = sorted((run_dir / "checkpoints").glob("*.pt"))
    assert checkpoints, "no checkpoint on the claim"

    # KubeRay's retry: the failed attempt's cluster deleted, a new one created from the same spec, the same claim.
    follow = submitter(emulated.address, "attempt-2", entrypoint, emulated.env, emulated.local)
    live = wait_for(metrics, "dppo_iteration_seconds_count", 1, follow, emulated.local)
    # What KubeRay's status says of the retried RayJob (status.failed: the attempts that failed), and the driver.
    shown = status.status_of({**rayjob, "status": {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING",
                                                   "failed": 1, "succeeded": 0}}, MetricsProxy(metrics))
    assert (shown.attempt, shown.attempts) == (2, 2)
    resumed = int(live["dppo_iteration"] - live["dppo_iteration_seconds_count"])
    assert resumed >= 2 and abs((shown.resumed_from_iteration or 0) - resumed) <= 1, (shown, live)
    assert "ATTEMPT" in status.table([shown], show_namespace=False)
    output, _ = follow.communicate(timeout=240)
    assert follow.returncode == 0, output + emulated.local.logs()
    assert "iter=1 " not in output and "resuming" in output, output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] >= 12288


@pytest.mark.timeout(420)
def test_a_spot_reclaim_costs_the_actors_of_one_pod_and_the_run_goes_on(helm_bin: str, cluster_root: Path,
                                                                        emulated: Emulated) -> None:
    """tests/deploy/values/spot.yaml with two actor pods (one actor each): one pod's spot node is reclaimed mid-run,
    so the pod gets SIGTERM and, after the rendered grace period, SIGKILL. The driver counts its actor as lost to a
    node (no crash, no crash-loop budget spent) and trains on with the other pod's actor (faults.min_actors 1), round
    after round; its replacement waits for a pod with room (KubeRay's replacement pod, which a busy spot pool may not
    give). The run has no end of its own: once it has trained on without the node, its driver is stopped (SIGTERM),
    so however fast the machine, the loss is seen before the run ends. The module's last test: the pod stays lost."""
    metrics = free_ports(1)[0]
    objects = render(helm_bin, f"emu{secrets.token_hex(3)}", "-f", str(REPO / "tests/deploy/values/spot.yaml"),
                     "--set", f"metrics.port={metrics}", "--set", "metrics.lingerSeconds=0", "--set", "head.gpus=0",
                     "--set", "persistence.enabled=false", "--set", "totalSteps=100000000", "--set", "actors=2",
                     "--set", "actorsPerPod=1", "--set", "envsPerActor=8", "--set", "segmentLength=64",
                     "--set", "config.faults.min_actors=1", "--set", "config.ppo.minibatch_size=256",
                     "--set", "config.run.target_return=null", "--set", "worker.terminationGracePeriodSeconds=2")
    spec, _config, run_dir, entrypoint = local_job(objects, cluster_root)
    (group,) = spec["rayClusterSpec"]["workerGroupSpecs"]
    assert group["replicas"] == 2 and group["template"]["spec"]["nodeSelector"] == {"cloud.google.com/gke-spot": "true"}
    grace = group["template"]["spec"]["terminationGracePeriodSeconds"]
    local = emulated.local
    follow = submitter(emulated.address, "spot", entrypoint, emulated.env, local)
    wait_for(metrics, "dppo_iteration", 2, follow, local)
    actors, _nodes = job_actors(emulated, "spot")
    sampling = {a["pid"] for a in actors if a["class_name"] == "Actor" and a["state"] == "ALIVE"}
    # a pod running exactly one of the run's actors (its PID 1, as a pod's container has it)
    pods = {p.pid: len(sampling.intersection(descendants(p.pid))) for p in local.procs[1:5]}
    pod = next((p for p in local.procs[1:5] if pods[p.pid] == 1), None)
    assert pod is not None, (pods, actors)
    os.kill(pod.pid, signal.SIGTERM)  # the reclaim notice
    with contextlib.suppress(subprocess.TimeoutExpired):
        pod.wait(timeout=grace)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pod.pid, signal.SIGKILL)  # the grace period is over: the node goes
    deadline = time.monotonic() + 240
    while sum(r["segments"] == 1 for r in progress(run_dir)) < 3:  # rounds on the other pod's actor alone
        assert follow.poll() is None and time.monotonic() < deadline, local.logs()
        time.sleep(0.5)
    config = str(cluster_root / "config.yaml").encode()  # the driver: the entrypoint's process, ours alone
    (driver,) = [int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit() and config in _cmdline(e)
                 and Path(_cmdline(e).split(b"\0")[0].decode()).name.startswith("python")]  # not its shell
    os.kill(driver, signal.SIGTERM)  # as a user's stop: the round ends, a final checkpoint, the summary
    output, _ = follow.communicate(timeout=300)
    assert "lost with its node" in output, output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["reason"] == "signal" and summary["actor_crashes"] == 0, summary  # stopped, with its checkpoint
    assert summary["node_losses"] >= 1, summary
