"""``dppo status``: the dppo runs on a Kubernetes cluster, one line each (``-n``, ``-A``, ``--kubeconfig``,
``--context``); local run directories otherwise (:mod:`dppo.commands.status_local`).

Everything goes through the Kubernetes API with the user's kubeconfig (no port-forward): the RayJobs the
Helm chart labels ``app.kubernetes.io/name=dppo``, their job and cluster state (with KubeRay's reason for a failure and,
for a retried run, which attempt this is), and the run's latest numbers read from its driver's ``/metrics`` through the
API server's service proxy, among them the iteration a retried attempt resumed from. The ``kubernetes`` package is
imported only when the command runs, so the CLI starts fast.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from dppo.errors import UsageError

LABEL_SELECTOR = "app.kubernetes.io/name=dppo"
GROUP, VERSION, PLURAL = "ray.io", "v1", "rayjobs"
# Annotations the chart puts on the RayJob.
ACTORS_ANNOTATION = "dppo.io/actors"
ENV_ANNOTATION = "dppo.io/env"
SERVICE_ANNOTATION = "dppo.io/metrics-service"
PORT_ANNOTATION = "dppo.io/metrics-port"
RESUME_ANNOTATION = "dppo.io/resume"  # "newest-checkpoint": a retry resumes (persistence); "none": it starts over
# Deployment states in which the driver may be serving metrics (it lingers after training).
LIVE_STATES = {"Running"}
# Deployment states after which no attempt follows.
FINAL_STATES = {"Complete", "Failed"}


@dataclass(frozen=True)
class RunStatus:
    """One dppo RayJob as `dppo status` shows it; None where the cluster did not say."""

    namespace: str
    name: str
    env: str | None
    job_status: str | None
    deployment_status: str | None
    workers_ready: int | None
    workers_desired: int | None
    actors_desired: int | None
    actors_alive: int | None
    actors_pending: int | None
    env_steps: int | None
    episode_return_mean: float | None
    reason: str | None = None  # KubeRay's reason for a failure: AppFailed, SubmissionFailed (a lost head), ...
    attempt: int | None = None  # this attempt of the run (1 + the retries so far)
    attempts: int | None = None  # attempts allowed: 1 + the RayJob's backoffLimit
    resumed_from_iteration: int | None = None  # the checkpoint's iteration this attempt's driver resumed from


def register(subparsers: Any) -> None:
    """Add the ``status`` subcommand to the CLI's subparsers."""
    parser = subparsers.add_parser(
        "status",
        help="list dppo runs: local run directories, or RayJobs on a Kubernetes cluster (-n)",
        description="Local runs (RUN_DIR ..., default every run under ./runs): running or ended, iteration, env "
        "steps, return, env failures, actor restarts, hangs, newest checkpoint and why each ended. With -n, -A, "
        "--kubeconfig or --context: the dppo RayJobs in a namespace: job state, worker pods and actors ready, and the "
        "run's latest env steps and mean return (its driver's metrics, read through the API server's service proxy).",
    )
    parser.add_argument("run_dirs", nargs="*", metavar="RUN_DIR", help="local run directories (default: ./runs/*)")
    parser.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig context's, else default)")
    parser.add_argument("-A", "--all-namespaces", action="store_true", help="list runs in every namespace")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    parser.add_argument("--context", help="kubeconfig context (default: the current one)")
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table", help="output format")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The ``status`` command: print the runs, return the exit code."""
    kubernetes = args.namespace or args.all_namespaces or args.kubeconfig or args.context
    if kubernetes and args.run_dirs:
        raise UsageError("dppo status takes run dirs (local runs) or -n/-A/--kubeconfig/--context (runs on "
                         "Kubernetes), not both; run it once for each")
    if not kubernetes:
        from dppo.commands.status_local import show

        return show(args.run_dirs, args.output)
    api_client, default_namespace = connect(args.kubeconfig, args.context)
    namespace = None if args.all_namespaces else (args.namespace or default_namespace)
    statuses = collect(api_client, namespace)
    if args.output == "json":
        print(json.dumps([asdict(s) for s in statuses], indent=2))
    elif not statuses:
        where = "any namespace" if namespace is None else f"namespace {namespace!r}"
        print(f"no dppo runs in {where}")
    else:
        print(table(statuses, show_namespace=namespace is None))
    return 0


def connect(kubeconfig: str | None, context: str | None) -> tuple[Any, str]:
    """An API client and the default namespace, from a kubeconfig or, inside a pod, the service account."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    try:
        api_client = config.new_client_from_config(config_file=kubeconfig, context=context)
        contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)
        if context is not None:
            active = next(c for c in contexts if c["name"] == context)
        return api_client, active.get("context", {}).get("namespace") or "default"
    except (ConfigException, OSError) as err:
        if kubeconfig is None and context is None:
            try:
                config.load_incluster_config()
                with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as f:
                    return client.ApiClient(), f.read().strip() or "default"
            except (ConfigException, OSError):
                pass
        raise UsageError(f"no usable Kubernetes config ({err}); pass --kubeconfig or set KUBECONFIG") from None


def collect(api_client: Any, namespace: str | None) -> list[RunStatus]:
    """Every dppo RayJob in ``namespace`` (None: all namespaces), each with its driver's metrics when live."""
    from kubernetes import client

    objects = client.CustomObjectsApi(api_client)
    jobs = _call(lambda: objects.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL,
                                                               label_selector=LABEL_SELECTOR)
                 if namespace else objects.list_cluster_custom_object(GROUP, VERSION, PLURAL,
                                                                      label_selector=LABEL_SELECTOR),
                 api_client)
    core = client.CoreV1Api(api_client)
    return [status_of(job, core) for job in sorted(jobs.get("items", []), key=_sort_key)]


def status_of(job: dict[str, Any], core: Any) -> RunStatus:
    meta = job.get("metadata", {})
    annotations = meta.get("annotations") or {}
    status = job.get("status") or {}
    cluster = status.get("rayClusterStatus") or {}
    metrics: dict[str, float] = {}
    service, port = annotations.get(SERVICE_ANNOTATION), annotations.get(PORT_ANNOTATION)
    if status.get("jobDeploymentStatus") in LIVE_STATES and service and port:
        metrics = scrape(core, meta.get("namespace", "default"), service, port)
    return RunStatus(
        namespace=meta.get("namespace", "default"),
        name=meta.get("name", "?"),
        env=annotations.get(ENV_ANNOTATION),
        job_status=status.get("jobStatus") or None,
        deployment_status=status.get("jobDeploymentStatus") or None,
        workers_ready=_int(cluster.get("readyWorkerReplicas")),
        workers_desired=_int(cluster.get("desiredWorkerReplicas")),
        actors_desired=_int(annotations.get(ACTORS_ANNOTATION)),
        actors_alive=_int(metrics.get("dppo_actors_alive")),
        actors_pending=_int(metrics.get("dppo_actors_pending")),
        env_steps=_int(metrics.get("dppo_env_steps_total")),
        episode_return_mean=metrics.get("dppo_episode_return_mean"),
        reason=status.get("reason") or None,
        attempt=attempt(status),
        attempts=1 + (_int((job.get("spec") or {}).get("backoffLimit")) or 0),
        resumed_from_iteration=resumed_from(metrics),
    )


def attempt(status: dict[str, Any]) -> int:
    """Which attempt of the run this is: KubeRay counts the finished ones (``failed``, ``succeeded``); a run not
    finished is in the next one."""
    done = (_int(status.get("failed")) or 0) + (_int(status.get("succeeded")) or 0)
    return max(1, done if status.get("jobDeploymentStatus") in FINAL_STATES else done + 1)


def resumed_from(metrics: dict[str, float]) -> int | None:
    """The iteration a resumed driver started from: its ``dppo_iteration`` gauge continues the checkpoint's count,
    while ``dppo_iteration_seconds`` counts only the iterations this driver ran. None: not resumed, or not read."""
    iteration, ran = metrics.get("dppo_iteration"), metrics.get("dppo_iteration_seconds_count")
    if iteration is None or ran is None or iteration - ran < 1:
        return None
    return int(iteration - ran)


def scrape(core: Any, namespace: str, service: str, port: str) -> dict[str, float]:
    """The driver's unlabelled samples, via GET /api/v1/namespaces/NS/services/SVC:PORT/proxy/metrics.

    Empty when the endpoint does not answer (cluster starting or gone, or a NetworkPolicy that does not
    admit the API server: see docs/kubernetes.md)."""
    from kubernetes.client.exceptions import ApiException
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = core.connect_get_namespaced_service_proxy_with_path(f"{service}:{port}", namespace, "metrics")
    except (ApiException, OSError):
        return {}
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError:
        return {}
    return {s.name: s.value for family in families for s in family.samples if not s.labels}


def table(statuses: list[RunStatus], show_namespace: bool) -> str:
    """Aligned columns, kubectl style. ATTEMPT and RESUMED appear once a listed run has been retried or resumed;
    a failure's reason follows its deployment state."""
    header = ["NAME", "ENV", "JOB", "DEPLOYMENT", "WORKERS", "ACTORS", "PENDING", "ENV STEPS", "RETURN"]
    rows = [[s.name, s.env or "-", s.job_status or "-",
             (s.deployment_status or "-") + (f" ({s.reason})" if s.reason else ""),
             _ratio(s.workers_ready, s.workers_desired), _ratio(s.actors_alive, s.actors_desired),
             "-" if s.actors_pending is None else str(s.actors_pending),
             "-" if s.env_steps is None else f"{s.env_steps:,}",
             "-" if s.episode_return_mean is None else f"{s.episode_return_mean:.1f}"] for s in statuses]
    if any((s.attempt or 1) > 1 or s.resumed_from_iteration for s in statuses):
        header += ["ATTEMPT", "RESUMED"]
        for row, s in zip(rows, statuses, strict=True):
            row += [_ratio(s.attempt, s.attempts),
                    "-" if s.resumed_from_iteration is None else f"iter {s.resumed_from_iteration}"]
    if show_namespace:
        header.insert(0, "NAMESPACE")
        for row, s in zip(rows, statuses, strict=True):
            row.insert(0, s.namespace)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [header, *rows])


def _call(request: Callable[[], dict[str, Any]], api_client: Any) -> dict[str, Any]:
    """Run an API request; turn the ways it fails into one line for the user."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    host = api_client.configuration.host
    try:
        return request()
    except ApiException as err:
        if err.status == 404:
            raise UsageError(f"the API server at {host} does not serve {GROUP}/{VERSION} {PLURAL}; "
                             "install the KubeRay operator (docs/kubernetes.md)") from None
        if err.status in (401, 403):
            raise UsageError(f"the API server at {host} refused to list {PLURAL} ({err.status} {err.reason}); "
                             "check your credentials and RBAC") from None
        raise UsageError(f"listing {PLURAL} at {host} failed: {err.status} {err.reason}") from None
    except (HTTPError, OSError) as err:
        raise UsageError(f"cannot reach the Kubernetes API server at {host}: {err}") from None


def _sort_key(job: dict[str, Any]) -> tuple[str, str]:
    meta = job.get("metadata", {})
    return meta.get("namespace", ""), meta.get("name", "")


def _int(value: Any) -> int | None:
    try:
        return None if value is None else int(float(value))
    except (TypeError, ValueError):
        return None


def _ratio(ready: int | None, desired: int | None) -> str:
    if ready is None and desired is None:
        return "-"
    return f"{'-' if ready is None else ready}/{'-' if desired is None else desired}"
