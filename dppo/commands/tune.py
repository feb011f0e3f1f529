"""`dppo tune`: the fastest settings for an env, measured here (:mod:`dppo.tune`). It prints the table behind them,
the `dppo train` line and a config file that holds them, and saves them for this machine, where
``run.inference: auto`` follows them."""

from __future__ import annotations

import argparse
import os
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dppo.cli_args import fail, import_from_cwd, positive

if TYPE_CHECKING:
    from dppo.config import Config
    from dppo.tune.grid import Candidate
    from dppo.tune.search import Result

COLUMNS = ["candidate", "batch", "train_steps_per_s", "vs_config", "sample_s", "update_s", "iterations", "rss_mib",
           "max_process_rss_mib", "gpu_mib", "measured_s", "status"]


def register(sub: argparse._SubParsersAction) -> None:
    tune = sub.add_parser(
        "tune", help="measure which settings train an env fastest on this machine or cluster",
        description="Trains the env briefly with each setting of the options (actors, envs per actor, where the "
        "policy runs: in the actors, in two halves, on a GPU share, in the inference service), then the fastest "
        "few for longer, within --minutes; prints the table, the fastest settings as --set lines and a config "
        "file, and saves them for this machine (run.inference: auto follows them).")
    tune.add_argument("--env", help="registered env id (its preset), when no --config")
    tune.add_argument("--config", help="YAML config to start from (its settings are the first candidate)")
    tune.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                      help="a config key for every candidate (repeatable)")
    tune.add_argument("--minutes", type=positive(float, "--minutes"), default=5.0,
                      help="the time budget, start-ups included (default 5)")
    tune.add_argument("--actors", help="comma-separated actor counts (default 1, 2, 4, ... up to the cluster's CPUs)")
    tune.add_argument("--envs-per-actor", help="comma-separated (default: the config's, halved and doubled)")
    tune.add_argument("--segment-lengths", help="comma-separated (default: the config's only; it changes learning)")
    tune.add_argument("--placements", help="comma-separated, of actor, halves, gpu, gpu-halves, server "
                      "(default: every one the config and the cluster allow)")
    tune.add_argument("--actor-cpus", help="comma-separated CPUs per actor, also ale-py's threads (default: the "
                      "config's)")
    tune.add_argument("--finalists", type=positive(int, "--finalists"), default=3,
                      help="candidates trained again for the rest of the budget (default 3)")
    tune.add_argument("--max-rss-mib", type=positive(float, "--max-rss-mib"),
                      help="leave out settings whose processes hold more (summed RSS; default 80%% of memory)")
    tune.add_argument("--max-gpu-mib", type=positive(float, "--max-gpu-mib"),
                      help="leave out settings whose processes hold more GPU memory on this machine (summed, read "
                      "by nvidia-smi; default 90%% of the smallest GPU's)")
    tune.add_argument("--out", help="the config file of the fastest settings (default tune-<env>.yaml)")
    tune.add_argument("--no-save", dest="save", action="store_false",
                      help="do not keep the result for run.inference: auto on this machine")
    tune.add_argument("--full-grid", type=positive(float, "--full-grid"), metavar="SECONDS",
                      help="train every candidate SECONDS instead, no budget (the reference a budgeted tune is "
                      "checked against)")
    tune.add_argument("--address", help="Ray cluster to join (default: RAY_ADDRESS, else a local Ray)")
    tune.add_argument("--json", metavar="FILE", help="write the rows as a JSON list to FILE")
    tune.add_argument("--write-docs", nargs="?", const="docs/benchmarks.md", metavar="FILE",
                      help="replace this tune's section of FILE (default docs/benchmarks.md)")
    tune.add_argument("--section", help="name of the docs section to replace (default: from the env)")
    tune.set_defaults(func=cmd_tune, bench_command="tune", program=["dppo"], typed=None)


def numbers(text: str | None, kind: type, flag: str) -> list[Any] | None:
    """A comma-separated list of positive numbers (None: not given); bad input is one line."""
    if text is None:
        return None
    try:
        values = [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or any(v <= 0 for v in values):
        fail(f"{flag} takes positive numbers, comma-separated, not {text!r}")
    return values


def cmd_tune(args: argparse.Namespace) -> int:
    import_from_cwd()
    if "tune" in sys.argv:  # the command line as typed, for the docs section
        args.typed = sys.argv[sys.argv.index("tune"):]
    from dppo.config import load_config
    from dppo.envs.checks import check_env
    from dppo.envs.make import with_agents
    from dppo.tune.grid import PLACEMENTS, grid, minibatches_per_epoch

    for flag, value in (("--minutes", args.minutes), ("--full-grid", args.full_grid),
                        ("--max-rss-mib", args.max_rss_mib), ("--max-gpu-mib", args.max_gpu_mib)):
        if value is not None and value <= 0:
            fail(f"{flag} must be above 0, not {value:g}")
    if bool(args.env) == bool(args.config):
        fail("dppo tune needs the env: pass --env ID (its preset) or --config FILE")
    places = None if args.placements is None else [p.strip() for p in args.placements.split(",") if p.strip()]
    if places is not None and (not places or set(places) - set(PLACEMENTS)):
        fail(f"--placements takes {', '.join(PLACEMENTS)}, comma-separated, not {args.placements!r}")
    options = {"actors": numbers(args.actors, int, "--actors"), "envs": numbers(args.envs_per_actor, int,
               "--envs-per-actor"), "segment_lengths": numbers(args.segment_lengths, int, "--segment-lengths"),
               "actor_cpus": numbers(args.actor_cpus, float, "--actor-cpus"), "places": places}
    overrides = {"env.id": args.env, "run.address": args.address}
    base = load_config(args.config, overrides, args.sets)  # bad config: one line, exit 2
    check_env(with_agents(base))  # the env can be made, reset and stepped, before anything is measured
    minibatches = minibatches_per_epoch(base)

    def configure(candidate: Candidate) -> Config:
        return load_config(args.config, overrides, [*args.sets, *candidate.sets(minibatches)])

    out = Path(args.out or f"tune-{base.env.name.replace('/', '_').replace(':', '_')}.yaml")
    if out.exists() and out.is_dir():
        fail(f"--out {str(out)!r} is a directory; name a file")
    import ray

    from dppo.bench.memory import smallest_gpu_mib
    from dppo.distributed.cluster import connect_ray
    from dppo.tune.search import search

    os.environ.setdefault("RAY_IGNORE_UNHANDLED_ERRORS", "1")
    connect_ray(base)
    try:
        cpus, gpus = cluster_size()
        candidates = grid(base, cpus, gpus, **options)
        if not candidates:
            fail("no candidate fits these options on this cluster (each actor's CPUs times the actors must fit "
                 f"its {cpus:g} CPUs); widen --actors or --actor-cpus")
        budget = args.minutes * 60
        max_rss = args.max_rss_mib or 0.8 * total_memory_mib()
        max_gpu = args.max_gpu_mib or (0.9 * gpu if (gpu := smallest_gpu_mib()) else None)
        print(f"tune: {base.env.name}, {len(candidates)} candidates on {cpus:g} CPUs"
              + (f" and {gpus:g} GPUs" if gpus else "") + (f", {args.full_grid:g} s each" if args.full_grid
                                                             else f", {args.minutes:g} minutes"), flush=True)
        results = search(configure, candidates, budget, args.finalists, max_rss, full_seconds=args.full_grid,
                         max_gpu_mib=max_gpu)
    finally:
        ray.shutdown()
    return report(args, base, configure, results, out, minibatches)


def cluster_size() -> tuple[float, float]:
    """The cluster's CPUs, and the most GPUs any one node has (a share must fit on one node)."""
    import ray

    cpus = ray.cluster_resources().get("CPU", 1.0)
    gpus = max((node["Resources"].get("GPU", 0.0) for node in ray.nodes() if node["Alive"]), default=0.0)
    return cpus, gpus


def total_memory_mib() -> float:
    from dppo.bench.memory import read_kib

    return read_kib("/proc/meminfo", "MemTotal:") / 1024 or float("inf")


def report(args: argparse.Namespace, base: Config, configure: Any, results: list[Result], out: Path,
           minibatches: int) -> int:
    """The table; the fastest settings as --set lines and a config file; saved for this machine."""
    from dppo.bench.docs import emit
    from dppo.config.tuned import save
    from dppo.tune.grid import placement_of

    own = next((r for r in results if r.candidate.placement == placement_of(base)
                and (r.candidate.actors, r.candidate.envs_per_actor, r.candidate.segment_length)
                == (base.run.actors, base.env.num_envs, base.ppo.segment_length)), None)
    rows = [row(r, own) for r in results]
    best = next((r for r in results if r.skipped is None and r.steps_per_s > 0), None)
    how = (f"every candidate trained {args.full_grid:g} s (after a warm-up iteration) by the Coordinator `dppo train` "
           "runs" if args.full_grid else "each candidate trained briefly by the Coordinator `dppo train` runs (a "
           "warm-up iteration, then two timed), the fastest few again for the rest of the budget, in turn (twice "
           "over when start-ups are short)")
    note = (f"`dppo tune`: {how}; `train_steps_per_s`: env steps per second of the timed iterations (sampling and "
            "update), over both looks; `vs_config`: over the config's own setting; `sample_s`, `update_s`: medians "
            "per iteration; `rss_mib`: the process tree's peak summed RSS (Ray's processes included); `gpu_mib`: "
            "the peak GPU memory its processes held on this machine (nvidia-smi; - without a GPU); `measured_s`: "
            "start-ups included.")
    key = args.section or f"tune-{base.env.name.split('/')[-1]}" + ("-full-grid" if args.full_grid else "")
    from dppo.bench.common import machine

    title = f"dppo tune, {base.env.name}" + (f", every candidate {args.full_grid:g} s" if args.full_grid
                                             else f", {args.minutes:g} minutes")
    emit(args, rows, COLUMNS, key, title, note, machine())
    if best is None:
        print("dppo: error: no candidate could be measured (each row says why)", file=sys.stderr, flush=True)
        return 1
    chosen = configure(best.candidate)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(chosen.to_yaml())
    sets = " ".join(f"--set {line}" for line in best.candidate.sets(minibatches))
    env = f"--config {args.config}" if args.config else f"--env {base.env.name}"
    print(f"fastest: {best.candidate.name}, {best.steps_per_s:,.0f} env steps/s of training"
          + (f" ({best.steps_per_s / own.steps_per_s:.2f}x the config's own)" if own and own.steps_per_s else ""))
    train = " ".join(["dppo train", env, *(f"--set {line}" for line in args.sets), sets])
    print(f"  dppo train --config {out}\n  {train}", flush=True)
    if args.save:
        at = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        path = save(base.env.name, {"at": at, "candidate": best.candidate.name, "config": str(out.resolve()),
                                    "settings": dict(line.split("=", 1) for line in best.candidate.sets(None)),
                                    "train_steps_per_s": round(best.steps_per_s, 1), "rows": rows})
        print(f"saved for run.inference: auto on this machine: {path}", flush=True)
    return 0


def row(result: Result, own: Result | None) -> dict[str, Any]:
    measured = result.measured
    figures = measured.row() if measured is not None and not measured.error else {}
    ratio = (round(result.steps_per_s / own.steps_per_s, 3) if own is not None and own.steps_per_s
             and result.steps_per_s else None)
    return {"candidate": result.candidate.name, "batch": result.candidate.batch, **figures, "vs_config": ratio,
            "status": result.status}
