"""`dppo bench score`: time to score, the figure that says what more actors buy: wall-clock time to each return
threshold for each actor count, and where an iteration's time went.

Each actor count is one `dppo train` run of the env's preset (early stopping off) to a step budget or a
training-time limit. From its progress.jsonl: the wall-clock seconds and env steps at which the 100-episode mean
return first reached each threshold; training throughput; the rate the actors sampled at in the same run
(env steps over the actors' own sampling time: what sampling alone would give), and the ratio of the two; and
the mean seconds per iteration of each phase (sync: the weights out; sample: the slowest actor's sampling;
wait: the rest of the gather, transfer included; update; checkpoint). The figure is the return against
wall-clock time and env steps, one curve per actor count.
"""

from __future__ import annotations

import argparse
import statistics
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dppo.bench.common import Row, add_common_args, check_env_id, machine, parse_counts
from dppo.bench.docs import emit
from dppo.bench.runs import run_train
from dppo.cli_args import positive
from dppo.errors import UsageError
from dppo.run.curves import plot_runs
from dppo.run.run_dir import RunDir

PHASES = ("sync", "sample", "wait", "update", "checkpoint", "env", "inference")


def parse_thresholds(text: str) -> list[float]:
    try:
        values = sorted(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UsageError(f"--thresholds {text!r} is not a comma-separated list of returns, e.g. 100,200,475") from None
    if not values:
        raise UsageError("--thresholds needs at least one return, e.g. 100,200,475")
    return values


def time_to_scores(records: list[dict[str, Any]], thresholds: list[float]) -> dict[str, dict[str, float] | None]:
    """For each threshold, the wall seconds and env steps of the first iteration whose mean return reached it."""
    reached: dict[str, dict[str, float] | None] = {}
    for threshold in thresholds:
        first = next((r for r in records if (r.get("episode_return_mean") is not None
                                             and r["episode_return_mean"] >= threshold)), None)
        reached[f"{threshold:g}"] = None if first is None else {"wall_s": first["wall_s"],
                                                                "env_steps": first["env_steps"]}
    return reached


def iteration_breakdown(records: list[dict[str, Any]]) -> Row:
    """Throughput, the actors' own sampling rate in the same run, and the mean seconds of each phase."""
    steps = sum(r["env_steps_delta"] for r in records)
    sampling_s = sum(r["sample_s"] for r in records)
    train_s = records[-1]["wall_s"]
    steps_per_s = steps / train_s if train_s else None
    sampling_rate = steps / sampling_s if sampling_s else None
    return {"steps_per_s": round(steps_per_s, 1) if steps_per_s else None,
            "sampling_steps_per_s": round(sampling_rate, 1) if sampling_rate else None,
            "of_sampling": round(steps_per_s / sampling_rate, 3) if steps_per_s and sampling_rate else None,
            **{f"{phase}_s": round(statistics.fmean(r.get(f"{phase}_s") or 0.0 for r in records), 4)
               for phase in PHASES}}


def bench_score(env_id: str, actor_counts: list[int], thresholds: list[float], out_dir: Path,
                total_steps: int | None, time_limit_s: float | None, seed: int, sets: list[str],
                address: str | None, timeout_s: float) -> list[Row]:
    rows = []
    for count in actor_counts:
        run_dir = out_dir / f"actors{count}"
        if run_dir.exists():
            raise UsageError(f"{run_dir} already exists; pass another --out-dir or remove it")
        argv = ["--env", env_id, "--actors", str(count), "--seed", str(seed), "--set", "run.target_return=null",
                "--no-tensorboard", *(arg for item in sets for arg in ("--set", item))]
        if total_steps is not None:
            argv += ["--total-steps", str(total_steps)]
        if time_limit_s is not None:
            argv += ["--time-limit", str(time_limit_s)]
        if address:
            argv += ["--address", address]
        run = run_train(argv, run_dir, timeout_s)
        records = RunDir(run_dir).read_progress()
        reached = time_to_scores(records, thresholds)
        rows.append({"actors": count, "env_steps": run["env_steps"], "train_s": run["train_s"],
                     "final_return": run["episode_return_mean"],
                     **{f"to_{t}_s": None if at is None else at["wall_s"] for t, at in reached.items()},
                     **{f"to_{t}_steps": None if at is None else at["env_steps"] for t, at in reached.items()},
                     **iteration_breakdown(records), "run_dir": str(run_dir)})
    return rows


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("score", help="wall-clock time to return thresholds per actor count, and where an "
                            "iteration's time goes")
    parser.add_argument("--env", default="CartPole-v1", help="env id; its preset is used (default CartPole-v1)")
    parser.add_argument("--actors", default="1,8,16", help="comma-separated actor counts (default 1,8,16)")
    parser.add_argument("--thresholds", default=None, help="returns to time (default: the preset's target return "
                        "and its half and quarter)")
    parser.add_argument("--total-steps", type=positive(int, "--total-steps"), help="budget (default: the preset's)")
    parser.add_argument("--time-limit", type=positive(float, "--time-limit"), help="seconds of training per run")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out-dir", type=Path, help="where the runs go (default runs/bench-score-<timestamp>)")
    parser.add_argument("--figure", type=Path, help="return against wall-clock time (default docs/bench-<section>.png "
                        "with --write-docs, else <out-dir>/score.png)")
    parser.add_argument("--timeout", type=positive(float, "--timeout"), default=7200.0, help="seconds per run")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="config override for every run (repeatable)")
    add_common_args(parser)
    parser.set_defaults(func=cmd_score)


def default_thresholds(env_id: str, sets: list[str]) -> list[float]:
    from dppo.config import load_config

    target = load_config(overrides={"env.id": env_id}, sets=sets).run.target_return
    if target is None:
        raise UsageError(f"the {env_id} preset has no target return: pass --thresholds, e.g. --thresholds 10,20,40")
    return [round(target / 4, 3), round(target / 2, 3), target]


def cmd_score(args: argparse.Namespace) -> int:
    env_id = check_env_id(args.env)
    counts = parse_counts(args.actors)
    thresholds = parse_thresholds(args.thresholds) if args.thresholds else default_thresholds(env_id, args.sets)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    out_dir = args.out_dir or Path("runs") / f"bench-score-{stamp}"
    info = machine()
    rows = bench_score(env_id, counts, thresholds, out_dir, args.total_steps, args.time_limit, args.seed, args.sets,
                       args.address, args.timeout)
    key = args.section or f"score-{env_id.replace('/', '_')}"
    figure = args.figure or (Path(args.write_docs).parent / f"bench-{key}.png" if args.write_docs
                             else out_dir / "score.png")
    plot_runs([Path(row["run_dir"]) for row in rows], figure)
    print(f"figure: {figure}", flush=True)
    shown = [f"{t:g}" for t in thresholds]
    note = ("One `dppo train` run per actor count (the preset, early stopping off). `to_R_s` / `to_R_steps`: "
            "wall-clock seconds of training and env steps when the 100-episode mean return first reached R (- when "
            "it did not). `steps_per_s`: env steps per second of training; `sampling_steps_per_s`: env steps over "
            "the actors' own sampling time in the same run (what sampling alone would reach); `of_sampling`: the "
            "first over the second. `*_s` per phase: mean seconds per iteration (sync: weights out; sample: the "
            "slowest actor's sampling; wait: the rest of the gather, transfer included; update; checkpoint).")
    columns = ["actors", "env_steps", "train_s", "final_return", *(f"to_{t}_s" for t in shown),
               *(f"to_{t}_steps" for t in shown), "steps_per_s", "sampling_steps_per_s", "of_sampling",
               *(f"{p}_s" for p in PHASES)]
    actors = " vs ".join(str(c) for c in counts)
    emit(args, rows, columns, key, f"Time to score, {env_id}, {actors} actors", note, info, figure)
    return 0
