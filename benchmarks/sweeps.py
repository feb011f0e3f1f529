"""`python -m benchmarks sweep`: what a `dppo sweep` buys, against plain `dppo train` runs of its base config.

One sweep file, run with `dppo sweep`, then one of three comparisons (``--compare``), each at the same budget
per run:

- ``seeds``: the best config the sweep found, re-trained on fresh seeds, against the base config (the preset) on
  the same seeds: does the search find something better, judged on seeds it never saw;
- ``independent``: the sweep's trials (a PBT population) against as many independent runs of the base config
  with seeds 1..N, the same env steps in all: final population mean and best;
- ``train``: a one-trial sweep against one `dppo train` of the same config: what Tune costs (wall time from
  launch to exit, env steps per second of training).

Every run is evaluated with `dppo eval` (deterministic, seeds no training env saw).
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import yaml

from benchmarks.learn import evaluate_run, train_and_evaluate
from benchmarks.variants import spread
from dppo.bench.common import Row, add_common_args, machine, parse_counts
from dppo.bench.docs import emit
from dppo.bench.runs import timed_subprocess
from dppo.cli_args import positive
from dppo.errors import UsageError
from dppo.run.curves import plot_runs
from dppo.run.run_dir import RunDir


def run_sweep(sweep_file: Path, out_dir: Path, timeout_s: float) -> tuple[float, list[dict[str, str]]]:
    """`dppo sweep` as a subprocess: wall seconds from launch to exit, and its trials.csv rows."""
    cmd = [sys.executable, "-m", "dppo", "sweep", "--config", str(sweep_file), "--out-dir", str(out_dir)]
    wall, _ended_at, _memory = timed_subprocess(cmd, timeout_s)
    with open(out_dir / "trials.csv") as fh:
        return wall, list(csv.DictReader(fh))


def train_config(config_file: Path, seed: int, run_dir: Path, episodes: int, timeout_s: float) -> Row:
    """`dppo train --config FILE --seed S` to its budget, then `dppo eval`."""
    return train_and_evaluate(["--config", str(config_file)], seed, run_dir, episodes, timeout_s)


def group_row(name: str, config: str, runs: list[Row], wall_s: float | None = None) -> Row:
    """One table row for a group of runs: final training return and evaluation, mean +- std and best; ``wall_s``
    the group's launch to exit (default: its runs' summed, for runs one after another)."""
    train = [r["episode_return_mean"] for r in runs]
    evals = [r["eval_return"] for r in runs]
    return {"runs": name, "config": config, "count": len(runs), "env_steps": sum(r["env_steps"] for r in runs),
            "train": spread(train, 1), "train_best": round(max(train), 1), "eval": spread(evals, 1),
            "eval_best": round(max(evals), 1),
            "wall_s": round(sum(r["wall_s"] for r in runs) if wall_s is None else wall_s, 1),
            "per_run": runs}


def trial_runs(sweep_dir: Path, trials: list[dict[str, str]], episodes: int, timeout_s: float) -> list[Row]:
    """The sweep's finished trials as rows like train_config's (their own summary.json, evaluated)."""
    runs = []
    for trial in trials:
        run_dir = sweep_dir / "trials" / trial["trial"]
        if trial["state"] != "TERMINATED" or not (run_dir / "summary.json").is_file():
            continue
        summary = RunDir(run_dir).read_summary()
        runs.append({"trial": trial["trial"], "config": trial["config"], "run_dir": str(run_dir),
                     "env_steps": summary["env_steps"], "episode_return_mean": summary["episode_return_mean"],
                     "train_s": summary["wall_s"], "eval_return": evaluate_run(run_dir, episodes, timeout_s)})
    return runs


def compare_seeds(sweep_dir: Path, base: Path, trials: list[dict[str, str]], seeds: list[int],
                  args: argparse.Namespace) -> list[Row]:
    best = sweep_dir / "best-config.yaml"
    scored = [t for t in trials if t["final_return"]]
    if not best.is_file() or not scored:
        raise RuntimeError(f"the sweep in {sweep_dir} found no best config (no trial reported a return)")
    top = max(scored, key=lambda t: float(t["final_return"]))  # the trial best-config.yaml was written from
    best_trial = f"{top['config']} (trial {top['trial']}: {float(top['final_return']):.1f})"
    found = [train_config(best, s, sweep_dir.parent / "best" / f"seed{s}", args.episodes, args.timeout)
             for s in seeds]
    rows = [group_row("best config, fresh seeds", best_trial, found)]
    if args.baseline == "rerun":
        preset = [train_config(base, s, sweep_dir.parent / "base" / f"seed{s}", args.episodes, args.timeout)
                  for s in seeds]
        rows.append(group_row("base config, same seeds", "-", preset))
    return rows


def compare_independent(sweep_dir: Path, base: Path, sweep_wall: float, trials: list[dict[str, str]],
                        args: argparse.Namespace) -> list[Row]:
    population = trial_runs(sweep_dir, trials, args.episodes, args.timeout)
    independent = [train_config(base, s, sweep_dir.parent / "independent" / f"seed{s}", args.episodes,
                                args.timeout) for s in range(1, len(trials) + 1)]
    return [group_row("sweep trials", "the sweep's scheduler", population, sweep_wall),
            group_row("independent runs", f"base config, seeds 1-{len(trials)}", independent)]


def compare_train(sweep_dir: Path, base: Path, sweep_wall: float, trials: list[dict[str, str]],
                  args: argparse.Namespace) -> list[Row]:
    if len(trials) != 1:
        raise UsageError("--compare train needs a sweep of one trial (trials: 1 and no grid keys)")
    (trial,) = trial_runs(sweep_dir, trials, args.episodes, args.timeout)
    seed = int(yaml.safe_load((Path(trial["run_dir"]) / "config.yaml").read_text())["run"]["seed"])
    plain = train_config(base, seed, sweep_dir.parent / "train", args.episodes, args.timeout)
    rows = []
    for name, run, wall in (("dppo sweep, 1 trial", trial, sweep_wall), ("dppo train", plain, plain["wall_s"])):
        rows.append({"runs": name, "config": trial["config"] or "base", "count": 1, "env_steps": run["env_steps"],
                     "wall_s": round(wall, 1), "train_s": round(run["train_s"], 1),
                     "steps_per_s": round(run["env_steps"] / run["train_s"]),
                     "train": f"{run['episode_return_mean']:.1f}", "eval": f"{run['eval_return']:.1f}",
                     "per_run": [run]})
    return rows


def register(sub: argparse._SubParsersAction) -> None:
    """Add `python -m benchmarks sweep`."""
    bench = sub.add_parser("sweep", help="a dppo sweep against plain runs of its base config: the best config on "
                           "fresh seeds, PBT against independent runs, Tune's overhead")
    bench.add_argument("--config", required=True, type=Path, help="the sweep file")
    bench.add_argument("--compare", required=True, choices=["seeds", "independent", "train"],
                       help="seeds: best config vs base on fresh seeds; independent: trials vs as many "
                       "independent runs; train: a one-trial sweep vs dppo train")
    bench.add_argument("--seeds", default="101,102,103", help="fresh seeds for --compare seeds (default 101,102,103)")
    bench.add_argument("--baseline", choices=["rerun", "none"], default="rerun",
                       help="--compare seeds: also train the base config on the same seeds (rerun), or compare "
                       "with its published figure instead (none: the table has the best config's row only)")
    bench.add_argument("--episodes", type=positive(int, "--episodes"), default=10,
                       help="deterministic evaluation episodes per run (default 10)")
    bench.add_argument("--out-dir", type=Path, help="where the runs go (default runs/bench-sweep-<timestamp>)")
    bench.add_argument("--timeout", type=positive(float, "--timeout"), default=7200.0, help="seconds per run")
    add_common_args(bench, address=False)
    bench.set_defaults(func=cmd_bench_sweep)


def cmd_bench_sweep(args: argparse.Namespace) -> int:
    from dppo.sweep.spec import load_sweep

    sweep = load_sweep(args.config)  # a bad file: one line, before anything runs
    seeds = parse_counts(args.seeds, "--seeds", minimum=0)
    out_dir = (args.out_dir or Path("runs") / f"bench-sweep-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}").resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    base = out_dir / "base-config.yaml"  # the sweep's base config with its `set:`, as a --config file
    config = sweep.trial_config({})
    config.run.run_dir = None
    base.write_text(config.to_yaml())
    info = machine()
    started = time.perf_counter()
    sweep_wall, trials = run_sweep(args.config.resolve(), out_dir / "sweep", args.timeout)
    if args.compare == "seeds":
        rows = compare_seeds(out_dir / "sweep", base, trials, seeds, args)
    elif args.compare == "independent":
        rows = compare_independent(out_dir / "sweep", base, sweep_wall, trials, args)
    else:
        rows = compare_train(out_dir / "sweep", base, sweep_wall, trials, args)
    total = time.perf_counter() - started
    key = args.section or f"sweep-{args.compare}-{config.env.name.replace('/', '_').replace(':', '_')}"
    figure = Path(args.write_docs).parent / f"bench-{key}.png" if args.write_docs else out_dir / f"{key}.png"
    plot_runs([Path(r["run_dir"]) for row in rows for r in row["per_run"]], figure)
    from dppo.sweep.trainable import trial_bundles

    trial_cpus = sum(bundle["CPU"] for bundle in trial_bundles(sweep))
    note = (f"`dppo sweep --config {args.config}` ({len(trials)} trial(s), scheduler {sweep.spec.scheduler.name}, "
            f"at most {sweep.spec.concurrent} at a time, each reserving {trial_cpus:g} Ray CPUs of the local Ray's "
            f"max({os.cpu_count()} cores, one trial); {config.run.total_steps:,} env steps each; sweep wall time "
            f"{sweep_wall:.0f} s), then plain `dppo train --config base-config.yaml` runs (the sweep file's base "
            "with its set:, early stopping off). `train`: the final 100-episode training return, mean +- std over "
            f"the runs; `eval`: `dppo eval`, {args.episodes} deterministic episodes per run; `_best`: the best run; "
            "`wall_s`: launch to exit (of the sweep for its trials; summed over plain runs, one after another). "
            f"The whole benchmark took {total:.0f} s.")
    columns = (["runs", "config", "count", "env_steps", "wall_s", "train_s", "steps_per_s", "train", "eval"]
               if args.compare == "train" else
               ["runs", "config", "count", "env_steps", "train", "train_best", "eval", "eval_best", "wall_s"])
    emit(args, rows, columns, key, f"Sweep ({args.compare}), {config.env.name}", note, info, figure)
    return 0
