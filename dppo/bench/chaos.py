"""`dppo bench chaos`: train a config while a seeded schedule kills its processes, and account for every env step.

The cluster is shaped like the chart's: a head of its own `ray start --head` (0 CPUs, the job API, token auth on),
worker nodes of their own `ray start --address`, each on its own ports; the run is submitted with `ray job submit`
as KubeRay's submitter does, with ``--auto-resume`` as the chart's entrypoint. The config is trained run after run
until ``--minutes`` of chaos have passed (the last run then finishes in peace); the victims are the sampling actors,
the learners, the inference service, the evaluation actor (by Ray actor class, read from the process title
``ray::<Class>``), whole worker nodes (back after ``--node-down-s``) and the driver (the job resubmitted with
``--auto-resume``, as the chart's job retries would); the ``hang`` kind stops one of those Ray actors with SIGSTOP
and never resumes it, for the run to notice within its deadline and replace. Only processes of this run are
killed: descendants of the `ray start` processes started here, or with ``--address`` the actors and drivers of its
own jobs on this machine.
Every env step is accounted for, a multi-agent env's agent columns included. A line is printed as each thing
happens (:mod:`dppo.bench.chaos_readout`); the schedule, every kill and the figures go to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shlex
import signal
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dppo.bench.chaos_cluster import (
    Cluster,
    alive,
    probe,
    run_processes_left,
    saved_token,
)
from dppo.bench.chaos_curves import plot_long_run
from dppo.bench.chaos_growth import MIN_FIT_SAMPLES, readings, tables_text
from dppo.bench.chaos_growth import report_text as long_report
from dppo.bench.chaos_loop import EVERY_KIND_MAX_S, Chaos
from dppo.bench.chaos_monitor import Monitor
from dppo.bench.chaos_readout import Narrator, clock, kill_rows, report_text, verdict
from dppo.bench.chaos_report import RunLog, recovery_rows, run_row
from dppo.bench.chaos_schedule import (
    KINDS,
    make_schedule,
    parse_kinds,
    parse_rates,
    write_schedule,
)
from dppo.bench.common import add_common_args, machine
from dppo.bench.docs import write_docs
from dppo.bench.local_cluster import LocalCluster
from dppo.cli_args import positive
from dppo.errors import UsageError
from dppo.transport.protocol import sweep_stale

# What the bench sets so that chaos is not taken for a crash loop (the guards would end the run on purpose).
CHAOS_SETS = ["faults.max_actor_restarts=100000", "faults.max_learner_restarts=100000",
              "faults.max_hang_restarts=100000", "metrics.port=0", "run.tensorboard=false"]


def env_steps_per_segment(config: Any) -> int:
    """Env steps in one actor's segment as the run counts them: T x the columns of its vector env, env copies x
    each copy's agent columns (a PettingZoo Parallel env's agents; a turn-based game's one learning seat; 1 for a
    gymnasium env), found by making one env of a multi-agent config as `dppo train` does."""
    from dppo.envs.make import with_agents

    return with_agents(config).columns * config.ppo.segment_length


def long_run_sets(args: argparse.Namespace) -> list[str]:
    """Without faults one run trains for ``--minutes`` (run.time_limit_s; the run ends with a checkpoint and exit 0):
    no step budget or target return ends it first unless the user set one."""
    given = {item.partition("=")[0].strip() for item in args.sets}
    sets = [f"run.time_limit_s={args.minutes * 60:g}"]
    sets += [] if "run.total_steps" in given else ["run.total_steps=1000000000000"]
    sets += [] if "run.target_return" in given else ["run.target_return=null"]
    return sets


def prepare(args: argparse.Namespace) -> tuple[Any, list[str], dict[str, float], list[str]]:
    """Config, kinds, rates and the sets the bench adds; every bad input found before anything is started."""
    from dppo.config import load_config

    if args.no_faults and (args.kinds or args.rate or args.every_kind):
        raise UsageError("--no-faults kills nothing: leave out --kinds, --rate and --every-kind (or drop --no-faults)")
    fit_min = args.warmup_min + MIN_FIT_SAMPLES * args.sample_s / 60
    if args.no_faults and args.minutes < fit_min:
        raise UsageError(f"--minutes {args.minutes:g} ends before growth can be fitted: the warm-up (--warmup-min "
                         f"{args.warmup_min:g}) and then {MIN_FIT_SAMPLES} readings (--sample-s {args.sample_s:g}); "
                         f"pass --minutes {fit_min:g} or more, or a shorter --warmup-min")
    given = parse_kinds(args.kinds) if args.kinds else None
    sets = [*args.sets, *CHAOS_SETS, *(long_run_sets(args) if args.no_faults else [])]
    if args.no_faults:
        return load_config(args.config, {"env.id": args.env} if args.env else {}, sets), [], {}, sets
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
                            "and the driver, and hangs them (SIGSTOP); every env step accounted for")
    parser.add_argument("--config", help="YAML config (default: the preset of --env)")
    parser.add_argument("--env", help="registered env id (its preset) when no --config")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--minutes", type=positive(float, "--minutes"), default=30.0,
                        help="minutes of chaos (runs of the config follow one another; the last one finishes)")
    parser.add_argument("--seed", type=int, default=1, help="the schedule's seed (default 1)")
    parser.add_argument("--kinds", help=f"comma-separated, from {','.join(KINDS)} (default: those the config has)")
    parser.add_argument("--rate", action="append", default=[], metavar="KIND=PER_MIN",
                        help="kills (hangs: stops) per minute of a kind (default 1.2; node 0.2)")
    parser.add_argument("--every-kind", action="store_true",
                        help="go on past --minutes until each kind planned has been killed once (at most "
                        f"{EVERY_KIND_MAX_S / 60:g} minutes more; only those kinds' kills), so a short chaos hits "
                        "every kind on a slow machine")
    parser.add_argument("--node-down-s", type=positive(float, "--node-down-s"), default=15.0,
                        help="seconds a killed worker node stays down (default 15)")
    parser.add_argument("--workers", type=positive(int, "--workers"), default=2, help="worker nodes (default 2)")
    parser.add_argument("--no-baseline", dest="baseline", action="store_false",
                        help="skip the run of the same config without chaos")
    parser.add_argument("--no-faults", action="store_true",
                        help="kill nothing: one run trains for --minutes (a long run, to measure growth)")
    parser.add_argument("--sample-s", type=positive(float, "--sample-s"), default=60.0,
                        help="seconds between readings of every process's RSS, open files, /dev/shm, the object "
                        "store and the run dir (default 60)")
    parser.add_argument("--warmup-min", type=positive(float, "--warmup-min"), default=5.0,
                        help="minutes of training before growth is fitted (default 5)")
    parser.add_argument("--out", help="where the schedule, job logs and runs go (default runs/chaos-<time>)")
    add_common_args(parser)
    parser.set_defaults(func=cmd_chaos)


def cmd_chaos(args: argparse.Namespace) -> int:
    config, kinds, rates, sets = prepare(args)
    steps = env_steps_per_segment(config)  # a bad env id or a user module that fails: one line before any start
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
                "node_down_s": args.node_down_s, "workers": args.workers, "address": args.address,
                "every_kind": args.every_kind}
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token,
            "RAY_raylet_start_wait_time_s": "300"}  # a loaded machine registers a node slowly (Ray's default 30)
    cpus = int(-(-(config.run.actors * config.run.actor_cpus + config.run.learners * config.run.learner_cpus
                   + config.run.eval_cpus) // 1))
    local = None if args.address else LocalCluster(env)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped bench still stops its cluster (finally)
    loads = [os.getloadavg()[0]]
    say = Narrator(config.run.total_steps, args.minutes * 60, "long run" if args.no_faults else "chaos")
    monitor = None
    try:
        if local is not None:
            say.say(f"starting a local cluster: a head and {args.workers} worker node{'s' * (args.workers > 1)} of "
                    f"{cpus} CPUs (out: {out})")
            # A `ray start` that exits (a port taken before Ray bound it, a raylet's registration timed out) is
            # started again with ports of its own; each node gets 600 s for its first line (a shared 2-core machine
            # took over 120 s).
            local.start_head(0, dashboard=True, timeout=600)
            for i in range(1, args.workers + 1):  # each alone holds the run: one may be down
                local.start_worker(f"worker-{i}", cpus, timeout=600)
            dashboard = local.dashboard
        cluster = Cluster(dashboard, env, local, str(out))
        chaos = Chaos(cluster, out, entrypoint, list(plan), args.seed, args.node_down_s, cpus, say, args.every_kind)
        chaos.full = config.run.actors
        monitor = Monitor(cluster, out, out / "samples.jsonl", args.sample_s, lambda: chaos.chaos_start)
        monitor.__enter__()
        baseline = None
        if args.baseline and not args.no_faults:
            say.say(f"run 0, the run without chaos, first ({config.run.total_steps:,} env steps)")
            base = chaos.run_once(0, out / "run-0", None, timeout_s=3600)
            baseline = base.summary.get("episode_return_mean")
        runs: list[RunLog] = []
        while chaos.going_on(time.monotonic()):
            loads.append(os.getloadavg()[0])
            say.say(f"run {len(runs) + 1} starts" + (" (the chaos begins at its first progress line: "
                                                     f"{args.minutes:g} min, {len(plan)} kills planned)"
                                                     if not chaos.chaos_start else ""))
            runs.append(chaos.run_once(len(runs) + 1, out / f"run-{len(runs) + 1}", args.minutes * 60,
                                       timeout_s=args.minutes * 60 + 1800))
            if runs[-1].statuses[-1] != "SUCCEEDED" or args.no_faults:
                break  # without faults the one run trained for the minutes (its time limit)
        loads.append(os.getloadavg()[0])
        end_s = args.minutes * 60 if chaos.ended_s is None else chaos.ended_s
        ended = (f"the chaos ended at t={clock(end_s)}" if runs[-1].statuses[-1] == "SUCCEEDED"
                 else f"run {len(runs)} ended {runs[-1].statuses[-1]}")
        say.say("counting what the runs left behind (their processes get up to 60 s to end)")
        leftovers = {"processes": run_processes_left(cluster, str(out))}
    finally:
        if monitor is not None:
            monitor.stop()
        if local is not None:
            local.stop()
            if sys.exc_info()[0] is not None:  # stopped (SIGTERM, Ctrl-C) or failed: no count of leftovers follows
                sweep_stale()  # the segments of an inference service killed with its node, as its next start would
    deadline = time.monotonic() + 30.0  # killed trees are reaped by init a moment later
    while (left := [pid for pid, created in chaos.pids.items() if alive(pid, created)]) \
            and time.monotonic() < deadline:
        time.sleep(1.0)
    leftovers["processes"] += [str(pid) for pid in left]
    leftovers["shm"] = sorted(path for path in chaos.shm if Path(path).exists())
    leftovers["shm_gone_with_nodes"] = chaos.shm_with_nodes
    missed = chaos.missed(ended)
    write_schedule(out / "schedule.json", plan, chaos.done, settings, missed)
    row, accounts = run_row(runs, chaos.done, steps, config.run.actors, baseline, leftovers)
    row["load_avg"] = round(statistics.mean(chaos.loads or loads), 2)
    kills = recovery_rows(chaos.done, runs, config.run.actors, kinds)
    words = kill_rows(kills, missed)
    samples, statuses = monitor.samples if monitor else [], [str(a["status"]) for a in accounts]
    if args.no_faults:
        text, growth = long_report(samples, args.warmup_min * 60, config.run.keep_checkpoints, len(leftovers["shm"]),
                                   statuses, args.minutes)
        said = growth["verdict"]
    else:  # one verdict: the readings' findings among the chaos's
        procs, total, found = readings(samples, args.warmup_min * 60, config.run.keep_checkpoints,
                                       len(leftovers["shm"]), statuses)
        growth = {"problems": found, "processes": procs, "totals": total, "warmup_s": args.warmup_min * 60}
        said = verdict(row, accounts, words, missed, found)
        text = (report_text(row, accounts, words, missed, found)
                + "\n\nReadings of every process (each --sample-s):\n\n" + tables_text(procs, total))
    result = {"verdict": said, "run": row, "kills": kills, "missed": missed, "runs": accounts, "leftovers": leftovers,
              "env_steps_per_segment": steps, "growth": growth}
    (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    report(args, result, text, info, out, monitor.samples if monitor else [], config)
    return 0


def section_key(args: argparse.Namespace, config: Any) -> str:
    """The docs section: ``--section``, else ``chaos``, or ``long-<env>`` without faults (one per env, so two long
    runs side by side keep their own sections and figures)."""
    if args.section:
        return str(args.section)
    return "long-" + re.sub(r"[^a-z0-9]+", "-", config.env.id.lower()).strip("-") if args.no_faults else "chaos"


def report(args: argparse.Namespace, result: dict[str, Any], text: str, info: dict[str, Any], out: Path,
           samples: list[dict[str, Any]], config: Any) -> None:
    """The report on stdout (its first line the verdict); the section of docs/benchmarks.md and its figure (the
    readings' curves) with --write-docs."""
    from dppo.bench.common import typed_argv

    print("\n" + text, flush=True)
    print(f"\nschedule, kills, accounting and readings (samples.jsonl): {out}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({k: result[k] for k in ("verdict", "run", "kills", "missed", "growth")},
                                              indent=2) + "\n")
    if args.write_docs:
        key = section_key(args, config)
        title = (f"Long run: {config.env.id}, {args.minutes:g} minutes without faults" if args.no_faults
                 else "Chaos: every kind of process killed at random")
        figure = None
        if samples:
            name = f"bench-{key}.png" if key.startswith("long-") else f"bench-long-{key}.png"
            figure = plot_long_run(samples, args.warmup_min * 60, title, Path(args.write_docs).parent / name)
        note = (LONG_NOTE if args.no_faults else NOTE).format(minutes=f"{args.minutes:g}",
                                                              warmup=f"{args.warmup_min:g}", every=f"{args.sample_s:g}")
        write_docs(Path(args.write_docs), key, title, note, shlex.join(typed_argv(args)), text, info, figure)
        print(f"wrote section {key!r} of {args.write_docs}" + (f" and {figure}" if figure else ""), flush=True)


NOTE = (
    "A local cluster shaped like the chart's (a head of its own `ray start --head` with 0 CPUs and the job API, "
    "worker nodes of their own `ray start`, token auth on); the config is submitted with `ray job submit` "
    "(`dppo train --auto-resume`, as the chart's entrypoint) and trained run after run for {minutes} minutes while a "
    "seeded schedule (`schedule.json` beside the results) SIGKILLs a process of each kind at random moments: "
    "sampling actors, learners, the inference service, the evaluation actor (by Ray actor class), whole worker "
    "nodes (back after `--node-down-s`) and the driver (the job resubmitted, resuming from its newest checkpoint, "
    "as the chart's retries do); a victim process is SIGKILLed alone, as a crash would be; a `hang` stops one of "
    "those Ray actors (any class) with SIGSTOP and never resumes it, for the run to notice past its deadline "
    "(`faults.hang_timeout_s`, else max(60 s, 10x that call's median)) and replace. The bench lifts the crash-loop "
    "and hang guards (`faults.max_*_restarts`) so chaos is not taken for a crash loop, and turns evaluation on "
    "(`run.eval_every=5`) when the config has it off. The env steps are counted by the driver's rounds, not by "
    "the actors; a multi-agent env's steps are its agent columns'. The first line below is the verdict; the "
    "legend after the tables says what each column counts. The readings of every process (one each {every} s; "
    "growth fitted after {warmup} minutes of training, or of the process's own life for one started later) follow "
    "the legend."
)

LONG_NOTE = (
    "The same chart-shaped local cluster as the chaos section (a head of its own `ray start --head`, worker nodes "
    "of their own `ray start`, the run submitted with `ray job submit`), with `--no-faults`: nothing is killed and "
    "one run trains for {minutes} minutes (`run.time_limit_s`; no step budget or target return ends it first). "
    "Every {every} s the bench reads every process of the cluster (RSS and open files, by role and node), the "
    "/dev/shm entries the run's processes hold, Ray's object store (its `ray_object_store_memory` gauge) and the "
    "run directory (size, checkpoint count); each process's RSS growth is a least-squares line through its "
    "readings after {warmup} minutes of training (or of its own life, for a process started later), per hour, as % "
    "of its first reading after them (the target: at most 5 %/h, nothing left in /dev/shm, the run dir bounded by "
    "`run.keep_checkpoints`). The readings are `samples.jsonl` in `--out`; the figure draws them, the dotted line "
    "the warm-up's end."
)
