"""`dppo bench chaos`: train a config while a seeded schedule kills its processes, and account for every env step.

The cluster is shaped like the chart's: a head of its own `ray start --head` (0 CPUs, the job API, token auth on),
worker nodes of their own `ray start --address`, each on its own ports; the run is submitted with `ray job submit`
as KubeRay's submitter does, with ``--auto-resume`` as the chart's entrypoint. The config is trained run after run
until ``--minutes`` of chaos have passed (the last run then finishes in peace); the victims are the sampling actors,
the learners, the inference service, the evaluation actor (by Ray actor class, read from the process title
``ray::<Class>``), whole worker nodes (back after ``--node-down-s``) and the driver (the job resubmitted with
``--auto-resume``, as the chart's job retries would). Only processes of this cluster are killed: descendants of the
`ray start` processes started here. The schedule, every kill and the figures go to ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shlex
import signal
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil

from dppo.bench.chaos_cluster import (
    FINISHED,
    Cluster,
    alive,
    crash,
    probe,
    run_processes_left,
    saved_token,
    shm_in_use,
    start_worker,
    tree,
    victims,
)
from dppo.bench.chaos_report import RunLog, recovery_rows, run_row
from dppo.bench.chaos_schedule import (
    KINDS,
    Kill,
    make_schedule,
    parse_kinds,
    parse_rates,
    pick,
    write_schedule,
)
from dppo.bench.common import add_common_args, machine
from dppo.bench.docs import write_docs
from dppo.bench.local_cluster import RAY, LocalCluster
from dppo.cli_args import positive
from dppo.errors import UsageError
from dppo.markdown import table

SETTLE_S = 2.0  # a line read this soon after a kill was written before it: no sign of recovery
# What the bench sets so that chaos is not taken for a crash loop (the guards would end the run on purpose).
CHAOS_SETS = ["faults.max_actor_restarts=100000", "faults.max_learner_restarts=100000", "metrics.port=0",
              "run.tensorboard=false"]


class Chaos:
    """The loop: follow the current run's progress and job, do the kills when due, bring nodes back."""

    def __init__(self, cluster: Cluster, out: Path, entrypoint: str, plan: list[Kill], seed: int,
                 node_down_s: float, cpus_per_worker: int) -> None:
        self.cluster, self.out, self.entrypoint, self.plan, self.seed = cluster, out, entrypoint, plan, seed
        self.node_down_s, self.cpus_per_worker = node_down_s, cpus_per_worker
        self.done: list[dict[str, Any]] = []
        self.down: dict[str, float] = {}  # worker node -> when it comes back
        self.shm: set[str] = set()
        self.pids: dict[int, float] = {}  # every process of ours seen: pid -> create time
        self.job_id = ""
        self.full_at = 0.0  # when the last progress line with every actor's segment appeared
        self.full = 0  # that many segments (run.actors)
        self.node_shm: dict[str, set[str]] = {}  # per node: the /dev/shm entries its processes had, last seen
        self.shm_with_nodes: list[str] = []  # removed with their killed node (a machine's /dev/shm goes with it)
        self.loads: list[float] = []  # the machine's 1-minute load, every 2 s under chaos

    def run_once(self, index: int, run_dir: Path, chaos_s: float | None, timeout_s: float) -> RunLog:
        """One training run, resubmitted until it ends well (or ``timeout_s``); kills for ``chaos_s`` seconds
        from the first progress line of the first run under chaos (Ray's and the run's start-up are not chaos
        time: on a loaded machine they would take the window)."""
        log = RunLog(index)
        raw: set[str] = set()
        attempt, start = 0, time.monotonic()
        entry = f"{self.entrypoint} --run-dir {shlex.quote(str(run_dir))}"
        self.job_id = f"chaos-{index}-{attempt}-{secrets.token_hex(2)}"
        self.cluster.submit(self.job_id, entry)
        last_status_at, last_scan_at = 0.0, 0.0
        while True:
            now = time.monotonic()
            self.read_progress(run_dir, raw, log, attempt)
            if now - last_status_at >= 1.0:
                last_status_at = now
                status = self.cluster.status(self.job_id)
                if status in FINISHED:
                    log.statuses.append(status)
                    self.read_progress(run_dir, raw, log, attempt)
                    if status == "SUCCEEDED" or now - start > timeout_s or attempt >= 1000:
                        break
                    self.save_job_log(self.job_id)
                    attempt += 1  # the chart's retry: the same entrypoint, resuming from the newest checkpoint
                    self.job_id = f"chaos-{index}-{attempt}-{secrets.token_hex(2)}"
                    self.cluster.submit(self.job_id, entry)
                elif now - start > timeout_s:
                    with contextlib.suppress(OSError):
                        subprocess.run([RAY, "job", "stop", "--address", self.cluster.dashboard, self.job_id],
                                       env=self.cluster.env, capture_output=True, timeout=120, check=False)
                    log.statuses.append("TIMEOUT")
                    break
            if now - last_scan_at >= 2.0:
                last_scan_at = now
                self.scan()
            if chaos_s is not None and not self.chaos_start and log.seen:
                self.chaos_start, self.chaos_until = log.seen[0][0], log.seen[0][0] + chaos_s
            if chaos_s is not None and self.chaos_start:
                self.kill_due(now, self.chaos_until, index)
            self.bring_back(now)
            time.sleep(0.2)
        summary = run_dir / "summary.json"
        log.summary = json.loads(summary.read_text()) if summary.exists() and log.statuses[-1] == "SUCCEEDED" else {}
        log.final = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()] \
            if (run_dir / "progress.jsonl").exists() else []
        return log

    def read_progress(self, run_dir: Path, raw: set[str], log: RunLog, attempt: int) -> None:
        """Lines not seen before (a resume rewrites the file with the kept lines: those were seen)."""
        path = run_dir / "progress.jsonl"
        if not path.exists():
            return
        now = time.monotonic()
        for line in path.read_text().split("\n")[:-1]:
            if line not in raw:
                raw.add(line)
                log.seen.append((now, attempt, json.loads(line)))
                if log.seen[-1][2]["segments"] >= self.full:
                    self.full_at = now

    def scan(self) -> None:
        if self.chaos_start:
            self.loads.append(os.getloadavg()[0])
        processes = self.cluster.processes(self.job_id)
        for process in processes:
            with contextlib.suppress(psutil.Error):
                self.pids.setdefault(process.pid, process.create_time())
        self.shm |= shm_in_use(processes)
        for name, node in (self.cluster.local.nodes.items() if self.cluster.local else []):
            self.node_shm[name] = shm_in_use(tree(node.pid))

    def kill_due(self, now: float, chaos_until: float, run: int) -> None:
        """The planned kills whose time has come and whose kind has a victim now (else they wait for one), one of a
        kind at a time, each once the run has recovered from the last of its kind (a full progress line since):
        otherwise a driver restarting on a loaded machine is killed again before it trains, and nothing does."""
        start = self.chaos_start
        waiting = [k for k in self.plan if start + k.at_s <= now < chaos_until]
        if not waiting:
            return
        processes, kinds = None, set()
        for kill in waiting:
            last = max((k["at"] for k in self.done if k["kind"] == kill.kind), default=0.0)
            if kill.kind in kinds or self.full_at <= last + SETTLE_S:
                continue  # one of a kind at a time, and only once the run has recovered from the last one
            if kill.kind == "node":
                up = [n for n in (self.cluster.local.nodes if self.cluster.local else {}) if n != "head"]
                if self.down or not up:
                    continue  # one node down at a time: two raylets registering at once can time out
                name = pick(up, self.seed, len(self.done))
                self.cluster.local.kill(name)  # type: ignore[union-attr]
                self.lose_node_shm(name)
                self.down[name] = time.monotonic() + self.node_down_s
                victim: Any = name
            else:
                processes = processes if processes is not None else self.cluster.processes(self.job_id)
                found = {p.pid: p for p in victims(kill.kind, processes, str(self.out))}
                if not found:
                    continue
                victim = pick(list(found), self.seed, len(self.done))
                crash(found[victim])
                processes = None
            self.plan.remove(kill)
            kinds.add(kill.kind)
            self.done.append({"kind": kill.kind, "planned_s": kill.at_s, "done_s": round(now - start, 2),
                              "at": time.monotonic(), "victim": victim, "run": run})
            print(f"chaos: t={now - start:.1f}s killed {kill.kind} {victim} (run {run})", flush=True)

    def lose_node_shm(self, name: str) -> None:
        """The /dev/shm entries of a killed node's processes go with it, as a machine's memory does (here the nodes
        share one /dev/shm): removed unless a process of another node has them too; counted apart, not leftovers."""
        others = set().union(*(paths for node, paths in self.node_shm.items() if node != name))
        for path in sorted(self.node_shm.pop(name, set()) - others):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                self.shm_with_nodes.append(path)
            self.shm.discard(path)

    def bring_back(self, now: float) -> None:
        """Start a killed node again when its time is up (a rescheduled pod), and again if its start failed (a
        loaded machine can time a raylet's registration out)."""
        local = self.cluster.local
        if local is None:
            return
        for name, node in list(local.nodes.items()):
            if node.poll() is not None and name not in self.down:
                print(f"chaos: node {name} exited ({node.returncode}); starting it again", flush=True)
                local.nodes.pop(name)
                self.down[name] = now
        for name, at in list(self.down.items()):
            if now >= at:
                local.start_worker(name, self.cpus_per_worker, wait=False)
                del self.down[name]

    def save_job_log(self, job_id: str) -> None:
        with contextlib.suppress(OSError, ValueError, KeyError):
            (self.out / f"{job_id}.log").write_text(self.cluster.api(f"/api/jobs/{job_id}/logs")["logs"])

    chaos_start = 0.0  # when the chaos began (monotonic; 0: not yet)
    chaos_until = 0.0


def prepare(args: argparse.Namespace) -> tuple[Any, list[str], dict[str, float], list[str]]:
    """Config, kinds, rates and the sets the bench adds; every bad input found before anything is started."""
    from dppo.config import load_config

    given = parse_kinds(args.kinds) if args.kinds else None
    sets = [*args.sets, *CHAOS_SETS]
    config = load_config(args.config, {"env.id": args.env} if args.env else {}, sets)
    applies = {"learner": config.run.learners >= 2, "inference": config.run.inference == "server"}
    need = {"learner": "run.learners >= 2 (e.g. --set run.learners=2)",
            "inference": "run.inference: server (e.g. --set run.inference=server)"}
    for kind in given or []:
        if not applies.get(kind, True):
            raise UsageError(f"--kinds {kind}: this config has no {kind} process; it needs {need[kind]}")
    kinds = given or [k for k in KINDS if applies.get(k, True)]
    if args.address and "node" in kinds:
        raise UsageError("--kinds node kills worker nodes of the local cluster this bench starts; leave node out "
                         "of --kinds with --address")
    if "evaluation" in kinds and not config.run.eval_every:
        sets.append("run.eval_every=5")  # the evaluation actor exists only while evaluating
        config = load_config(args.config, {"env.id": args.env} if args.env else {}, sets)
    return config, kinds, parse_rates(args.rate, kinds), sets


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("chaos", help="train while a seeded schedule kills actors, learners, services, nodes "
                            "and the driver; every env step accounted for")
    parser.add_argument("--config", help="YAML config (default: the preset of --env)")
    parser.add_argument("--env", help="registered env id (its preset) when no --config")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--minutes", type=positive(float, "--minutes"), default=30.0,
                        help="minutes of chaos (runs of the config follow one another; the last one finishes)")
    parser.add_argument("--seed", type=int, default=1, help="the schedule's seed (default 1)")
    parser.add_argument("--kinds", help=f"comma-separated, from {','.join(KINDS)} (default: those the config has)")
    parser.add_argument("--rate", action="append", default=[], metavar="KIND=PER_MIN",
                        help="kills per minute of a kind (default 1.2; node 0.2)")
    parser.add_argument("--node-down-s", type=positive(float, "--node-down-s"), default=15.0,
                        help="seconds a killed worker node stays down (default 15)")
    parser.add_argument("--workers", type=positive(int, "--workers"), default=2, help="worker nodes (default 2)")
    parser.add_argument("--no-baseline", dest="baseline", action="store_false",
                        help="skip the run of the same config without chaos")
    parser.add_argument("--out", help="where the schedule, job logs and runs go (default runs/chaos-<time>)")
    add_common_args(parser)
    parser.set_defaults(func=cmd_chaos)


def cmd_chaos(args: argparse.Namespace) -> int:
    config, kinds, rates, sets = prepare(args)
    token = (os.environ.get("RAY_AUTH_TOKEN") or saved_token()) if args.address else secrets.token_hex(32)
    dashboard = probe(args.address, token) if args.address else ""
    if args.address and token:  # this process reads the cluster's actors (ray.util.state) with the token too
        os.environ |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    info = machine()
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    out = Path(args.out or f"runs/chaos-{stamp}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    config_file = out / "config.yaml"
    config_file.write_text(config.to_yaml())
    entrypoint = f"{shlex.quote(sys.executable)} -m dppo train --config {shlex.quote(str(config_file))} --auto-resume"
    plan = make_schedule(rates, args.minutes, args.seed)
    settings = {"minutes": args.minutes, "seed": args.seed, "kinds": kinds, "rates": rates, "sets": sets,
                "node_down_s": args.node_down_s, "workers": args.workers, "address": args.address}
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token,
            "RAY_raylet_start_wait_time_s": "300"}  # a loaded machine registers a node slowly (Ray's default 30)
    cpus = int(-(-(config.run.actors * config.run.actor_cpus + config.run.learners * config.run.learner_cpus
                   + config.run.eval_cpus) // 1))
    local = None if args.address else LocalCluster(env)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped bench still stops its cluster (finally)
    loads = [os.getloadavg()[0]]
    try:
        if local is not None:
            for attempt in range(3):  # a port chosen free can be taken by another process before Ray binds it
                try:
                    local.start_head(0, dashboard=True)
                    break
                except RuntimeError:
                    local.kill("head")
                    if attempt == 2:
                        raise
            for i in range(1, args.workers + 1):
                start_worker(local, f"worker-{i}", cpus)  # each alone holds the run: one may be down
            dashboard = local.dashboard
        cluster = Cluster(dashboard, env, local)
        chaos = Chaos(cluster, out, entrypoint, list(plan), args.seed, args.node_down_s, cpus)
        chaos.full = config.run.actors
        baseline = None
        if args.baseline:
            print("chaos: the run without chaos first", flush=True)
            base = chaos.run_once(0, out / "run-0", None, timeout_s=3600)
            baseline = base.summary.get("episode_return_mean")
        runs: list[RunLog] = []
        while not chaos.chaos_start or time.monotonic() < chaos.chaos_until:
            loads.append(os.getloadavg()[0])
            runs.append(chaos.run_once(len(runs) + 1, out / f"run-{len(runs) + 1}", args.minutes * 60,
                                       timeout_s=args.minutes * 60 + 1800))
            if runs[-1].statuses[-1] != "SUCCEEDED":
                break
        loads.append(os.getloadavg()[0])
        leftovers = {"processes": run_processes_left(cluster, str(out))}
    finally:
        if local is not None:
            local.stop()
    deadline = time.monotonic() + 30.0  # killed trees are reaped by init a moment later
    while (left := [pid for pid, created in chaos.pids.items() if alive(pid, created)]) \
            and time.monotonic() < deadline:
        time.sleep(1.0)
    leftovers["processes"] += [str(pid) for pid in left]
    leftovers["shm"] = sorted(path for path in chaos.shm if Path(path).exists())
    leftovers["shm_gone_with_nodes"] = chaos.shm_with_nodes
    write_schedule(out / "schedule.json", plan, chaos.done, settings)
    steps = config.env.num_envs * config.ppo.segment_length
    row, accounts = run_row(runs, chaos.done, steps, config.run.actors, baseline, leftovers)
    row["load_avg"] = round(statistics.mean(chaos.loads or loads), 2)
    kills = recovery_rows(chaos.done, runs, config.run.actors, kinds)
    (out / "results.json").write_text(json.dumps({"run": row, "kills": kills, "runs": accounts,
                                                  "leftovers": leftovers}, indent=1) + "\n")
    report(args, row, kills, info, out)
    return 0


def report(args: argparse.Namespace, row: dict[str, Any], kills: list[dict[str, Any]], info: dict[str, Any],
           out: Path) -> None:
    """Both tables on stdout; the section of docs/benchmarks.md with --write-docs."""
    from dppo.bench.common import typed_argv

    kill_md = table(kills, ["kind", "kills", "recovered", "recover_median_s", "recover_worst_s"])
    columns = ["runs", "attempts", "final_status", "longest_gap_s", "steps_trained", "steps_in_progress",
               "steps_rewound", "short_rounds", "segments_dropped", "accounting_exact", "rewinds", "driver_kills",
               "shm_left", "processes_left", "final_return", "return_without_chaos", "return_ratio", "load_avg"]
    run_md = table([row], columns)
    print(kill_md + "\n\n" + run_md, flush=True)
    print(f"schedule, kills and accounting: {out}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"run": row, "kills": kills}, indent=2) + "\n")
    if args.write_docs:
        note = NOTE.format(minutes=f"{args.minutes:g}")
        write_docs(Path(args.write_docs), args.section or "chaos", "Chaos: every kind of process killed at random",
                   note, shlex.join(typed_argv(args)), kill_md + "\n\n" + run_md, info)
        print(f"wrote section {args.section or 'chaos'!r} of {args.write_docs}", flush=True)


NOTE = (
    "A local cluster shaped like the chart's (a head of its own `ray start --head` with 0 CPUs and the job API, "
    "worker nodes of their own `ray start`, token auth on); the config is submitted with `ray job submit` "
    "(`dppo train --auto-resume`, as the chart's entrypoint) and trained run after run for {minutes} minutes while a "
    "seeded schedule (`schedule.json` beside the results) SIGKILLs a process of each kind at random moments: "
    "sampling actors, learners, the inference service, the evaluation actor (by Ray actor class), whole worker "
    "nodes (back after `--node-down-s`) and the driver (the job resubmitted, resuming from its newest checkpoint, "
    "as the chart's retries do). The bench lifts the crash-loop guards (`faults.max_*_restarts`) so chaos is not "
    "taken for a crash loop, and turns evaluation on (`run.eval_every=5`) when the config has it off. "
    "A kill waits until its kind has a victim and the run has recovered from the last kill of that kind (a "
    "progress line with every actor's segment since), so kills of one kind never land on a restart still under "
    "way. `recover_*_s`: from the kill to the next progress line with every actor's segment (the bench's clock, "
    "polled every 0.2 s; a kill landing after its round was gathered shows the next line's time). "
    "`accounting_exact`: in every run iterations 1..n once each, every line's env steps its "
    "segments x E x T, their sum summary.json's trained steps, and every line seen before a resume unchanged "
    "after it unless cut by the resume (`steps_rewound`, at most one rewind per driver kill); `short_rounds`: "
    "rounds a kill left without some actor's segment (named in results.json); the steps sampled are counted by the "
    "driver's rounds, not by the actors. `shm_left`: /dev/shm entries the cluster's processes had open or mapped "
    "that still exist after the run (a killed node's are removed with it, as a machine's memory goes with it, and "
    "listed apart in results.json; a victim process is SIGKILLed alone, as a crash would be); "
    "`processes_left`: the run's processes alive 60 s after its last job ended, and any "
    "process of the cluster alive after it was stopped. `final_return`: the mean of the runs' final 100-episode "
    "returns, against one run of the same config without chaos. `load_avg`: the machine's 1-minute load during "
    "the run (it is shared)."
)
