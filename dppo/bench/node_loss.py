"""`dppo bench node-loss`: a worker node lost in the middle of a run, back after a while or never.

A cluster as the chart builds it, of ``ray start`` nodes on this machine: a head with 0 CPUs (no actor lands
there), worker nodes with CPUs for the actors, Ray token auth on. `dppo train` joins it, as the RayJob's
entrypoint on the head does. After some iterations one worker node is killed whole (raylet, agents, actor
processes: its machine went away) and, unless ``--never-back``, started again ``--down-s`` later as a new node
(a rescheduled pod). Every progress line is timestamped as it appears. With a Prometheus binary at hand, the
run's metrics are scraped every second and the dashboard's degraded-state queries are read during the outage.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dppo.bench.common import Row, add_common_args, machine
from dppo.bench.docs import emit
from dppo.bench.local_cluster import LocalCluster
from dppo.bench.prometheus import Prometheus, prometheus_binary
from dppo.cli_args import positive
from dppo.distributed.ports import free_ports
from dppo.errors import UsageError

SCRAPES_S = 2.0  # two of Prometheus's scrapes (one a second) after the driver reported a round short of actors

# The dashboard's degraded-state panels (helm/dashboard.py), as Grafana sends them for one run.
DEGRADED_QUERIES = {
    "actors missing": "dppo_actors_desired - dppo_actors_alive",
    "actors pending": "dppo_actors_pending",
    "actors lost with node": 'sum(dppo_actor_losses_total{cause="node"})',
    "actor crashes": 'sum(dppo_actor_losses_total{cause="crash"})',
}


@dataclass
class Scenario:
    """The cluster and the run: W workers of C CPUs, N actors, the node killed after K iterations for D s."""

    workers: int = 2
    cpus_per_worker: int = 2
    actors: int = 4
    envs_per_actor: int = 4
    segment_length: int = 64
    total_steps: int = 400_000
    kill_after: int = 10
    down_s: float | None = 40.0  # None: the node never comes back
    env_latency_ms: float = 1.0  # each env step takes this long, CPU released: actor-bound, as a simulator is
    read_metrics_after_s: float = 8.0  # when into the outage the degraded-state queries are read, at the earliest
    env: str = "CartPole-v1"
    timeout_s: float = 900.0


@dataclass
class Timeline:
    """What was seen, on this process's monotonic clock."""

    records: list[tuple[float, dict[str, Any]]] = field(default_factory=list)  # (seen at, progress record)
    killed_at: float = 0.0
    back_at: float | None = None
    node_starts: int = 0  # tries of the node's start once it comes back (a loaded machine can need more than one)
    degraded: dict[str, float | None] = field(default_factory=dict)

    def first_short_round(self, actors: int) -> float | None:
        """When the first round after the kill with fewer than ``actors`` segments was seen (None: not yet)."""
        return next((t for t, r in self.records if self.killed_at and t > self.killed_at and r["segments"] < actors),
                    None)


def progress_lines(path: Path, seen: int) -> list[dict[str, Any]]:
    """Whole progress lines past the first ``seen`` (a line still being written is left for next time)."""
    if not path.exists():
        return []
    lines = path.read_text().split("\n")[:-1]
    return [json.loads(line) for line in lines[seen:]]


def run_scenario(scenario: Scenario, out_dir: Path) -> tuple[Timeline, dict[str, Any], str]:
    """Run it; the timeline, summary.json and the driver's stderr (dppo train's)."""
    token = secrets.token_hex(16)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    cluster = LocalCluster(env)
    prometheus = None
    timeline = Timeline()
    victim = f"worker-{scenario.workers}"
    try:
        address = cluster.start_head(cpus=0)
        for i in range(1, scenario.workers + 1):
            cluster.start_worker(f"worker-{i}", scenario.cpus_per_worker)
        metrics_port = free_ports(1)[0]
        run_dir = out_dir / "run"
        cmd = [sys.executable, "-m", "dppo", "train", "--address", address, "--env", scenario.env, "--run-dir",
               str(run_dir), "--actors", str(scenario.actors), "--envs-per-actor", str(scenario.envs_per_actor),
               "--segment-length", str(scenario.segment_length), "--total-steps", str(scenario.total_steps),
               "--metrics-port", str(metrics_port), "--set", "metrics.host=127.0.0.1", "--set",
               "run.target_return=null", "--set", f"env.latency_ms={scenario.env_latency_ms}", "--no-tensorboard"]
        binary = prometheus_binary()
        if binary:
            (out_dir / "prometheus").mkdir(parents=True, exist_ok=True)
            prometheus = Prometheus(binary, out_dir / "prometheus", metrics_port)
        with open(out_dir / "train.err", "w") as err:
            driver = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
            follow(scenario, cluster, driver, run_dir, victim, timeline, prometheus)
        summary = json.loads((run_dir / "summary.json").read_text()) if driver.returncode == 0 else {}
        if driver.returncode != 0:
            raise RuntimeError(f"dppo train exited {driver.returncode}: see {out_dir / 'train.err'}")
        return timeline, summary, (out_dir / "train.err").read_text()
    finally:
        if prometheus is not None:
            prometheus.stop()
        cluster.stop()


def follow(scenario: Scenario, cluster: LocalCluster, driver: subprocess.Popen, run_dir: Path, victim: str,
           timeline: Timeline, prometheus: Prometheus | None) -> None:
    """Timestamp progress lines, kill the node, start it again, read the degraded state, until the run ends."""
    deadline = time.monotonic() + scenario.timeout_s
    while driver.poll() is None:
        if time.monotonic() > deadline:
            driver.kill()
            raise RuntimeError(f"the run did not finish within {scenario.timeout_s:g} s")
        now = time.monotonic()
        timeline.records += [(now, r) for r in progress_lines(run_dir / "progress.jsonl", len(timeline.records))]
        if not timeline.killed_at and len(timeline.records) >= scenario.kill_after:
            cluster.kill(victim)
            timeline.killed_at = time.monotonic()
        down = time.monotonic() - timeline.killed_at if timeline.killed_at else 0.0
        short = timeline.first_short_round(scenario.actors)  # when the driver's gauges first showed the loss
        if prometheus is not None and short is not None and not timeline.degraded \
                and down >= scenario.read_metrics_after_s and time.monotonic() - short >= SCRAPES_S:
            at = time.time()
            timeline.degraded = {name: first_value(prometheus.query_at(expr, at))
                                 for name, expr in DEGRADED_QUERIES.items()}
        if (scenario.down_s is not None and timeline.killed_at and timeline.back_at is None
                and down >= scenario.down_s and (prometheus is None or timeline.degraded)):
            timeline.back_at = time.monotonic()  # the node (pod) starts: Ray's own start-up counts
            cluster.start_worker(victim, scenario.cpus_per_worker, wait=False)
            timeline.node_starts = 1
        elif timeline.back_at is not None and cluster.restart_if_exited(victim):
            timeline.node_starts += 1  # its start gave up: the pod's container is restarted, as Kubernetes does
        time.sleep(0.05)
    timeline.records += [(time.monotonic(), r) for r in progress_lines(run_dir / "progress.jsonl",
                                                                       len(timeline.records))]


def first_value(result: list[dict[str, Any]]) -> float | None:
    return float(result[0]["value"][1]) if result else None


def measure(scenario: Scenario, timeline: Timeline, summary: dict[str, Any]) -> Row:
    """The figures of one scenario (seconds on the bench's clock; rates from the run's own env steps)."""
    seen = [t for t, _ in timeline.records]
    records = [r for _, r in timeline.records]
    end = timeline.back_at if timeline.back_at is not None else seen[-1]
    gaps = [b - a for a, b in itertools.pairwise(seen) if b > timeline.killed_at and a < end]
    before = [(t, r) for t, r in timeline.records if t <= timeline.killed_at]
    during = [(t, r) for t, r in timeline.records if timeline.killed_at < t <= end]
    full = scenario.actors
    back = next((t for t, r in timeline.records if timeline.back_at and t > timeline.back_at
                 and r["segments"] == full), None)
    per_segment = scenario.envs_per_actor * scenario.segment_length
    return {
        "scenario": "never back" if scenario.down_s is None else f"back after {scenario.down_s:g} s",
        "actors": full, "workers": scenario.workers, "finished": summary.get("reason"),
        "max_gap_while_down_s": round(max(gaps), 1) if gaps else None,
        "steps_per_s_before": rate(before), "steps_per_s_down": rate(during),
        "down_vs_before": ratio(rate(during), rate(before)),
        "surviving_fraction": round(1 - scenario.cpus_per_worker / (scenario.workers * scenario.cpus_per_worker), 3),
        "full_count_after_return_s": None if back is None or timeline.back_at is None
        else round(back - timeline.back_at, 1),
        "env_steps_exact": (sum(r["env_steps_delta"] for r in records) == summary.get("env_steps")
                            and all(r["env_steps_delta"] == r["segments"] * per_segment for r in records)),
        "iterations_contiguous": [r["iteration"] for r in records] == list(range(1, len(records) + 1)),
        "node_losses": summary.get("node_losses"), "actor_crashes": summary.get("actor_crashes"),
        **{f"prometheus_{k.replace(' ', '_')}": v for k, v in timeline.degraded.items()},
    }


def rate(window: list[tuple[float, dict[str, Any]]]) -> float | None:
    """Env steps per second over a window of timestamped records (from the first record's arrival)."""
    if len(window) < 2:
        return None
    steps = sum(r["env_steps_delta"] for _, r in window[1:])
    return round(steps / (window[-1][0] - window[0][0]), 1)


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 3)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("node-loss", help="a worker node killed mid-run, back after a while and never")
    parser.add_argument("--workers", type=positive(int, "--workers"), default=2, help="worker nodes (default 2)")
    parser.add_argument("--cpus-per-worker", type=positive(int, "--cpus-per-worker"), default=2)
    parser.add_argument("--actors", type=positive(int, "--actors"), default=4)
    parser.add_argument("--envs-per-actor", type=positive(int, "--envs-per-actor"), default=4)
    parser.add_argument("--segment-length", type=positive(int, "--segment-length"), default=64)
    parser.add_argument("--total-steps", type=positive(int, "--total-steps"), default=400_000)
    parser.add_argument("--env-latency-ms", type=positive(float, "--env-latency-ms"), default=1.0,
                        help="each env step takes this long, the CPU released (default 1): throughput is the "
                        "actors', as with a simulator, not this machine's cores")
    parser.add_argument("--kill-after", type=positive(int, "--kill-after"), default=10,
                        help="iterations before the node is killed (default 10)")
    parser.add_argument("--down-s", type=positive(float, "--down-s"), default=40.0,
                        help="seconds until the node comes back (default 40)")
    parser.add_argument("--scenarios", choices=["both", "back", "never"], default="both",
                        help="the node back after --down-s, never back, or both (default)")
    parser.add_argument("--timeout", type=positive(float, "--timeout"), default=900.0, help="seconds per run")
    add_common_args(parser, address=False)
    parser.set_defaults(func=cmd_node_loss)


def cmd_node_loss(args: argparse.Namespace) -> int:
    if args.actors > args.workers * args.cpus_per_worker:
        raise UsageError(f"--actors {args.actors} do not fit on {args.workers} workers of {args.cpus_per_worker} "
                         "CPUs; lower --actors or raise --workers / --cpus-per-worker")
    info = machine()
    downs = {"both": [args.down_s, None], "back": [args.down_s], "never": [None]}[args.scenarios]
    rows = []
    for down_s in downs:
        scenario = Scenario(args.workers, args.cpus_per_worker, args.actors, args.envs_per_actor,
                            args.segment_length, args.total_steps, args.kill_after, down_s, args.env_latency_ms,
                            timeout_s=args.timeout)
        with tempfile.TemporaryDirectory(prefix="dppo-node-loss-", dir="/tmp") as out:
            timeline, summary, _stderr = run_scenario(scenario, Path(out))
        rows.append(measure(scenario, timeline, summary))
        print(json.dumps(rows[-1]), flush=True)
    note = ("A local cluster as the chart builds it (`ray start` nodes on this machine, token auth on): a head with "
            "0 CPUs and worker nodes for the actors; `dppo train --address` joins it. After `--kill-after` "
            "iterations the last worker node is killed whole (raylet, agents and its actors' processes) and, in "
            "the first scenario, started again `--down-s` later as a new node. Seconds are the bench's clock: "
            "`max_gap_while_down_s` is the longest time between two progress lines while the node was gone; "
            "`steps_per_s_*` the env steps trained per second before the kill and while the node was gone "
            "(`down_vs_before` against `surviving_fraction`, the share of actor CPUs left); "
            "`full_count_after_return_s` from the node's start (Ray's start-up on it included) to the first iteration "
            "with every actor's segment; "
            "`env_steps_exact`: every iteration's env steps equal its segments x E x T and add up to "
            "summary.json's; `prometheus_*`: the dashboard's degraded-state queries on a real Prometheus scrape "
            "(every second) 8 s into the outage, or once the run has reported a round short of actors and been "
            "scraped twice since if that comes later; the node comes back only after that reading. Each env step "
            "takes `--env-latency-ms` with the CPU released, so throughput is the actors' (as with a simulator), not "
            "this machine's two cores.")
    columns = ["scenario", "actors", "workers", "finished", "max_gap_while_down_s", "steps_per_s_before",
               "steps_per_s_down", "down_vs_before", "surviving_fraction", "full_count_after_return_s",
               "env_steps_exact", "iterations_contiguous", "node_losses", "actor_crashes",
               "prometheus_actors_missing", "prometheus_actors_pending", "prometheus_actors_lost_with_node",
               "prometheus_actor_crashes"]
    emit(args, rows, columns, args.section or "node-loss", f"Node loss, {args.actors} actors on {args.workers} "
         "workers", note, info)
    return 0
