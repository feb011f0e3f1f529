"""The Helm chart, checked without a cluster: lint, render over a values matrix, validate every object
(built-in kinds with kubernetes-validate, KubeRay and Prometheus Operator CRs against the CRD schemas in
tests/deploy/schemas made strict), and the schema's rejections of bad values."""

from __future__ import annotations

import copy
import functools
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from conftest import load_module

from dppo.config import validate as validate_config
from dppo.config.env import PETTINGZOO_MODULE

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "dppo"
VALUES_DIR = Path(__file__).parent / "values"
MATRIX = sorted(p.stem for p in VALUES_DIR.glob("*.yaml"))
K8S_VERSIONS = ("1.27.0", "1.37.0")  # the chart's kubeVersion floor and the newest schemas
CR_GROUPS = {"ray.io", "monitoring.coreos.com"}
# Config keys the chart sets from its own values (they size the cluster or name the run).
CHART_MANAGED = {("env", "id"), ("run", "actors"), ("run", "actor_cpus"), ("run", "run_dir"), ("run", "name"),
                 ("metrics", "port"), ("metrics", "host"), ("metrics", "linger_s")}


def helm(helm_bin: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`helm ARGS`. A render, a lint or a client-side dry run reads only the chart and values files that no test
    changes, so one with the same arguments is run once per session worker (the tests render the same values
    about 100 times over)."""
    if args[0] in ("template", "lint") or (args[0] == "install" and "--dry-run=client" in args):
        return helm_reading(helm_bin, *args)
    return subprocess.run([helm_bin, *args], capture_output=True, text=True, timeout=120, check=False)


@functools.cache
def helm_reading(helm_bin: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm_bin, *args], capture_output=True, text=True, timeout=120, check=False)


# PyYAML's safe loader on libyaml where the wheel has it: parsing the renders in pure Python took about 7 s of this
# module's 95 s on one process (helm's renders most of the rest).
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def render(helm_bin: str, *args: str, release: str = "r") -> list[dict[str, Any]]:
    """`helm template` (hooks included) -> the rendered objects."""
    out = helm(helm_bin, "template", release, str(CHART), "--namespace", "ml", *args)
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.load_all(out.stdout, Loader=SAFE_LOADER) if doc]


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def strict(schema: Any) -> Any:
    """Reject unknown fields: add additionalProperties false wherever an object lists its properties."""
    if isinstance(schema, dict):
        schema = {k: strict(v) for k, v in schema.items()}
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


SCHEMAS = Path(__file__).parent / "schemas"  # vendored: tests/deploy/schemas/VERSIONS, update.py


@functools.cache
def checked_validator(path: Path, strict_fields: bool = False) -> jsonschema.protocols.Validator:
    """A validator of the JSON schema file ``path`` (:func:`strict` if asked), of the draft the schema names, its
    schema checked against that draft's metaschema once per worker: `jsonschema.validate` checks it again at every
    call (this module took 107 s against 95 s on one process for the custom resources' schemas, and 12.9 s more for
    the chart's and KubeRay 1.5.1's)."""
    schema = json.loads(path.read_text())
    schema = strict(schema) if strict_fields else schema
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    cls.check_schema(schema)
    return cls(schema)


def validate_object(obj: dict[str, Any]) -> None:
    group, _, version = obj["apiVersion"].rpartition("/")
    if group in CR_GROUPS:
        checked_validator(SCHEMAS / group / f"{obj['kind'].lower()}_{version}.json", strict_fields=True).validate(obj)
    else:
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)


def containers(objects: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(pod spec, container) for every pod template the chart renders."""
    specs = []
    for obj in objects:
        if obj["kind"] == "Pod":
            specs.append(obj["spec"])
        elif obj["kind"] == "RayJob":
            cluster = obj["spec"]["rayClusterSpec"]
            specs.append(obj["spec"]["submitterPodTemplate"]["spec"])
            specs.append(cluster["headGroupSpec"]["template"]["spec"])
            specs += [g["template"]["spec"] for g in cluster["workerGroupSpecs"]]
    return [(spec, c) for spec in specs for c in spec["containers"]]


def head_container(rayjob: dict[str, Any]) -> dict[str, Any]:
    return rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]


def training_config(objects: list[dict[str, Any]]) -> dict[str, Any]:
    config_map = next(o for o in by_kind(objects, "ConfigMap") if o["metadata"]["name"].endswith("-config"))
    return yaml.safe_load(config_map["data"]["config.yaml"])


@pytest.mark.parametrize("values", MATRIX)
def test_helm_lint_strict_passes(helm_bin: str, values: str) -> None:
    out = helm(helm_bin, "lint", "--strict", str(CHART), "-f", str(VALUES_DIR / f"{values}.yaml"))
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("values", MATRIX)
def test_rendered_objects_are_valid(helm_bin: str, values: str) -> None:
    objects = render(helm_bin, "-f", str(VALUES_DIR / f"{values}.yaml"))
    for obj in objects:
        validate_object(obj)
    # The training config is a complete, valid dppo config.
    validate_config(training_config(objects))


@pytest.mark.parametrize("values", MATRIX)
def test_pods_run_restricted_with_memory_limits_and_no_cpu_limits(helm_bin: str, values: str) -> None:
    objects = render(helm_bin, "-f", str(VALUES_DIR / f"{values}.yaml"))
    pods = containers(objects)
    # submitter, head, workers, helm test (and learner pods with learners.replicas >= 2)
    assert len(pods) == (5 if values == "learners" else 4)
    for spec, container in pods:
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert spec["automountServiceAccountToken"] is False
        sc = container["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        limits = container["resources"].get("limits", {})
        requests = container["resources"]["requests"]
        assert "cpu" not in limits, "no CPU limits: they throttle the driver and the actors"
        assert limits["memory"] == requests["memory"]
    for service in by_kind(objects, "Service"):
        assert service["spec"]["type"] == "ClusterIP"


def test_default_values_render_one_rayjob_with_two_actor_workers(helm_bin: str) -> None:
    objects = render(helm_bin)
    rayjob = one(objects, "RayJob")
    spec = rayjob["spec"]
    cluster = spec["rayClusterSpec"]
    assert spec["entrypoint"] == "dppo train --config /etc/dppo/config.yaml"
    # KubeRay >= 1.6 deletion rules in place of shutdownAfterJobFinishes (test_cleanup_...).
    assert spec["shutdownAfterJobFinishes"] is False and spec["deletionStrategy"]["deletionRules"]
    assert spec["submissionMode"] == "K8sJobMode"
    assert "ttlSecondsAfterFinished" not in spec and spec["activeDeadlineSeconds"] > 0
    assert cluster["authOptions"] == {"mode": "token"}
    assert cluster["rayVersion"] == "2.60.0"
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    (workers,) = cluster["workerGroupSpecs"]
    assert workers["replicas"] == workers["minReplicas"] == workers["maxReplicas"] == 2
    assert workers["rayStartParams"]["num-cpus"] == "1"
    head = head_container(rayjob)
    ports = {p["name"]: p["containerPort"] for p in head["ports"]}
    assert ports["dppo-metrics"] == 8000 and ports["dashboard"] == 8265 and ports["gcs-server"] == 6379
    mount = next(m for m in head["volumeMounts"] if m["name"] == "config")
    assert mount["mountPath"] == "/etc/dppo"
    config = training_config(objects)
    assert config["env"]["id"] == "CartPole-v1"
    assert config["run"]["actors"] == 2 and config["run"]["actor_cpus"] == 1
    assert config["metrics"]["port"] == 8000 and config["metrics"]["linger_s"] > 15
    assert {o["kind"] for o in objects} == {"RayJob", "ConfigMap", "Service", "NetworkPolicy", "Pod"}
    test_pod = one(objects, "Pod")
    assert test_pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert "r-dppo-metrics:8000/metrics" in " ".join(test_pod["spec"]["containers"][0]["command"])


def test_config_uses_the_env_preset(helm_bin: str) -> None:
    """Like `dppo train --env ID`, the chart starts from the bundled preset for that env id."""
    for preset in sorted((REPO / "dppo" / "presets").glob("*.yaml")):
        data = yaml.safe_load(preset.read_text())
        env_id = data["env"]["id"]
        config = training_config(render(helm_bin, "--set", f"env={env_id}"))
        for section, keys in data.items():
            for key, value in keys.items():
                if (section, key) not in CHART_MANAGED:
                    assert config[section][key] == value, f"{preset.name}: {section}.{key}"


def test_worker_pods_hold_actors_per_pod_rounded_up(helm_bin: str) -> None:
    objects = render(helm_bin, "-f", str(VALUES_DIR / "actors-8.yaml"))
    cluster = one(objects, "RayJob")["spec"]["rayClusterSpec"]
    (workers,) = cluster["workerGroupSpecs"]
    assert workers["replicas"] == 2 and workers["rayStartParams"]["num-cpus"] == "4"
    config = training_config(objects)
    assert config["run"]["actors"] == 8 and config["env"]["id"] == "LunarLander-v3"
    # Uneven split: 5 actors, 2 per pod -> 3 pods.
    cluster = one(render(helm_bin, "--set", "actors=5", "--set", "actorsPerPod=2"), "RayJob")["spec"]["rayClusterSpec"]
    assert cluster["workerGroupSpecs"][0]["replicas"] == 3


def test_all_optional_values_render_and_chart_keys_win_over_config(helm_bin: str) -> None:
    objects = render(helm_bin, "-f", str(VALUES_DIR / "everything.yaml"))
    rayjob = one(objects, "RayJob")
    assert rayjob["metadata"]["name"] == "exp-42"
    assert "activeDeadlineSeconds" not in rayjob["spec"] and "preRunningDeadlineSeconds" not in rayjob["spec"]
    head = head_container(rayjob)
    assert head["image"] == "registry.example.com/ml/dppo:0.1.0-custom"
    assert {"name": "OMP_NUM_THREADS", "value": "1"} in head["env"]
    config = training_config(objects)
    # Chart-managed keys win over `config`; the rest of `config` wins over the preset.
    assert config["run"]["actors"] == 3 and config["run"]["checkpoint_every"] == 5
    assert config["ppo"]["learning_rate"] == 0.0003 and config["ppo"]["epochs"] == 10
    assert config["env"]["num_envs"] == 4 and config["ppo"]["segment_length"] == 32
    assert config["run"]["total_steps"] == 2000000 and config["run"]["seed"] == 7
    assert config["run"]["target_return"] == 490.5
    for spec, _ in containers(objects):
        assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    for obj in objects:
        assert obj["metadata"]["labels"]["team"] == "rl"


def test_monitoring_renders_pod_or_service_monitors_and_the_dashboard(helm_bin: str) -> None:
    objects = render(helm_bin, "-f", str(VALUES_DIR / "monitoring.yaml"))
    monitors = {m["metadata"]["name"]: m for m in by_kind(objects, "PodMonitor")}
    learner, ray = monitors["r-dppo-learner"], monitors["r-dppo-ray"]
    assert learner["metadata"]["labels"]["release"] == "prom"
    assert learner["spec"]["podMetricsEndpoints"][0]["port"] == "dppo-metrics"
    assert learner["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "head"
    assert ray["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    dashboard = next(o for o in by_kind(objects, "ConfigMap") if o["metadata"]["name"] == "r-dppo-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    board = json.loads(dashboard["data"]["dppo.json"])
    assert board == json.loads((CHART / "dashboards" / "dppo.json").read_text())
    assert "datasource" in {v["name"] for v in board["templating"]["list"]}

    objects = render(helm_bin, "-f", str(VALUES_DIR / "servicemonitor.yaml"))
    assert not by_kind(objects, "PodMonitor")
    monitor = one(objects, "ServiceMonitor")
    service = one(objects, "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]


def test_persistence_resumes_on_retry(helm_bin: str) -> None:
    objects = render(helm_bin, "-f", str(VALUES_DIR / "persistence.yaml"))
    rayjob = one(objects, "RayJob")
    assert rayjob["spec"]["backoffLimit"] == 2
    assert rayjob["spec"]["entrypoint"].endswith("--auto-resume")
    pvc = one(objects, "PersistentVolumeClaim")
    assert pvc["spec"]["resources"]["requests"]["storage"] == "10Gi"
    assert pvc["spec"]["storageClassName"] == "standard"
    head_spec = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    volume = next(v for v in head_spec["volumes"] if v["name"] == "checkpoints")
    assert volume["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    mount = next(m for m in head_container(rayjob)["volumeMounts"] if m["name"] == "checkpoints")
    assert training_config(objects)["run"]["run_dir"].startswith(mount["mountPath"] + "/")

    objects = render(helm_bin, "-f", str(VALUES_DIR / "existing-claim.yaml"))
    assert not by_kind(objects, "PersistentVolumeClaim")
    head_spec = one(objects, "RayJob")["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "my-checkpoints"}} in head_spec["volumes"]
    assert training_config(objects)["run"]["run_dir"] == "/checkpoints/r-dppo"


def test_sweep_mode_runs_dppo_sweep_with_workers_for_its_concurrent_trials(helm_bin: str, tmp_path: Path) -> None:
    """sweep.enabled: the entrypoint is `dppo sweep` on the ConfigMap's sweep.yaml (every trial's base the
    config.yaml beside it, which dppo accepts), the worker group holds concurrent x (actors + 1) Ray CPUs, and the
    worker pods mount the claim the results go to."""
    from dppo.sweep.spec import load_sweep

    objects = render(helm_bin, "-f", str(VALUES_DIR / "sweep.yaml"))
    rayjob = one(objects, "RayJob")
    config_map = next(o for o in by_kind(objects, "ConfigMap") if o["metadata"]["name"].endswith("-config"))
    assert rayjob["spec"]["entrypoint"] == ("dppo sweep --config /etc/dppo/sweep.yaml --out-dir /data/r-dppo "
                                            "--auto-resume")
    for name, text in config_map["data"].items():
        (tmp_path / name).write_text(text)
    sweep = load_sweep(tmp_path / "sweep.yaml")  # dppo's own checks of the rendered file
    assert sweep.spec.scheduler.name == "pbt" and sweep.spec.scheduler.mutate == ["ppo.learning_rate"]
    assert (sweep.spec.trials, sweep.spec.concurrent, sweep.spec.driver_cpus) == (4, 2, 1)
    assert sweep.spec.metrics.port == 8000 and sweep.spec.metrics.host == "0.0.0.0"
    assert sweep.base["env"]["id"] == "Pendulum-v1" and sweep.base["run"]["total_steps"] == 100000
    (workers,) = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert workers["replicas"] == 2 and workers["rayStartParams"] == {"num-cpus": "3"}  # ceil(2 x (2 + 1) / 3)
    pvc = one(objects, "PersistentVolumeClaim")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    worker_spec = workers["template"]["spec"]
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": pvc["metadata"]["name"]}} in \
        worker_spec["volumes"]
    assert {"name": "checkpoints", "mountPath": "/data"} in worker_spec["containers"][0]["volumeMounts"]
    assert "Sweep: 4 trial(s) of the space ppo.clip_coef, ppo.learning_rate, run.seed" in notes(
        helm_bin, "-f", str(VALUES_DIR / "sweep.yaml"))
    default = render(helm_bin, "-f", str(VALUES_DIR / "persistence.yaml"))
    assert "sweep.yaml" not in one(default, "ConfigMap")["data"]
    assert "volumes" not in one(default, "RayJob")["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]


SWEEP_ON = ["--set", "sweep.enabled=true", "--set", "persistence.enabled=true",
            "--set", "persistence.accessModes={ReadWriteMany}"]


@pytest.mark.parametrize(("args", "message"), [
    (["--set", "sweep.enabled=true"], "sweep.enabled needs persistence.enabled"),
    (["--set", "sweep.enabled=true", "--set", "persistence.enabled=true"], "so it must be ReadWriteMany"),
    ([*SWEEP_ON, "--set", "learners.replicas=2", "--set", "config.ppo.minibatch_size=256"],
     "sweep.enabled with learners.replicas > 0"),
    ([*SWEEP_ON, "--set", "head.gpus=1"], "sweep.enabled with head.gpus > 0"),
    ([*SWEEP_ON, "--set", "sweep.scheduler.name=pbt", "--set-string", "sweep.space.run\\.seed=grid([1\\, 2])"],
     "sweep.scheduler.name=pbt needs a sweep.space key to perturb"),
    ([*SWEEP_ON, "--set-string", "sweep.space.ppo\\.learnin_rate=uniform(0\\, 1)"],
     "invalid propertyName 'ppo.learnin_rate'"),
    ([*SWEEP_ON, "--set-string", "sweep.space.ppo\\.learning_rate=lognormal(1)"],
     "at '/sweep/space/ppo.learning_rate': 'lognormal(1)' does not match pattern"),
    ([*SWEEP_ON, "--set", "sweep.scheduler.name=hyperband"], "at '/sweep/scheduler/name'"),
    ([*SWEEP_ON, "--set", "sweep.scheduler.quantile=0.9"], "at '/sweep/scheduler/quantile'"),
    ([*SWEEP_ON, "--set", "sweep.concurrent=0"], "at '/sweep/concurrent'"),
])
def test_bad_sweep_values_fail_at_render_time(helm_bin: str, args: list[str], message: str) -> None:
    out = helm(helm_bin, "template", "r", str(CHART), *args)
    assert out.returncode != 0 and message in out.stderr, out.stderr


def test_gpu_learner_puts_a_gpu_on_the_head_only(helm_bin: str) -> None:
    rayjob = one(render(helm_bin, "-f", str(VALUES_DIR / "gpu-learner.yaml")), "RayJob")
    head = head_container(rayjob)
    assert head["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert head["image"] == "dppo:0.1.0-gpu"
    cluster = rayjob["spec"]["rayClusterSpec"]
    assert cluster["headGroupSpec"]["rayStartParams"] == {"num-cpus": "0", "dashboard-host": "0.0.0.0", "num-gpus": "1"}
    assert cluster["headGroupSpec"]["template"]["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"
    worker = cluster["workerGroupSpecs"][0]["template"]["spec"]
    assert "nvidia.com/gpu" not in worker["containers"][0]["resources"].get("limits", {})
    assert "tolerations" not in worker


def test_a_pettingzoo_env_renders_a_multiagent_config(helm_bin: str) -> None:
    """env=<PettingZoo module> passes the env id check (left to the run, like package:EnvId) and renders a config
    dppo reads as a multi-agent env with its agent columns."""
    config = validate_config(training_config(render(helm_bin, "-f", str(VALUES_DIR / "multiagent.yaml"))))
    assert config.env.multiagent and config.env.id == "mpe2.simple_spread_v3" and config.env.num_envs == 8
    assert config.env.kwargs == {"N": 3, "max_cycles": 25, "continuous_actions": False}


def test_a_policy_map_renders_into_the_config(helm_bin: str) -> None:
    """config.policies (a policy per role) passes the schema and renders a config dppo reads with the map; a map
    that is not one (a pattern that is not a list) is helm's error."""
    config = validate_config(training_config(render(helm_bin, "-f", str(VALUES_DIR / "policies.yaml"))))
    assert config.env.multiagent and config.env.id == "mpe2.simple_adversary_v3" and config.env.num_envs == 8
    assert config.policies == {"adversary": ["adversary_*"], "agent": ["agent_*"]}
    assert config.policy_names == ["adversary", "agent"]
    bad = helm(helm_bin, "template", "r", str(CHART), "-f", str(VALUES_DIR / "policies.yaml"), "--set",
               "config.policies.adversary=adversary_0")
    assert bad.returncode != 0 and "policies" in bad.stderr, bad.stderr


def test_a_two_player_game_renders_a_selfplay_config(helm_bin: str) -> None:
    """env=<a PettingZoo classic game> with a selfplay section: the schema takes the section, and dppo reads the
    rendered config as a multi-agent env with the pool's settings (the env is a turn-based game: made at start)."""
    config = validate_config(training_config(render(helm_bin, "-f", str(VALUES_DIR / "selfplay.yaml"))))
    assert config.env.multiagent and config.env.id == "pettingzoo.classic.tictactoe_v3" and config.env.num_envs == 64
    selfplay = config.selfplay
    assert (selfplay.snapshot_every, selfplay.pool_size, selfplay.opponents) == (10, 30, "win_rate")
    bad = helm(helm_bin, "template", "r", str(CHART), "-f", str(VALUES_DIR / "selfplay.yaml"), "--set",
               "config.selfplay.opponents=best")
    assert bad.returncode != 0 and "selfplay" in bad.stderr


def test_the_inference_service_goes_to_the_gpu_head(helm_bin: str) -> None:
    """run.inference=server with head.gpus: the head is the only node advertising GPUs and CPUs nowhere but the
    workers, so the service (num_cpus 0, half a GPU: dppo/distributed/inference.py) can only be placed on the head,
    beside the driver's update; the config dppo reads asks for the server."""
    objects = render(helm_bin, "-f", str(VALUES_DIR / "gpu-learner.yaml"), "--set", "config.run.inference=server")
    cluster = one(objects, "RayJob")["spec"]["rayClusterSpec"]
    assert cluster["headGroupSpec"]["rayStartParams"]["num-gpus"] == "1"
    assert all("num-gpus" not in group["rayStartParams"] and "GPU" not in group.get("resources", {})
               for group in cluster["workerGroupSpecs"])
    assert validate_config(training_config(objects)).run.inference == "server"
    refused = helm(helm_bin, "template", "r", str(CHART), "--set", "config.run.inference=gpu")
    assert refused.returncode != 0 and "inference" in refused.stderr


def test_learners_are_a_second_worker_group(helm_bin: str) -> None:
    """learners.replicas L >= 2: L learner pods advertising dppo_learner and no CPUs (actors never land there),
    and the run's config asks for L learners on that resource."""
    objects = render(helm_bin, "-f", str(VALUES_DIR / "learners.yaml"))
    cluster = one(objects, "RayJob")["spec"]["rayClusterSpec"]
    actors, learners = cluster["workerGroupSpecs"]
    assert actors["groupName"] == "actors" and actors["rayStartParams"] == {"num-cpus": "1"}
    assert learners["groupName"] == "learners" and learners["replicas"] == learners["maxReplicas"] == 2
    assert learners["resources"] == {"CPU": "0", "GPU": "1", "dppo_learner": "1"}
    container = learners["template"]["spec"]["containers"][0]
    assert container["resources"] == {"requests": {"cpu": "4", "memory": "8Gi"},
                                      "limits": {"memory": "8Gi", "nvidia.com/gpu": 1}}
    assert learners["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == "learner"
    run = training_config(objects)["run"]
    assert (run["learners"], run["learner_resource"], run["learner_threads"]) == (2, "dppo_learner", 4)
    default = render(helm_bin)
    assert len(one(default, "RayJob")["spec"]["rayClusterSpec"]["workerGroupSpecs"]) == 1
    assert "learners" not in training_config(default)["run"]


RESTRICTED = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True,
              "seccompProfile": {"type": "RuntimeDefault"}}


def actor_group(objects: list[dict[str, Any]]) -> dict[str, Any]:
    groups = one(objects, "RayJob")["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    return next(g for g in groups if g["groupName"] == "actors")


def test_autoscaling_renders_the_autoscaler_and_the_actor_group_bounds(helm_bin: str) -> None:
    """autoscaling.enabled: KubeRay's in-tree autoscaler with the chart's options and a restricted sidecar, and
    the actor group between minReplicas and maxReplicas, starting with what `actors` needs."""
    objects = render(helm_bin, "-f", str(VALUES_DIR / "autoscaling.yaml"))
    rayjob = one(objects, "RayJob")
    cluster = rayjob["spec"]["rayClusterSpec"]
    # The CRD schema knows these fields: a misspelt one would fail the matrix's validation.
    broken = copy.deepcopy(rayjob)
    broken["spec"]["rayClusterSpec"]["autoscalerOptions"]["idleTimeoutSecond"] = 60
    with pytest.raises(jsonschema.ValidationError):
        validate_object(broken)
    assert cluster["enableInTreeAutoscaling"] is True
    assert cluster["autoscalerOptions"] == {
        "version": "v2", "upscalingMode": "Conservative", "idleTimeoutSeconds": 120,
        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "512Mi"}},
        "securityContext": RESTRICTED,
        "volumeMounts": [{"name": "autoscaler-api-token", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                          "readOnly": True}]}
    actors = actor_group(objects)
    assert (actors["replicas"], actors["minReplicas"], actors["maxReplicas"]) == (3, 1, 4)  # 6 actors, 2 per pod
    assert actors["rayStartParams"] == {"num-cpus": "2"}
    # The dppo config is the user's: run.actors is the target, no fault settings are added.
    config = training_config(objects)
    assert config["run"]["actors"] == 6 and "faults" not in config
    # maxReplicas defaults to what `actors` needs.
    actors = actor_group(render(helm_bin, "--set", "autoscaling.enabled=true", "--set", "actors=5",
                                "--set", "actorsPerPod=2"))
    assert (actors["replicas"], actors["minReplicas"], actors["maxReplicas"]) == (3, 0, 3)
    # Off by default: a fixed group and no autoscaler.
    cluster = one(render(helm_bin), "RayJob")["spec"]["rayClusterSpec"]
    assert cluster["enableInTreeAutoscaling"] is False and "autoscalerOptions" not in cluster
    (actors,) = cluster["workerGroupSpecs"]
    assert actors["replicas"] == actors["minReplicas"] == actors["maxReplicas"] == 2


@pytest.mark.parametrize(("args", "expected"), [
    ([], (3, 1, 4)),                                           # what 6 actors at 2 per pod need
    (["--set", "autoscaling.initialReplicas=0"], (1, 1, 4)),   # clamped up to minReplicas
    (["--set", "autoscaling.initialReplicas=9"], (4, 1, 4)),   # clamped down to maxReplicas
    (["--set", "autoscaling.maxReplicas=2"], (2, 1, 2)),       # fewer pods than the actors need
    (["--set", "autoscaling.minReplicas=4"], (4, 4, 4)),       # more
    (["--set", "autoscaling.minReplicas=0", "--set", "autoscaling.initialReplicas=0"], (0, 0, 4)),
])
def test_autoscaling_start_is_clamped_into_min_and_max(helm_bin: str, args: list[str],
                                                        expected: tuple[int, int, int]) -> None:
    actors = actor_group(render(helm_bin, "-f", str(VALUES_DIR / "autoscaling.yaml"), *args))
    assert (actors["replicas"], actors["minReplicas"], actors["maxReplicas"]) == expected


def test_autoscaler_alone_gets_the_api_token(helm_bin: str) -> None:
    """The autoscaler needs a service-account token (KubeRay's ServiceAccount and Role for it); the head pod still
    automounts none, so the driver's container has none: the token is projected into the autoscaler only."""
    rayjob = one(render(helm_bin, "-f", str(VALUES_DIR / "autoscaling.yaml")), "RayJob")
    head_spec = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert head_spec["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in head_spec  # KubeRay sets its autoscaler ServiceAccount
    volume = next(v for v in head_spec["volumes"] if v["name"] == "autoscaler-api-token")
    sources = volume["projected"]["sources"]
    assert sources[0] == {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}
    assert sources[1]["configMap"] == {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    assert "autoscaler-api-token" not in {m["name"] for m in head_container(rayjob)["volumeMounts"]}
    default_head = one(render(helm_bin), "RayJob")["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert "autoscaler-api-token" not in {v["name"] for v in default_head["volumes"]}


def test_learners_group_stays_fixed_with_autoscaling(helm_bin: str) -> None:
    objects = render(helm_bin, "-f", str(VALUES_DIR / "learners.yaml"), "-f", str(VALUES_DIR / "autoscaling.yaml"))
    cluster = one(objects, "RayJob")["spec"]["rayClusterSpec"]
    actors, learners = cluster["workerGroupSpecs"]
    assert (actors["replicas"], actors["minReplicas"], actors["maxReplicas"]) == (3, 1, 4)
    assert learners["groupName"] == "learners"
    assert learners["replicas"] == learners["minReplicas"] == learners["maxReplicas"] == 2
    assert kuberay_admission_errors(one(objects, "RayJob")) == []


def test_network_policy_lets_the_head_reach_the_api_server_only_with_autoscaling(helm_bin: str) -> None:
    """The autoscaler sidecar talks to the API server from the head pod: a second policy opens that egress for the
    head only, on the API server ports; without autoscaling there is no such egress."""
    default = one(render(helm_bin), "NetworkPolicy")
    policies = {p["metadata"]["name"]: p for p in by_kind(render(helm_bin, "-f", str(VALUES_DIR / "autoscaling.yaml")),
                                                          "NetworkPolicy")}
    assert set(policies) == {"r-dppo", "r-dppo-apiserver"}
    assert policies["r-dppo"]["spec"] == default["spec"]  # the run's own policy is unchanged
    api = policies["r-dppo-apiserver"]["spec"]
    assert api["podSelector"]["matchLabels"] == {**default["spec"]["podSelector"]["matchLabels"],
                                                 "app.kubernetes.io/component": "head"}
    assert api["policyTypes"] == ["Egress"] and "ingress" not in api
    assert api["egress"] == [{"to": [{"ipBlock": {"cidr": "10.96.0.1/32"}}, {"ipBlock": {"cidr": "172.18.0.0/16"}}],
                              "ports": [{"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"}]}]
    # Defaults: any address, 443 and 6443.
    api = next(p for p in by_kind(render(helm_bin, "--set", "autoscaling.enabled=true"), "NetworkPolicy")
               if p["metadata"]["name"] == "r-dppo-apiserver")["spec"]
    assert api["egress"][0]["to"] == [{"ipBlock": {"cidr": "0.0.0.0/0"}}]
    assert {p["port"] for p in api["egress"][0]["ports"]} == {443, 6443}
    # No API-server egress without autoscaling, and no policy at all with the NetworkPolicy off.
    for rule in default["spec"]["egress"]:
        assert not {p["port"] for p in rule.get("ports", [])} & {443, 6443}
    assert not by_kind(render(helm_bin, "-f", str(VALUES_DIR / "autoscaling.yaml"), "--set",
                              "networkPolicy.enabled=false"), "NetworkPolicy")


@pytest.mark.parametrize(("args", "message"), [
    (["--set", "autoscaling.minReplicas=3"],
     "autoscaling.minReplicas=3 is above autoscaling.maxReplicas=2 (its default: ceil(actors / actorsPerPod) = "
     "ceil(2 / 1)); lower minReplicas or raise maxReplicas"),
    (["--set", "autoscaling.minReplicas=3", "--set", "autoscaling.maxReplicas=2"],
     "autoscaling.minReplicas=3 is above autoscaling.maxReplicas=2; lower minReplicas"),
    (["--set", "autoscaling.maxReplicas=1", "--set", "config.faults.min_actors=2"],
     "config.faults.min_actors=2 needs more actors than autoscaling.maxReplicas=1 pods hold (1 per pod)"),
])
def test_bad_autoscaling_bounds_fail_at_render_time(helm_bin: str, args: list[str], message: str) -> None:
    out = helm(helm_bin, "template", "r", str(CHART), "--set", "autoscaling.enabled=true", *args)
    assert out.returncode != 0 and message in out.stderr, out.stderr
    # Unused while autoscaling is off.
    assert helm(helm_bin, "template", "r", str(CHART), *args).returncode == 0


@pytest.mark.parametrize(("args", "message"), [
    (["--set", "learners.replicas=1"], "learners.replicas=1: use 0"),
    (["--set", "learners.replicas=3"], "learners.replicas=3 must divide ppo.minibatch_size=512"),
    (["--set", "learners.replicas=-1"], "at '/learners/replicas': minimum"),
    (["--set", "learners.memory=lots"], "at '/learners/memory'"),
])
def test_bad_learner_values_fail_at_render_time(helm_bin: str, args: list[str], message: str) -> None:
    out = helm(helm_bin, "template", "r", str(CHART), *args)
    assert out.returncode != 0 and message in out.stderr, out.stderr


def test_runtime_env_reaches_the_rayjob(helm_bin: str) -> None:
    """The user's env code: runtimeEnv becomes the RayJob's runtimeEnvYAML (the submitter passes it to
    `ray job submit`), the env value becomes env.id in the training config; none by default."""
    objects = render(helm_bin, "-f", str(VALUES_DIR / "runtime-env.yaml"))
    spec = one(objects, "RayJob")["spec"]
    assert yaml.safe_load(spec["runtimeEnvYAML"]) == {
        "working_dir": "https://example.com/dppo/custom-env.zip", "pip": ["gymnasium==1.4.0"],
        "env_vars": {"OMP_NUM_THREADS": "1"}}
    config = yaml.safe_load(one(objects, "ConfigMap")["data"]["config.yaml"])
    assert config["env"]["id"] == "dppo_example_env:DppoExample/Corridor-v0"
    assert "runtimeEnvYAML" not in one(render(helm_bin), "RayJob")["spec"]
    example = yaml.safe_load((REPO / "examples" / "custom-env" / "values.yaml").read_text())
    assert one(render(helm_bin, "-f", str(REPO / "examples" / "custom-env" / "values.yaml")), "RayJob")[
        "spec"]["runtimeEnvYAML"].strip() == yaml.safe_dump(example["runtimeEnv"]).strip()


def test_dns_egress_reaches_every_common_dns(helm_bin: str) -> None:
    """kube-dns pods only (the old rule) leaves workers in wait-gcs-ready on GKE Cloud DNS, NodeLocal
    DNSCache and OpenShift (dns-default pods on 5353)."""
    policy = one(render(helm_bin), "NetworkPolicy")["spec"]
    dns = policy["egress"][1]
    peers = dns["to"]
    assert {"cidr": "169.254.20.10/32"} in [p.get("ipBlock") for p in peers]
    assert {"cidr": "169.254.169.254/32"} in [p.get("ipBlock") for p in peers]
    labels = [p.get("podSelector", {}).get("matchLabels") for p in peers]
    assert {"k8s-app": "kube-dns"} in labels and {"dns.operator.openshift.io/daemonset-dns": "default"} in labels
    assert {(p["port"], p["protocol"]) for p in dns["ports"]} == {(53, "UDP"), (53, "TCP"), (5353, "UDP"),
                                                                  (5353, "TCP")}
    custom = one(render(helm_bin, "--set", "networkPolicy.dnsPeers[0].ipBlock.cidr=10.0.0.10/32"),
                 "NetworkPolicy")["spec"]["egress"][1]["to"]
    assert custom == [{"ipBlock": {"cidr": "10.0.0.10/32"}}]


def test_operator_admitted_from_its_namespace_with_either_install_label(helm_bin: str) -> None:
    rule = one(render(helm_bin), "NetworkPolicy")["spec"]["ingress"][1]
    assert [p["podSelector"]["matchLabels"] for p in rule["from"]] == [
        {"app.kubernetes.io/name": "kuberay-operator"}, {"app.kubernetes.io/component": "kuberay-operator"}]
    for peer in rule["from"]:
        assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "ray-system"}}


def test_kuberay_minimum_version_is_the_one_the_rayjob_needs(helm_bin: str) -> None:
    """By default (kuberayVersion 1.7.0) the RayJob has preRunningDeadlineSeconds and deletionRules, KubeRay 1.6.0's:
    that is the minimum the docs state; the chart's own floor, for kuberayVersion 1.5.x, is 1.5.1 (authOptions)."""
    spec = one(render(helm_bin), "RayJob")["spec"]
    assert "preRunningDeadlineSeconds" in spec and "deletionRules" in spec["deletionStrategy"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["annotations"]["dppo.io/requires-kuberay"] == ">=1.5.1"
    for doc in (REPO / "README.md", REPO / "docs" / "kubernetes.md"):
        assert ">= 1.6.0" in doc.read_text(), doc
    assert "dppo:latest" not in (REPO / "docs" / "kubernetes.md").read_text()  # make image tags dppo:0.1.0


KUBERAY_151_RAYJOB = SCHEMAS / "kuberay-v1.5.1" / "ray.io" / "rayjob_v1.json"


@pytest.mark.parametrize("values", ["defaults", "persistence", "kueue", "volcano", "spot"])
def test_an_older_operator_gets_the_old_cleanup_fields_and_its_own_crd(helm_bin: str, values: str) -> None:
    """kuberayVersion 1.5.x (deletionRules behind an alpha gate, off by default; no preRunningDeadlineSeconds): the
    RayJob KubeRay 1.5.1's CRD accepts, cleaned up by shutdownAfterJobFinishes and ttlSecondsAfterFinished."""
    rayjob = one(render(helm_bin, "-f", str(VALUES_DIR / f"{values}.yaml"), "--set", "kuberayVersion=1.5.1"), "RayJob")
    spec = rayjob["spec"]
    assert "deletionStrategy" not in spec and "preRunningDeadlineSeconds" not in spec
    assert spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] == 600
    checked_validator(KUBERAY_151_RAYJOB, strict_fields=True).validate(rayjob)
    assert kuberay_admission_errors(rayjob) == []
    out = helm(helm_bin, "template", "r", str(CHART), "--set", "kuberayVersion=1.4.0")
    assert out.returncode != 0 and "needs KubeRay >= 1.5.1" in out.stderr


def test_submitter_pod_deadline_and_usage_stats_off(helm_bin: str) -> None:
    rayjob = one(render(helm_bin), "RayJob")["spec"]
    assert rayjob["submitterPodTemplate"]["spec"]["activeDeadlineSeconds"] == rayjob["activeDeadlineSeconds"]
    cluster = rayjob["rayClusterSpec"]
    containers = [cluster["headGroupSpec"]["template"]["spec"]["containers"][0],
                  cluster["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]]
    for container in containers:
        assert {"name": "RAY_USAGE_STATS_ENABLED", "value": "0"} in container["env"]
    no_deadline = one(render(helm_bin, "--set", "job.activeDeadlineSeconds=null"), "RayJob")["spec"]
    assert "activeDeadlineSeconds" not in no_deadline["submitterPodTemplate"]["spec"]


def test_old_ray_with_token_auth_fails_at_render_time(helm_bin: str) -> None:
    out = helm(helm_bin, "template", "r", str(CHART), "--set", "rayVersion=2.51.0")
    assert out.returncode != 0 and "older than 2.52.0" in out.stderr and "auth.enabled=false" in out.stderr
    assert helm(helm_bin, "template", "r", str(CHART), "--set", "rayVersion=2.51.0",
                "--set", "auth.enabled=false").returncode == 0


def test_name_label_is_fixed_for_dppo_status(helm_bin: str) -> None:
    """`dppo status` selects RayJobs by app.kubernetes.io/name=dppo; nameOverride must not break that."""
    from dppo.commands.status import LABEL_SELECTOR

    key, _, value = LABEL_SELECTOR.partition("=")
    for args in ([], ["--set", "nameOverride=trainer"]):
        assert one(render(helm_bin, *args), "RayJob")["metadata"]["labels"][key] == value


def test_auth_off_renders_no_auth_options(helm_bin: str) -> None:
    rayjob = one(render(helm_bin, "-f", str(VALUES_DIR / "auth-off.yaml")), "RayJob")
    assert "authOptions" not in rayjob["spec"]["rayClusterSpec"]


def test_network_policy_covers_every_pod_and_opens_only_the_needed_ports(helm_bin: str) -> None:
    objects = render(helm_bin)
    policy = one(objects, "NetworkPolicy")
    spec = policy["spec"]
    own = spec["podSelector"]["matchLabels"]
    # Every pod of the run carries the policy's selector labels, so the policy covers them all and
    # "the run's own pods" admits exactly them.
    template_labels = [one(objects, "Pod")["metadata"]["labels"]]
    rayjob = one(objects, "RayJob")["spec"]
    template_labels.append(rayjob["submitterPodTemplate"]["metadata"]["labels"])
    template_labels.append(rayjob["rayClusterSpec"]["headGroupSpec"]["template"]["metadata"]["labels"])
    template_labels += [g["template"]["metadata"]["labels"] for g in rayjob["rayClusterSpec"]["workerGroupSpecs"]]
    for labels in template_labels:
        assert own.items() <= labels.items()
    ingress_ports = [{p["port"] for p in rule.get("ports", [])} for rule in spec["ingress"]]
    assert ingress_ports == [set(), {8265}, {8000, 8080}, {8000}]  # the last: `dppo status` (statusPeers)
    assert spec["ingress"][0]["from"] == [{"podSelector": {"matchLabels": own}}]
    assert spec["ingress"][1]["from"][0]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "kuberay-operator"}
    egress_ports = [{p["port"] for p in rule.get("ports", [])} for rule in spec["egress"]]
    assert egress_ports == [set(), {53, 5353}]
    assert spec["policyTypes"] == ["Ingress", "Egress"]

    assert not by_kind(render(helm_bin, "-f", str(VALUES_DIR / "netpol-off.yaml")), "NetworkPolicy")


def download_egress(objects: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The egress rule of the <release>-dppo-downloads policy (None when the chart renders none)."""
    policies = {p["metadata"]["name"]: p["spec"] for p in by_kind(objects, "NetworkPolicy")}
    if "r-dppo-downloads" not in policies:
        return None
    spec = policies["r-dppo-downloads"]
    assert spec["policyTypes"] == ["Egress"] and spec["podSelector"] == policies["r-dppo"]["podSelector"]
    (rule,) = spec["egress"]
    return rule


@pytest.mark.parametrize(("args", "ports"), [
    (["-f", str(VALUES_DIR / "runtime-env.yaml")], {443}),  # an https working_dir and pip
    (["--set", "runtimeEnv.working_dir=https://bucket.s3.amazonaws.com/custom-env.zip"], {443}),
    (["--set", "runtimeEnv.working_dir=http://10.0.0.5:8080/env.zip"], {8080}),
    (["--set-json", 'runtimeEnv.py_modules=["s3://b/m.zip","http://files.local/n.zip","gs://b/o.zip"]'], {443, 80}),
    (["--set-json", 'runtimeEnv.pip=["minigrid"]'], {443}),
    (["--set", "runtimeEnv.conda=myenv"], {443}),
])
def test_runtime_env_downloads_get_their_egress(helm_bin: str, args: list[str], ports: set[int]) -> None:
    """The README's runtimeEnv.working_dir URL and runtimeEnv.pip: the default policy refused both; the chart now
    opens the ports they need (the URL's, else the scheme's) from the run's pods to networkPolicy.downloadPeers."""
    rule = download_egress(render(helm_bin, *args))
    assert rule is not None
    assert rule["to"] == [{"ipBlock": {"cidr": "0.0.0.0/0"}}]
    assert {p["port"] for p in rule["ports"]} == ports and {p["protocol"] for p in rule["ports"]} == {"TCP"}
    narrowed = download_egress(render(helm_bin, *args, "--set-json",
                                      'networkPolicy.downloadPeers=[{"ipBlock":{"cidr":"10.1.0.0/16"}}]'))
    assert narrowed is not None and narrowed["to"] == [{"ipBlock": {"cidr": "10.1.0.0/16"}}]


def test_no_downloads_no_download_egress(helm_bin: str) -> None:
    assert download_egress(render(helm_bin)) is None
    assert download_egress(render(helm_bin, "--set-string", "runtimeEnv.env_vars.OMP_NUM_THREADS=1")) is None
    assert not by_kind(render(helm_bin, "-f", str(VALUES_DIR / "runtime-env.yaml"), "--set",
                              "networkPolicy.enabled=false"), "NetworkPolicy")


def test_downloads_without_peers_fail_with_the_line_to_add(helm_bin: str) -> None:
    args = ["-f", str(VALUES_DIR / "runtime-env.yaml"), "--set-json", "networkPolicy.downloadPeers=[]"]
    out = helm(helm_bin, "template", "r", str(CHART), *args)
    assert out.returncode != 0
    assert ("runtimeEnv downloads at start (TCP port 443) but networkPolicy.downloadPeers is empty" in out.stderr
            and """--set-json 'networkPolicy.downloadPeers=[{"ipBlock":{"cidr":"0.0.0.0/0"}}]'""" in out.stderr)
    # A user who opens the way in extraEgress is trusted to have done so.
    rule = {"to": [{"ipBlock": {"cidr": "10.2.0.0/16"}}], "ports": [{"port": 443}]}
    objects = render(helm_bin, *args, "--set-json", f"networkPolicy.extraEgress=[{json.dumps(rule)}]")
    assert download_egress(objects) is None
    assert one([o for o in objects if o["metadata"]["name"] == "r-dppo"], "NetworkPolicy")["spec"]["egress"][-1] == rule


def test_dppo_status_reads_the_metrics_port_through_the_api_server(helm_bin: str) -> None:
    """`dppo status` goes through the API server's service proxy, which connects from the control plane: admitted on
    the metrics port only (any address by default, networkPolicy.statusPeers narrows or removes it)."""
    ingress = one(render(helm_bin, "--set", "metrics.port=9100"), "NetworkPolicy")["spec"]["ingress"]
    assert ingress[-1] == {"from": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"port": 9100, "protocol": "TCP"}]}
    closed = one(render(helm_bin, "--set-json", "networkPolicy.statusPeers=[]"), "NetworkPolicy")["spec"]["ingress"]
    assert len(closed) == len(ingress) - 1 and all(r["from"] != [{"ipBlock": {"cidr": "0.0.0.0/0"}}] for r in closed)


def test_helm_prints_no_symlink_warning(helm_bin: str) -> None:
    """presets/ was a link to dppo/presets, and every helm call printed `found symbolic link in path`; the chart
    carries presets.yaml instead (helm/values_schema.py writes it)."""
    assert not [p for p in CHART.rglob("*") if p.is_symlink()]
    out = helm(helm_bin, "template", "r", str(CHART), "--set", "env=LunarLander-v3")
    assert out.returncode == 0 and "symbolic link" not in out.stderr, out.stderr
    assert training_config([d for d in yaml.safe_load_all(out.stdout) if d])["ppo"]["gae_lambda"] == yaml.safe_load(
        (REPO / "dppo" / "presets" / "lunarlander.yaml").read_text())["ppo"]["gae_lambda"]


BAD_VALUES = [
    (["--set", "actors=0"], "at '/actors': minimum: got 0, want 1"),
    (["--set", "actorsPerPod=0"], "at '/actorsPerPod': minimum"),
    (["--set", "head.resources.limits.memory=-4Gi"], "at '/head/resources/limits/memory'"),
    (["--set", "worker.resources.requests.memory=-1"], "at '/worker/resources/requests/memory'"),
    (["--set", "bogus=1"], "additional properties 'bogus' not allowed"),
    (["--set", "monitoring.releaseLabel=prom"], "at '/monitoring/releaseLabel': value must be 'unknown key: did you "
                                                "mean monitoring.release?'"),
    (["--set", "config.trainer.lr=1"], "additional properties 'trainer' not allowed"),
    (["--set", "actors=two"], "at '/actors': got string, want integer"),
    (["--set", "auth.enabled=maybe"], "at '/auth/enabled': got string, want boolean"),
    (["--set", "job.ttlSecondsAfterFinished=-1"], "at '/job/ttlSecondsAfterFinished': minimum"),
    (["--set", "job.backoffLimit=-1"], "at '/job/backoffLimit': minimum"),
    (["--set", "metrics.port=8265"], "at '/metrics/port'"),
    (["--set", "monitoring.kind=Probe"], "at '/monitoring/kind'"),
    (["--set", "image.pullPolicy=Sometimes"], "at '/image/pullPolicy'"),
    (["--set", "runtimeEnv.workdir=x"], "additional properties 'workdir' not allowed"),
    (["--set", "metrics.port=12000"], "at '/metrics/port'"),
    (["--set", "metrics.port=10002"], "at '/metrics/port'"),
    (["--set", "metrics.port=6379"], "at '/metrics/port'"),
    (["--set", "runtimeEnv.py_modules=a.zip"], "at '/runtimeEnv/py_modules': got string, want array"),
    (["--set", "runtimeEnv.env_vars.N=1"], "at '/runtimeEnv/env_vars/N': got number, want string"),
    (["--set", "autoscaling.minReplicas=-1"], "at '/autoscaling/minReplicas': minimum: got -1, want 0"),
    (["--set", "autoscaling.maxReplicas=0"], "at '/autoscaling/maxReplicas': minimum: got 0, want 1"),
    (["--set", "autoscaling.initialReplicas=-1"], "at '/autoscaling/initialReplicas': minimum"),
    (["--set", "autoscaling.maximum=4"], "additional properties 'maximum' not allowed"),
    (["--set", "scheduling.admission=slurm"], "at '/scheduling/admission'"),
    (["--set", "scheduling.queue=Team_A"], "at '/scheduling/queue'"),
    (["--set", "job.keepHeadOnFailureSeconds=-1"], "at '/job/keepHeadOnFailureSeconds': minimum"),
    (["--set", "head.restartPolicy=OnFailure"], "at '/head/restartPolicy'"),
    (["--set", "kuberayVersion=v1.7"], "at '/kuberayVersion'"),
    (["--set", "autoscaling.enabled=yes"], "at '/autoscaling/enabled': got string, want boolean"),
    (["--set", "autoscaling.idleTimeoutSeconds=-1"], "at '/autoscaling/idleTimeoutSeconds': minimum"),
    (["--set", "autoscaling.upscalingMode=Fast"], "at '/autoscaling/upscalingMode'"),
    (["--set", "autoscaling.version=v3"], "at '/autoscaling/version'"),
    (["--set", "autoscaling.resources.limits.memory=-1"], "at '/autoscaling/resources/limits/memory'"),
    (["--set", "networkPolicy.apiServerPorts[0]=0"], "at '/networkPolicy/apiServerPorts/0': minimum"),
    # config: the rules of dppo train's own config, at helm install
    (["--set", "config.ppo.learnin_rate=1"], "at '/config/ppo/learnin_rate': value must be 'unknown key: did you mean "
                                             "config.ppo.learning_rate?'"),
    (["--set", "config.run.total_steps=abc"], "at '/config/run/total_steps': got string, want integer"),
    (["--set", "config.ppo.gamma=1.5"], "at '/config/ppo/gamma'"),
    (["--set", "config.run.log_format=xml"], "at '/config/run/log_format'"),
    (["--set", "config.env.wrappers[0].kwargs=1"], "at '/config/env/wrappers/0'"),
]


@pytest.mark.parametrize(("args", "message"), BAD_VALUES, ids=[" ".join(a[1:]) for a, _ in BAD_VALUES])
def test_schema_rejects_bad_values(helm_bin: str, args: list[str], message: str) -> None:
    out = helm(helm_bin, "template", "r", str(CHART), *args)
    assert out.returncode != 0
    assert "values don't meet the specifications of the schema" in out.stderr
    assert message in out.stderr, out.stderr


def test_every_value_is_documented() -> None:
    """Each key in values.yaml has a `# --` comment (helm-docs convention), on itself or on an ancestor
    whose default it belongs to; plain section headers need only documented children."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    undocumented = []
    ancestors: list[tuple[int, bool]] = []  # (indent, documented) of the enclosing keys
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "- ")) or ":" not in stripped:
            continue
        indent = len(line) - len(line.lstrip())
        while ancestors and ancestors[-1][0] >= indent:
            ancestors.pop()
        j = i - 1
        while j >= 0 and lines[j].strip().startswith("#") and not lines[j].strip().startswith("# --"):
            j -= 1
        documented = j >= 0 and lines[j].strip().startswith("# --")
        is_section = stripped.endswith(":")
        if not (documented or is_section or any(d for _, d in ancestors)):
            undocumented.append(stripped)
        ancestors.append((indent, documented))
    assert not undocumented, f"values without a `# --` comment: {undocumented}"


def test_schema_covers_every_value() -> None:
    """values.schema.json knows every key of values.yaml (additionalProperties false would reject it)."""
    validator = checked_validator(CHART / "values.schema.json")
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    validator.validate(values)
    bad = copy.deepcopy(values)
    bad["head"]["memoryLimits"] = {}
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(bad)


def test_validation_rejects_unknown_fields(helm_bin: str) -> None:
    """The checks above would catch a misspelt field in any object, custom resources included."""
    objects = render(helm_bin)
    for obj in objects:
        broken = copy.deepcopy(obj)
        broken["spec" if "spec" in broken else "metadata"]["misspelt"] = 1
        with pytest.raises((jsonschema.ValidationError, kubernetes_validate.ValidationError)):
            validate_object(broken)
    broken = copy.deepcopy(one(objects, "RayJob"))
    head_container(broken)["imagePullPolicy "] = "Always"
    with pytest.raises(jsonschema.ValidationError):
        validate_object(broken)


def kuberay_admission_errors(rayjob: dict[str, Any]) -> list[str]:
    """The RayJob checks KubeRay's operator applies before it creates anything (a port of the rules in
    ray-operator/controllers/ray/utils/validation.go that apply to this chart's RayJob): a CRD schema
    cannot express them, and the operator reports them only as events on the RayJob."""
    errors = []
    name, spec = rayjob["metadata"]["name"], rayjob["spec"]
    cluster = spec["rayClusterSpec"]
    if len(name) > 47 or not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name):
        errors.append("name: at most 47 characters, DNS-1035 label")
    if not spec.get("shutdownAfterJobFinishes") and spec.get("ttlSecondsAfterFinished", 0) > 0:
        errors.append("ttlSecondsAfterFinished needs shutdownAfterJobFinishes")
    if spec.get("ttlSecondsAfterFinished", 0) < 0:
        errors.append("ttlSecondsAfterFinished < 0")
    if spec.get("suspend") and not spec.get("shutdownAfterJobFinishes"):
        errors.append("suspend needs shutdownAfterJobFinishes")
    errors += deletion_strategy_errors(spec)
    if "activeDeadlineSeconds" in spec and spec["activeDeadlineSeconds"] <= 0:
        errors.append("activeDeadlineSeconds <= 0")
    if spec.get("backoffLimit", 0) < 0:
        errors.append("backoffLimit < 0")
    if cluster.get("authOptions", {}).get("mode") == "token":
        version = tuple(int(p) for p in cluster.get("rayVersion", "0.0.0").split("."))
        if version < (2, 52, 0):
            errors.append("token auth needs rayVersion >= 2.52.0")
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        params = group.get("rayStartParams", {})
        if not group["template"]["spec"]["containers"]:
            errors.append("a group without containers")
        if any(params.get(k) for k in ("num-cpus", "num-gpus", "memory", "resources")) and group.get("resources"):
            errors.append("resources in both rayStartParams and resources")
        if "labels" in params:
            errors.append("rayStartParams.labels")
    if spec.get("submitterPodTemplate", {}).get("spec", {}).get("restartPolicy", "Never") != "Never":
        errors.append("submitter restartPolicy must be Never")
    autoscaling = cluster.get("enableInTreeAutoscaling", False)
    options = cluster.get("autoscalerOptions", {})
    for group in cluster["workerGroupSpecs"]:
        low, high = group.get("minReplicas"), group.get("maxReplicas")
        if not autoscaling and (low is None or high is None):
            errors.append("minReplicas and maxReplicas needed without autoscaling")
        if (low is not None and low < 0) or (high is not None and high < 0):
            errors.append("negative minReplicas or maxReplicas")
        if low is not None and high is not None and low > high:
            errors.append("minReplicas > maxReplicas")
        if autoscaling and group.get("suspend"):
            errors.append("a suspended worker group with autoscaling")
    if options.get("idleTimeoutSeconds", 0) < 0:
        errors.append("autoscalerOptions.idleTimeoutSeconds < 0")
    if autoscaling and options.get("version") == "v2":
        for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
            if group["template"]["spec"].get("restartPolicy", "Never") != "Never":
                errors.append("restartPolicy must be Never or unset with autoscaler v2")
    head_env = {e["name"] for e in head_container(rayjob).get("env", [])}
    if not autoscaling and "RAY_enable_autoscaler_v2" in head_env:
        errors.append("RAY_enable_autoscaler_v2 without enableInTreeAutoscaling")
    if autoscaling and "version" in options and "RAY_enable_autoscaler_v2" in head_env:
        errors.append("both autoscalerOptions.version and RAY_enable_autoscaler_v2")
    return errors


def deletion_strategy_errors(spec: dict[str, Any]) -> list[str]:
    """validateDeletionConfiguration of KubeRay v1.7.0 (validation.go) for the forms the chart renders."""
    strategy = spec.get("deletionStrategy")
    if strategy is None:
        return []
    rules, legacy = strategy.get("deletionRules", []), "onSuccess" in strategy or "onFailure" in strategy
    errors = []
    if rules and spec.get("shutdownAfterJobFinishes"):
        errors.append("shutdownAfterJobFinishes and deletionRules are mutually exclusive")
    if rules and legacy:
        errors.append("legacy onSuccess/onFailure and deletionRules together")
    if not rules and not legacy:
        errors.append("an empty deletionStrategy")
    ttls: dict[tuple[str, str], dict[str, int]] = {}
    for rule in rules:
        condition = rule["condition"]
        keys = {"jobStatus", "jobDeploymentStatus"} & set(condition)
        if len(keys) != 1:
            errors.append("a rule needs exactly one of jobStatus and jobDeploymentStatus")
            continue
        (key,) = keys
        if rule["policy"] == "DeleteWorkers" and spec["rayClusterSpec"].get("enableInTreeAutoscaling"):
            errors.append("DeleteWorkers with autoscaling")
        by_policy = ttls.setdefault((key, condition[key]), {})
        if rule["policy"] in by_policy:
            errors.append(f"a duplicate rule {rule}")
        by_policy[rule["policy"]] = condition.get("ttlSeconds", 0)
    for by_policy in ttls.values():
        order = [by_policy[p] for p in ("DeleteWorkers", "DeleteCluster", "DeleteSelf") if p in by_policy]
        if order != sorted(order):
            errors.append("TTLs must grow from DeleteWorkers to DeleteCluster to DeleteSelf")
    return errors


@pytest.mark.parametrize("values", MATRIX)
def test_kuberay_would_accept_the_rayjob(helm_bin: str, values: str) -> None:
    rayjob = one(render(helm_bin, "-f", str(VALUES_DIR / f"{values}.yaml")), "RayJob")
    assert kuberay_admission_errors(rayjob) == []


def test_kuberay_rules_are_kept_by_the_chart(helm_bin: str) -> None:
    """Values KubeRay would reject either render a valid RayJob or fail at `helm install` already."""
    rayjob = one(render(helm_bin, "--set", "job.shutdownAfterJobFinishes=false"), "RayJob")
    assert "ttlSecondsAfterFinished" not in rayjob["spec"] and kuberay_admission_errors(rayjob) == []
    out = helm(helm_bin, "template", "1st", str(CHART))
    assert out.returncode != 0 and "DNS-1035" in out.stderr
    rayjob = one(render(helm_bin, release="a-release-name-that-is-far-too-long-for-kuberay"), "RayJob")
    assert len(rayjob["metadata"]["name"]) <= 40 and kuberay_admission_errors(rayjob) == []


def notes(helm_bin: str, *args: str) -> str:
    out = helm(helm_bin, "install", "r", str(CHART), "--dry-run=client", "--namespace", "ml", *args)
    assert out.returncode == 0, out.stderr
    return out.stdout.split("NOTES:", 1)[1]


def test_notes_list_the_commands_for_the_values_in_use(helm_bin: str) -> None:
    text = notes(helm_bin)
    assert "kubectl logs -n ml -f job/r-dppo" in text
    assert "kubectl port-forward -n ml svc/r-dppo-metrics 8000:8000" in text
    assert "helm test r -n ml" in text
    assert "RAY_AUTH_TOKEN" in text and "--set monitoring.dashboard=true" in text
    uid = json.loads((CHART / "dashboards" / "dppo.json").read_text())["uid"]
    text = notes(helm_bin, "-f", str(VALUES_DIR / "monitoring.yaml"), "-f", str(VALUES_DIR / "persistence.yaml"),
                 "-f", str(VALUES_DIR / "auth-off.yaml"))
    assert f"http://127.0.0.1:3000/d/{uid}" in text and "svc/prom-grafana" in text
    assert "resumes from the newest one" in text
    assert "RAY_AUTH_TOKEN" not in text


def test_notes_say_what_the_network_policy_allows(helm_bin: str) -> None:
    text = notes(helm_bin)
    assert "any address on port 8000 (`dppo status`" in text
    assert "egress goes to the run's own pods and DNS only." in text
    text = notes(helm_bin, "-f", str(VALUES_DIR / "runtime-env.yaml"), "--set-json", "networkPolicy.statusPeers=[]")
    assert "r-dppo-downloads opens\nTCP 443 to any address" in text and "use the port-forward in step 3" in text
    assert "Network:" not in notes(helm_bin, "--set", "networkPolicy.enabled=false")


def test_notes_on_autoscaling(helm_bin: str) -> None:
    assert "Autoscaling is on" not in notes(helm_bin)
    text = notes(helm_bin, "-f", str(VALUES_DIR / "autoscaling.yaml"))
    assert "6 actors on 3 worker pod(s) at the start, autoscaled between 1 and 4" in text
    assert "-c autoscaler" in text and "after 120 s" in text
    assert "NetworkPolicy r-dppo-apiserver" in text and "443, 6443" in text and "never get a pod" not in text
    text = notes(helm_bin, "-f", str(VALUES_DIR / "autoscaling.yaml"), "--set", "autoscaling.maxReplicas=2")
    assert "autoscaling.maxReplicas=2 holds 4 of the 6 actors" in text


def test_notes_on_retries_and_submitter_logs(helm_bin: str) -> None:
    """KubeRay v1.7 deletes a failed attempt's cluster and submitter Job at once (no TTL): NOTES says so,
    points at train.log on the claim, and lists every submitter pod's log (the Job retries up to twice)."""
    assert "kubectl logs -n ml -l job-name=r-dppo --prefix --tail=-1" in notes(helm_bin)
    assert "Retries:" not in notes(helm_bin)
    text = notes(helm_bin, "-f", str(VALUES_DIR / "persistence.yaml"))
    assert "/data/r-dppo/train.log" in text and "deletes a failed attempt's Ray cluster" in text
    assert "nothing of the failed attempt is kept" in notes(helm_bin, "--set", "job.backoffLimit=1")


def test_notes_say_first_that_the_run_directory_dies_with_the_pod(helm_bin: str) -> None:
    """Without persistence the run directory is in the head pod's /tmp: NOTES says it before the commands, and
    warns when retries are on (a retry then starts from scratch); with persistence neither line is there."""
    text = notes(helm_bin)
    lost = text.index("Not kept: the run directory")
    assert lost < text.index("1. Job state") and "/tmp/dppo/r-dppo" in text[lost:text.index("1. Job state")]
    assert "WARNING" not in text
    text = notes(helm_bin, "--set", "job.backoffLimit=2")
    assert text.index("WARNING: job.backoffLimit=2 retries the run without persistence.enabled") < text.index(
        "Not kept") < text.index("1. Job state")
    text = notes(helm_bin, "-f", str(VALUES_DIR / "persistence.yaml"))
    assert "Not kept" not in text and "WARNING" not in text


def test_a_typo_in_the_env_id_is_refused_at_install_with_the_ids_that_start_like_it(helm_bin: str) -> None:
    out = helm(helm_bin, "template", "r", str(CHART), "--set", "env=CartPol-v1")
    assert out.returncode != 0
    line = next(x for x in out.stderr.splitlines() if x.startswith("Error:"))
    assert "env=CartPol-v1 is not an id the chart knows" in line
    assert "Did you mean CartPole-v0, CartPole-v1, phys2d/CartPole-v0, phys2d/CartPole-v1?" in line
    assert "package:EnvId-v0" in line
    out = helm(helm_bin, "template", "r", str(CHART), "--set", "env=LunarLander-v2")  # gymnasium 1.x has v3
    assert out.returncode != 0 and "Did you mean LunarLander-v3, LunarLanderContinuous-v3?" in out.stderr


@pytest.mark.parametrize("env_id", ["CartPole-v1", "ALE/Breakout-v5", "dppo/CueCorridor-v0", "Hopper-v5",
                                    "mysim.envs:Warehouse-v0", "minigrid:MiniGrid-Empty-5x5-v0"])
def test_registered_ids_and_the_package_form_render(helm_bin: str, env_id: str) -> None:
    config = training_config(render(helm_bin, "--set", f"env={env_id}"))
    assert config["env"]["id"] == env_id


def test_the_registered_ids_are_what_dppo_makes_by_id_alone() -> None:
    """registered-envs.json holds every preset's gymnasium id and dppo's own, none a package adds only when imported
    by name (minigrid, ale-py's ids outside ALE/), and none that gymnasium registers only to raise. The PettingZoo
    presets (tictactoe_v3, connect_four_v3) are modules, left to the run like package:EnvId."""
    known = set(json.loads((CHART / "registered-envs.json").read_text())["ids"])
    presets = {yaml.safe_load(p.read_text())["env"]["id"] for p in (REPO / "dppo" / "presets").glob("*.yaml")}
    modules = {env_id for env_id in presets if PETTINGZOO_MODULE.fullmatch(env_id)}
    assert modules == {"pettingzoo.classic.tictactoe_v3", "pettingzoo.classic.connect_four_v3"}
    assert presets - modules <= known and not modules & known
    assert {"dppo/CueCorridor-v0", "dppo/Counter-v0", "ALE/Pong-v5", "FrozenLake-v1"} <= known
    assert not {"MiniGrid-Empty-5x5-v0", "PongNoFrameskip-v4", "Pong-v4", "Hopper-v3", "GymV26Environment-v0"} & known


def test_the_id_list_of_other_gymnasium_versions_is_kept_and_dppo_s_own_renewed() -> None:
    generator = load_module(REPO / "helm" / "values_schema.py")
    older = {"generated_by": "helm/values_schema.py", "gymnasium": "0.0.1", "ale-py": "0.0.1",
             "ids": ["OldEnv-v0", "dppo/Gone-v0"]}
    kept = json.loads(generator.render_envs(older))
    assert kept["gymnasium"] == "0.0.1" and "OldEnv-v0" in kept["ids"] and "dppo/Gone-v0" not in kept["ids"]
    assert "dppo/CueCorridor-v0" in kept["ids"] and "CartPole-v1" not in kept["ids"]
    fresh = json.loads(generator.render_envs(None))
    assert "CartPole-v1" in fresh["ids"] and "OldEnv-v0" not in fresh["ids"]


def test_image_tag_matches_the_chart() -> None:
    """`make image` builds the tag the chart pulls by default, and the docs say that tag."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    tag = re.search(r"^IMAGE_TAG \?= (\S+)", (REPO / "Makefile").read_text(), re.M)
    assert tag and tag.group(1) == chart["appVersion"]
    assert "dppo:latest" not in (REPO / "docs" / "kubernetes.md").read_text()


def test_packaged_chart_carries_presets_and_dashboard(helm_bin: str, tmp_path: Path) -> None:
    """presets.yaml (dppo's presets) and the dashboard are files of the chart: `helm package` carries them."""
    out = helm(helm_bin, "package", str(CHART), "--destination", str(tmp_path))
    assert out.returncode == 0, out.stderr
    (package,) = tmp_path.glob("dppo-*.tgz")
    objects = render(helm_bin, "--set", "env=LunarLander-v3", "--set", "monitoring.dashboard=true")
    packaged = subprocess.run([helm_bin, "template", "r", str(package), "--namespace", "ml", "--set",
                               "env=LunarLander-v3", "--set", "monitoring.dashboard=true"],
                              capture_output=True, text=True, timeout=120, check=True)
    assert [d for d in yaml.safe_load_all(packaged.stdout) if d] == objects


def test_the_config_schema_is_dppo_s_own() -> None:
    """values.schema.json's `config` is generated from dppo's config (helm/values_schema.py), never hand-written."""
    generator = load_module(REPO / "helm" / "values_schema.py")
    assert generator.main(["--check"]) == 0, "run: python helm/values_schema.py"


@pytest.mark.parametrize("args", [
    ["--set", "config.ppo.learning_rate=3e-4", "--set", "config.run.torch_threads=2"],  # a renamed key still works
    ["--set-string", "config.run.total_steps=2e6"],  # as YAML 1.1 reads 2e6, and dppo accepts it
    ["--set", "config.env.wrappers[0]=FlattenObservation", "--set", "config.env.wrappers[1].name=TimeLimit",
     "--set", "config.env.wrappers[1].kwargs.max_episode_steps=9"],
])
def test_config_values_dppo_accepts_render_and_validate(helm_bin: str, args: list[str]) -> None:
    config = training_config(render(helm_bin, *args))
    validate_config(config)


@pytest.mark.parametrize("rule, other", [("num_minibatches", "minibatch_size"), ("minibatch_size", "num_minibatches")])
def test_one_batch_rule_in_config_replaces_the_preset_s_other(helm_bin: str, rule: str, other: str) -> None:
    """config.ppo.num_minibatches over a preset that sizes its minibatches (and the reverse) renders one rule, as
    `dppo train --set` does; both would be refused by dppo."""
    config = training_config(render(helm_bin, "--set", "env=ALE/Breakout-v5", "--set", f"config.ppo.{rule}=4"))
    assert config["ppo"][rule] == 4 and other not in config["ppo"]
    assert validate_config(config).minibatch_size > 0


def test_an_entry_point_beside_the_env_id_is_refused_at_render_time(helm_bin: str) -> None:
    out = helm(helm_bin, "template", "r", str(CHART), "--set", "config.env.entry_point=mysim.envs:Warehouse")
    assert out.returncode != 0
    assert "config.env.entry_point=mysim.envs:Warehouse and env=CartPole-v1 are both set" in out.stderr
    objects = render(helm_bin, "--set", "env=null", "--set", "config.env.entry_point=mysim.envs:Warehouse")
    config = training_config(objects)
    assert config["env"]["id"] is None and config["env"]["entry_point"] == "mysim.envs:Warehouse"
    assert validate_config(config).env.name == "mysim.envs:Warehouse"
    rayjob = next(o for o in objects if o["kind"] == "RayJob")
    assert rayjob["metadata"]["annotations"]["dppo.io/env"] == "mysim.envs:Warehouse"
    out = helm(helm_bin, "template", "r", str(CHART), "--set", "env=null")
    assert out.returncode != 0 and "env is empty and config.env.entry_point is not set" in out.stderr


def rules_by_condition(spec: dict[str, Any]) -> dict[str, dict[str, int]]:
    """deletionRules as {"jobStatus=FAILED": {"DeleteWorkers": 0, "DeleteCluster": 3600}, ...}."""
    found: dict[str, dict[str, int]] = {}
    for rule in spec["deletionStrategy"]["deletionRules"]:
        condition = dict(rule["condition"])
        ttl = condition.pop("ttlSeconds")
        ((key, value),) = condition.items()
        found.setdefault(f"{key}={value}", {})[rule["policy"]] = ttl
    return found


def test_cleanup_frees_the_workers_at_once_and_keeps_the_head_on_failure(helm_bin: str) -> None:
    """KubeRay >= 1.6: a success deletes the cluster after ttlSecondsAfterFinished; a failure (the Ray job FAILED, or
    the deployment Failed without it: a lost head, a deadline) deletes the workers at once and the head after
    keepHeadOnFailureSeconds."""
    spec = one(render(helm_bin, "--set", "job.keepHeadOnFailureSeconds=7200"), "RayJob")["spec"]
    failure = {"DeleteWorkers": 0, "DeleteCluster": 7200}
    assert rules_by_condition(spec) == {"jobStatus=SUCCEEDED": {"DeleteCluster": 600}, "jobStatus=FAILED": failure,
                                        "jobDeploymentStatus=Failed": failure}
    # Autoscaled workers cannot be deleted by KubeRay (it would refuse the RayJob): the autoscaler removes them.
    spec = one(render(helm_bin, "-f", str(VALUES_DIR / "autoscaling.yaml")), "RayJob")["spec"]
    assert all("DeleteWorkers" not in policies for policies in rules_by_condition(spec).values())
    assert kuberay_admission_errors(one(render(helm_bin, "-f", str(VALUES_DIR / "autoscaling.yaml")), "RayJob")) == []
    # Keep everything: no deletion at all.
    spec = one(render(helm_bin, "--set", "job.shutdownAfterJobFinishes=false"), "RayJob")["spec"]
    assert spec["shutdownAfterJobFinishes"] is False and "deletionStrategy" not in spec
    # Kueue suspends the RayJob, which KubeRay allows only with shutdownAfterJobFinishes: the old fields.
    spec = one(render(helm_bin, "-f", str(VALUES_DIR / "kueue.yaml")), "RayJob")["spec"]
    assert spec["suspend"] is True and spec["shutdownAfterJobFinishes"] is True and "deletionStrategy" not in spec
    # KubeRay would refuse these: the port of its rules sees them.
    broken = one(render(helm_bin), "RayJob")
    broken["spec"]["shutdownAfterJobFinishes"] = True
    assert "shutdownAfterJobFinishes and deletionRules are mutually exclusive" in kuberay_admission_errors(broken)
    broken["spec"]["shutdownAfterJobFinishes"] = False
    broken["spec"]["deletionStrategy"]["deletionRules"][1]["condition"]["ttlSeconds"] = 99999
    assert any("TTLs must grow" in e for e in kuberay_admission_errors(broken))


@pytest.mark.parametrize(("admission", "queue", "labels"), [
    ("kueue", "team-a", {"kueue.x-k8s.io/queue-name": "team-a"}),
    ("volcano", "ml", {"volcano.sh/queue-name": "ml", "ray.io/priority-class-name": "low"}),
    ("volcano", "", {"ray.io/priority-class-name": "low"}),
    ("yunikorn", "root.ml", {"ray.io/gang-scheduling-enabled": "true", "yunikorn.apache.org/app-id": "r-dppo",
                             "yunikorn.apache.org/queue": "root.ml"}),
    ("scheduler-plugins", "", {"ray.io/gang-scheduling-enabled": "true"}),
    ("none", "ignored", {}),
])
def test_one_admission_labels_the_rayjob_and_every_pod_gets_the_priority(
        helm_bin: str, admission: str, queue: str, labels: dict[str, str]) -> None:
    """The labels KubeRay v1.7.0's batch schedulers (batchscheduler/*) and Kueue's RayJob integration read; KubeRay
    copies the RayJob's labels to its RayCluster. Only the chosen admission's labels; priorityClassName on every pod
    the chart creates (the helm test pod too)."""
    objects = render(helm_bin, "--set", f"scheduling.admission={admission}", "--set", f"scheduling.queue={queue}",
                     "--set", "scheduling.priorityClassName=low", "--set", "learners.replicas=2")
    rayjob = one(objects, "RayJob")
    scheduling_keys = ("kueue.x-k8s.io/", "volcano.sh/", "yunikorn.apache.org/", "ray.io/")
    assert {k: v for k, v in rayjob["metadata"]["labels"].items() if k.startswith(scheduling_keys)} == labels
    assert rayjob["spec"].get("suspend", False) is (admission == "kueue")
    pods = containers(objects)
    assert len(pods) == 5 and all(spec["priorityClassName"] == "low" for spec, _ in pods)
    for obj in objects:
        validate_object(obj)
    assert kuberay_admission_errors(rayjob) == []
    assert "priorityClassName" not in str(render(helm_bin))


@pytest.mark.parametrize(("args", "message"), [
    (["--set", "scheduling.admission=kueue"], "needs scheduling.queue: the name of a LocalQueue"),
    (["-f", str(VALUES_DIR / "kueue.yaml"), "--set", "autoscaling.enabled=true"], "set autoscaling.enabled=false"),
    (["-f", str(VALUES_DIR / "kueue.yaml"), "--set", "job.shutdownAfterJobFinishes=false"],
     "set job.shutdownAfterJobFinishes=true"),
    (["--set", "autoscaling.enabled=true", "--set", "head.restartPolicy=Always"], "set head.restartPolicy=Never"),
])
def test_admission_values_kueue_or_kuberay_would_refuse_fail_at_install(helm_bin: str, args: list[str],
                                                                        message: str) -> None:
    out = helm(helm_bin, "template", "r", str(CHART), *args)
    assert out.returncode != 0 and message in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()[0]) < 400


def test_a_lost_head_fails_the_run_at_once(helm_bin: str) -> None:
    """The head pod does not restart (a restarted head's Ray has lost the job: the RayJob would stay Running),
    KubeRay does not re-create it, and the submitter does not retry into a head that is gone: the RayJob fails
    (SubmissionFailed) and job.backoffLimit retries it. test_chart_emulation runs it."""
    rayjob = one(render(helm_bin, "-f", str(VALUES_DIR / "persistence.yaml")), "RayJob")
    assert rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["restartPolicy"] == "Never"
    assert rayjob["metadata"]["annotations"]["ray.io/disable-provisioned-head-restart"] == "true"
    assert rayjob["metadata"]["annotations"]["dppo.io/resume"] == "newest-checkpoint"
    assert rayjob["spec"]["submitterConfig"] == {"backoffLimit": 0}
    kept = one(render(helm_bin, "--set", "head.restartPolicy=Always"), "RayJob")
    assert kept["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["restartPolicy"] == "Always"
    assert "ray.io/disable-provisioned-head-restart" not in kept["metadata"]["annotations"]
    assert kept["metadata"]["annotations"]["dppo.io/resume"] == "none"


def test_spot_example_puts_actors_on_spot_and_budgets_only_the_head(helm_bin: str) -> None:
    """tests/deploy/values/spot.yaml: actor pods select and tolerate spot nodes with a grace period within the
    reclaim notice; the head (driver and update) is on GPU nodes with a PodDisruptionBudget; no budget selects the
    actor pods (losing them costs seconds; a budget would only block drains)."""
    objects = render(helm_bin, "-f", str(VALUES_DIR / "spot.yaml"))
    cluster = one(objects, "RayJob")["spec"]["rayClusterSpec"]
    worker = cluster["workerGroupSpecs"][0]["template"]["spec"]
    head = cluster["headGroupSpec"]["template"]["spec"]
    assert worker["nodeSelector"] == {"cloud.google.com/gke-spot": "true"}
    assert worker["tolerations"][0]["key"] == "cloud.google.com/gke-spot"
    assert worker["terminationGracePeriodSeconds"] == 25
    assert "cloud.google.com/gke-spot" not in head["nodeSelector"] and head["nodeSelector"]["nvidia.com/gpu.present"]
    (budget,) = by_kind(objects, "PodDisruptionBudget")
    assert budget["spec"]["maxUnavailable"] == 0
    assert budget["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "head"
    assert training_config(objects)["faults"]["min_actors"] == 4
    learners = render(helm_bin, "-f", str(VALUES_DIR / "spot.yaml"), "--set", "learners.replicas=2",
                      "--set", "config.ppo.minibatch_size=512")
    assert sorted(b["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]
                  for b in by_kind(learners, "PodDisruptionBudget")) == ["head", "learner"]
    assert not by_kind(render(helm_bin), "PodDisruptionBudget")


MISSPELT = [
    (["--set", "actor=8"], "at '/actor': value must be 'unknown key: did you mean actors?'"),
    (["--set", "Actors=8"], "at '/Actors': value must be 'unknown key: did you mean actors?'"),
    (["--set", "job.backofLimit=2"], "at '/job/backofLimit': value must be 'unknown key: did you mean "
                                     "job.backoffLimit?'"),
    (["--set", "persistance.enabled=true"], "at '/persistance': value must be 'unknown key: did you mean "
                                            "persistence?'"),
    (["--set", "monitoring.relase=prom"], "'unknown key: did you mean monitoring.release?'"),
    (["--set", "autoscaling.maxReplica=4"], "'unknown key: did you mean autoscaling.maxReplicas?'"),
    (["--set", "head.resources.limit.memory=1Gi"], "at '/head/resources/limit': value must be 'unknown key: did you "
                                                   "mean limits?'"),
    (["--set", "scheduling.admision=kueue"], "'unknown key: did you mean scheduling.admission?'"),
]


def test_a_misspelt_value_names_the_key_meant(helm_bin: str) -> None:
    """As `dppo train --set` does: a key near a known one is refused in one line naming that key, by the schema
    itself (so `helm lint` and every tool that reads the schema refuse it too; tests/deploy/test_chart_refusals.py
    has the keys cut short or run on). Each command is given every misspelling at once: the schema's errors are
    all listed."""
    args = [arg for misspelt, _ in MISSPELT for arg in misspelt]
    for command in ("template", "install", "lint"):
        out = helm(helm_bin, command, *(["r"] if command != "lint" else []), str(CHART),
                   *(["--dry-run=client"] if command != "lint" else ["--strict"]), *args)
        assert out.returncode != 0, out.stdout + out.stderr
        assert [m for _, m in MISSPELT if m not in out.stdout + out.stderr] == [], out.stdout + out.stderr


def test_misspellings_are_near_a_key_and_never_another() -> None:
    generator = load_module(REPO / "helm" / "values_schema.py")
    patterns = [re.compile(p) for p in generator.misspellings("actors", ["actors", "actorsPerPod"])]

    def near(name: str) -> bool:
        return any(p.match(name) for p in patterns)

    assert all(near(k) for k in ("actor", "Actors", "actros", "actorz", "actorss", "ACTORS", "acto", "aCTORS", "actrs",
                                 "actorS", "Actor"))
    assert not any(near(k) for k in ("actors", "act", "actorsPerPod", "bogus", "factorss", "actorsxy", "atcros"))
    validator = checked_validator(CHART / "values.schema.json")
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    validator.validate(values)  # no key is taken for a misspelling of another
    for typo in ("actor", "bogus"):
        with pytest.raises(jsonschema.ValidationError):
            validator.validate({**values, typo: 8})


def test_notes_say_who_admits_the_run_and_what_is_kept_when_it_ends(helm_bin: str) -> None:
    text = notes(helm_bin)
    assert "after a success the cluster is deleted 600 s later" in text
    assert "the workers are deleted at once and the head pod stays 3600 s" in text
    text = notes(helm_bin, "-f", str(VALUES_DIR / "kueue.yaml"))
    assert "Queued by Kueue in LocalQueue team-a" in text and "deleted 600 s later, success or failure" in text
    text = notes(helm_bin, "-f", str(VALUES_DIR / "volcano.yaml"))
    assert "Gang-scheduled by volcano in queue ml-training" in text and "batchScheduler.name=volcano" in text
