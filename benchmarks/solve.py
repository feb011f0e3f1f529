"""`python -m benchmarks solve`: wall-clock time and env steps to the target return, per actor count.

What a user waits for is a whole `dppo train`, start-up and exit included, so each run is a subprocess
timed from launch to exit, with its process tree's peak memory; optionally beside Stable-Baselines3's
single-process PPO on the same preset (:mod:`benchmarks.reference`), timed the same way.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path

from dppo.bench.common import Row, add_common_args, check_env_id, machine, parse_counts
from dppo.bench.docs import emit
from dppo.bench.runs import memory_cells, run_train, timed_subprocess
from dppo.cli_args import positive
from dppo.errors import UsageError
from dppo.markdown import table
from dppo.run.curves import plot_runs

REFERENCE_SCRIPT = Path(__file__).with_name("reference.py")  # run as a script: it needs only dppo


def run_reference(env_id: str, seed: int, envs: int, out_dir: Path, timeout_s: float,
                  sets: list[str] | None = None) -> Row:
    """Stable-Baselines3's PPO on the same preset in one process (benchmarks/reference.py), timed as run_train."""
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        raise UsageError("--reference needs Stable-Baselines3 in this environment: pip install 'dppo[bench]'") from None
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"reference-seed{seed}.json"
    cmd = [sys.executable, str(REFERENCE_SCRIPT), "--env", env_id, "--seed", str(seed), "--envs", str(envs),
           "--out", str(out), *(arg for item in sets or [] for arg in ("--set", item))]
    wall, _ended_at, memory = timed_subprocess(cmd, timeout_s)
    summary = json.loads(out.read_text())
    return {"wall_s": round(wall, 2), "train_s": summary["train_s"], "startup_s": summary["startup_s"],
            "env_steps": summary["env_steps"], "solved": summary["solved"],
            "episode_return_mean": summary["episode_return_mean"], **memory_cells(memory)}


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2), "max": round(max(values), 2)}


def _solve_row(env_id: str, actors: int | str, runs: list[Row], keys: tuple[str, ...]) -> Row:
    """Median (min-max) over the seeds of each key, the solved count, and the runs themselves."""
    return {"env": env_id, "actors": actors, "repeats": len(runs), "solved": sum(r["solved"] for r in runs),
            **{key: _spread([r[key] for r in runs]) for key in keys}, "runs": runs}


def bench_solve(actor_counts: list[int], env_id: str = "CartPole-v1", repeats: int = 3, seed: int = 1,
                out_dir: Path = Path("runs/bench-solve"), address: str | None = None,
                sets: list[str] | None = None, timeout_s: float = 600.0, reference: bool = False) -> list[Row]:
    """Rows per actor count: wall time (launch to exit) and env steps to the target, median and range. With
    ``reference``, first a row of Stable-Baselines3's single-process PPO on the same preset, overrides and
    seeds, and every row's ``vs_reference`` = its median wall time over the reference's (same run, same machine)."""
    from dppo.config import load_config

    common = ("wall_s", "train_s", "startup_s", "env_steps", "peak_rss_mib", "peak_pss_mib")
    rows = []
    if reference:
        preset = load_config(overrides={"env.id": env_id}, sets=sets)
        envs = preset.run.actors * preset.env.num_envs
        runs = [run_reference(env_id, seed + r, envs, out_dir, timeout_s, sets) for r in range(repeats)]
        rows.append({**_solve_row(env_id, f"SB3 PPO, 1 process, {envs} envs", runs, common), "vs_reference": 1.0})
    for count in actor_counts:
        runs = []
        for r in range(repeats):
            run_dir = out_dir / f"actors{count}-seed{seed + r}"
            if run_dir.exists():
                raise UsageError(f"{run_dir} already exists; pass another --out-dir or remove it")
            argv = ["--env", env_id, "--actors", str(count), "--seed", str(seed + r),
                    *(arg for item in sets or [] for arg in ("--set", item))]
            if address:
                argv += ["--address", address]
            runs.append(run_train(argv, run_dir, timeout_s))
        row = _solve_row(env_id, count, runs, (*common, "exit_s"))
        row["first_iteration_s"] = _spread([r["first_iteration_s"] or 0.0 for r in runs])  # None: no iteration ran
        row["phases"] = {k: round(statistics.median(r["phases"][k] for r in runs), 3) for k in runs[0]["phases"]}
        if reference:
            row["vs_reference"] = round(row["wall_s"]["median"] / rows[0]["wall_s"]["median"], 3)
        rows.append(row)
    return rows


def register(sub: argparse._SubParsersAction) -> None:
    """Add `python -m benchmarks solve`."""
    solve = sub.add_parser("solve", help="wall-clock time and env steps to the target return per actor count")
    solve.add_argument("--env", default="CartPole-v1", help="gymnasium env id (default CartPole-v1)")
    solve.add_argument("--actors", default="1,8", help="comma-separated actor counts (default 1,8)")
    solve.add_argument("--repeats", type=positive(int, "--repeats"), default=3, help="seeds per actor count")
    solve.add_argument("--seed", type=int, default=1, help="first seed (repeats use seed, seed+1, ...)")
    solve.add_argument("--out-dir", type=Path, help="where the runs go (default runs/bench-solve-<timestamp>)")
    solve.add_argument("--figure", type=Path, help="the return-vs-time figure (default: docs/bench-<section>.png "
                       "with --write-docs, else <out-dir>/solve.png)")
    solve.add_argument("--timeout", type=positive(float, "--timeout"), default=600.0, help="seconds per run")
    solve.add_argument("--reference", action="store_true",
                       help="also time Stable-Baselines3's single-process PPO on the same preset and seeds "
                       "(pip install 'dppo[bench]')")
    solve.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                       help="config override passed to every `dppo train` (repeatable)")
    add_common_args(solve)
    solve.set_defaults(func=cmd_solve)


def cmd_solve(args: argparse.Namespace) -> int:
    counts = parse_counts(args.actors)
    env_id = check_env_id(args.env)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    out_dir = args.out_dir or Path("runs") / f"bench-solve-{stamp}"
    info = machine()
    rows = bench_solve(counts, env_id, args.repeats, args.seed, out_dir, args.address, args.sets, args.timeout,
                       args.reference)
    ours = rows[1:] if args.reference else rows  # dppo's rows
    key = args.section or f"solve-{env_id}"
    figure = args.figure or (Path(args.write_docs).parent / f"bench-{key}.png" if args.write_docs
                             else out_dir / "solve.png")
    plot_runs([Path(row["runs"][0]["run_dir"]) for row in ours], figure)  # the first seed of each actor count
    print(f"figure: {figure}", flush=True)
    note = ("Each run is a `dppo train` subprocess: `wall_s` is from launch to exit (imports, Ray start-up, "
            "actor start and shutdown included), `train_s` the training loop alone (summary.json). Cells: "
            "median (min-max) over the seeds. Peak memory: summed RSS / PSS over the run's whole process tree "
            "(driver, actors, Ray's own processes), sampled every 0.5 s. The figure shows the first seed of "
            "each actor count.")
    columns = ["actors", "repeats", "solved", "wall_s", "startup_s", "train_s", "first_iteration_s", "exit_s",
               "env_steps", "peak_rss_mib", "peak_pss_mib"]
    phase_names = list(ours[0]["phases"])
    note += ("\n\nStart-up, phase by phase (median seconds; `launch`: interpreter and CLI load until `dppo train` "
             "runs, `config`: config, preset and env check, `ray_init`: the local Ray start or the join, with the "
             "learner built beside it in a helper thread (torch's import, model, optimizer), `learner`: what was "
             "left of that build once Ray was up (with several learners, which need Ray, all of it), "
             "`actors_ready`: spawn every actor and "
             "wait until it has made its envs; then `first_iteration_s` of training, the first weights and "
             "segments, and `exit_s` from summary.json to the process's end):\n\n"
             + table([{"actors": r["actors"], **r["phases"]} for r in ours], ["actors", *phase_names]))
    if args.reference:
        columns.insert(4, "vs_reference")
        note += ("\n\nThe first row is the reference: Stable-Baselines3's PPO in one process with the same preset "
                 "(same envs in all, segment length, epochs, minibatch, learning-rate schedule, gamma, lambda, clip, "
                 "coefficients, network; SB3's own target-KL rule) until the same target over its last 100 "
                 "episodes (benchmarks/reference.py); `vs_reference` = median wall time over the reference's.")
    actors = " vs ".join(str(c) for c in counts) + (" actor" if counts == [1] else " actors")
    emit(args, rows, columns, key, f"Time to solve {env_id}, {actors}", note, info, figure)
    return 0
