"""`python -m benchmarks learn`: the multi-seed learning-results table (what users compare RL libraries by).

Each preset is trained once per seed to its budget with `dppo train` (early stopping off, so every seed
reports at the same step count), its final policy evaluated with `dppo eval` (deterministic, the policy's
mode), and all seeds of an env drawn in one `dppo plot` figure. The table gives mean +- std over seeds of
the last 100 training episodes' return and of the evaluation, with steps and wall time.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

from dppo.bench.common import Row, add_common_args, check_env_id, machine, parse_counts
from dppo.bench.docs import emit
from dppo.bench.runs import run_train
from dppo.cli_args import positive
from dppo.errors import UsageError
from dppo.run.curves import plot_runs

STAGGER_S = 20.0  # seconds between the starts of concurrent runs
EVAL_SEED = 10_000  # evaluation episodes use seeds no training env saw
_MEAN = re.compile(r"mean return (-?[\d.]+(?:e[-+]?\d+)?)")


def evaluate_run(run_dir: Path, episodes: int, timeout_s: float, seed: int | None = EVAL_SEED) -> float:
    """Mean return of `dppo eval` on the run's final checkpoint (``seed`` None: eval's own default seed)."""
    cmd = [sys.executable, "-m", "dppo", "eval", "--checkpoint", str(run_dir), "--episodes", str(episodes),
           *(["--seed", str(seed)] if seed is not None else [])]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    match = _MEAN.search(done.stdout)
    if done.returncode != 0 or match is None:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"`dppo eval --checkpoint {run_dir}` exited {done.returncode}: {last}")
    return float(match.group(1))


def mean_std(values: list[float]) -> dict[str, float]:
    return {"mean": round(statistics.fmean(values), 1),
            "std": round(statistics.stdev(values), 1) if len(values) > 1 else 0.0}


def train_and_evaluate(argv: list[str], seed: int, run_dir: Path, episodes: int, timeout_s: float) -> Row:
    """`dppo train ARGV --seed S` to its budget (early stopping off, ``argv``'s own --set still wins), then
    `dppo eval` of its final policy."""
    row = run_train(["--seed", str(seed), "--set", "run.target_return=null", "--log-format", "json", *argv], run_dir,
                    timeout_s)
    return {**row, "eval_return": evaluate_run(run_dir, episodes, timeout_s), "seed": seed}


def learn_one(env_id: str, seed: int, out_dir: Path, total_steps: int | None, episodes: int, timeout_s: float,
              sets: list[str]) -> Row:
    argv = ["--env", env_id]
    if total_steps is not None:
        argv += ["--total-steps", str(total_steps)]
    for item in sets:
        argv += ["--set", item]
    return train_and_evaluate(argv, seed, out_dir / f"{env_id.replace('/', '_')}-seed{seed}", episodes, timeout_s)


def bench_learn(envs: list[str], seeds: list[int], out_dir: Path, total_steps: int | None = None,
                episodes: int = 10, parallel: int = 1, timeout_s: float = 7200.0,
                sets: list[str] | None = None) -> list[Row]:
    """One row per env: every seed trained to the budget and evaluated."""
    rows = []
    for env_id in envs:
        def one(index: int, seed: int, env_id: str = env_id) -> Row:
            # Concurrent runs that start local Ray heads start STAGGER_S apart: several starting at the same moment
            # on a loaded machine time out ("The current node timed out during startup"). Runs joining a cluster
            # (RAY_ADDRESS, --address) start at once.
            if not os.environ.get("RAY_ADDRESS"):
                time.sleep(STAGGER_S * index if index < parallel else 0.0)
            return learn_one(env_id, seed, out_dir, total_steps, episodes, timeout_s, sets or [])

        with ThreadPoolExecutor(max_workers=parallel) as pool:
            runs = list(pool.map(one, range(len(seeds)), seeds))
        rows.append({
            "env": env_id, "seeds": len(runs), "env_steps": runs[0]["env_steps"],
            "train_return": mean_std([r["episode_return_mean"] for r in runs]),
            "eval_return": mean_std([r["eval_return"] for r in runs]),
            "eval_episodes": episodes, "wall_s": round(statistics.fmean(r["wall_s"] for r in runs), 1),
            "per_seed": [{k: r[k] for k in ("seed", "episode_return_mean", "eval_return", "wall_s", "run_dir")}
                         for r in runs],
        })
    return rows


def _cell_mean_std(row: Row, key: str) -> str:
    value = row[key]
    return f"{value['mean']:.1f} +- {value['std']:.1f}"


def register(sub: argparse._SubParsersAction) -> None:
    """Add `python -m benchmarks learn`."""
    learn = sub.add_parser("learn", help="multi-seed learning results: training and deterministic-eval return")
    learn.add_argument("--env", required=True, help="comma-separated env ids; each uses its preset")
    learn.add_argument("--seeds", default="1,2,3", help="comma-separated seeds (default 1,2,3)")
    learn.add_argument("--total-steps", type=positive(int, "--total-steps"), help="budget (default: the preset's)")
    learn.add_argument("--episodes", type=positive(int, "--episodes"), default=10,
                       help="deterministic evaluation episodes per seed (default 10)")
    learn.add_argument("--parallel", type=positive(int, "--parallel"), default=1,
                       help="runs at once (default 1; each starts its own local Ray unless --address)")
    learn.add_argument("--out-dir", type=Path, help="where the runs go (default runs/bench-learn-<timestamp>)")
    learn.add_argument("--timeout", type=positive(float, "--timeout"), default=7200.0, help="seconds per run")
    learn.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                       help="config override for every run (repeatable)")
    add_common_args(learn)
    learn.set_defaults(func=cmd_learn)


def cmd_learn(args: argparse.Namespace) -> int:
    envs = [check_env_id(e.strip()) for e in args.env.split(",") if e.strip()]
    if not envs:
        raise UsageError("--env needs at least one env id, e.g. --env CartPole-v1,Pendulum-v1")
    seeds = parse_counts(args.seeds, "--seeds", minimum=0)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    out_dir = args.out_dir or Path("runs") / f"bench-learn-{stamp}"
    info = machine()
    if args.address:
        os.environ["RAY_ADDRESS"] = args.address  # every run joins it
    rows = bench_learn(envs, seeds, out_dir, args.total_steps, args.episodes, args.parallel, args.timeout, args.sets)
    for row in rows:
        key = args.section or f"learn-{row['env'].replace('/', '_')}"
        figure = (Path(args.write_docs).parent / f"bench-{key}.png" if args.write_docs
                  else out_dir / f"{key}.png")
        plot_runs([Path(r["run_dir"]) for r in row["per_seed"]], figure)
        row["train"], row["eval"] = _cell_mean_std(row, "train_return"), _cell_mean_std(row, "eval_return")
        per_seed = ", ".join(f"seed {r['seed']}: {r['episode_return_mean']:.1f} / {r['eval_return']:.1f}"
                             for r in row["per_seed"])
        note = (f"`train`: mean +- std over seeds of the last 100 training episodes' return at the budget; "
                f"`eval`: of `dppo eval` ({row['eval_episodes']} deterministic episodes per seed, seeds from "
                f"{EVAL_SEED}). Early stopping off. `wall_s`: mean launch-to-exit time of one run. Per seed "
                f"(train / eval): {per_seed}.")
        columns = ["env", "seeds", "env_steps", "train", "eval", "wall_s"]
        emit(args, [row], columns, key, f"Learning results, {row['env']}", note, info, figure)
    return 0

