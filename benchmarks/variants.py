"""`python -m benchmarks variants`: one env, several config variants side by side (a mask on or off, an LSTM or not,
evaluation while training on or off).

Each variant is trained once per seed to the same budget with `dppo train` (as `python -m benchmarks learn` does) and
evaluated with `dppo eval`; the row adds the env steps each seed took to first reach ``--solved-at`` (the
100-episode training mean) and what one actor pays per env step with that variant's policy (a Sampler in this
process, one thread: inference, env step and bookkeeping).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

from benchmarks.learn import EVAL_SEED, learn_one
from dppo.bench.common import Row, add_common_args, check_env_id, machine, parse_counts, torch_threads
from dppo.bench.docs import emit
from dppo.cli_args import positive
from dppo.errors import UsageError
from dppo.run.curves import plot_runs


def parse_variant(text: str) -> tuple[str, list[str]]:
    """``NAME`` or ``NAME:KEY=VALUE,KEY=VALUE`` -> (name, overrides); a comma inside a value's brackets or braces
    is the value's (``env.wrappers=[a,b]``)."""
    name, _, sets = text.partition(":")
    items = [s.strip() for s in top_level_split(sets) if s.strip()]
    if not name.strip() or any("=" not in item for item in items):
        raise UsageError(f"--variant {text!r} is not NAME or NAME:KEY=VALUE[,KEY=VALUE]; e.g. "
                         "--variant lstm:model.recurrent=lstm")
    return name.strip(), items


def top_level_split(text: str) -> list[str]:
    """``text`` split at the commas outside any [...] or {...}."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "{": 1, "]": -1, "}": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return [*parts, text[start:]]


def spread(values: list[float], digits: int = 3) -> str:
    """mean +- std over seeds, to 3 decimals by default (toy envs' returns are small numbers)."""
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.{digits}f} +- {std:.{digits}f}"


def steps_to_reach(run_dir: Path, level: float) -> int | None:
    """The env steps at the first iteration whose 100-episode mean return reached ``level`` (None: never)."""
    for line in (run_dir / "progress.jsonl").read_text().splitlines():
        record = json.loads(line)
        mean = record.get("episode_return_mean")
        if mean is not None and mean >= level:
            return int(record["env_steps"])
    return None


def actor_us_per_step(env_id: str, sets: list[str], segments: int = 5) -> float:
    """Microseconds per env step of one Sampler with the variant's policy (random weights), after a warm-up."""
    from dppo.config import load_config
    from dppo.rl.joint import local_sampler

    config = load_config(overrides={"env.id": env_id}, sets=sets)
    with torch_threads(1):
        sampler = local_sampler(config)
        sampler.sample()
        start = time.perf_counter()
        for _ in range(segments):
            sampler.sample()
        elapsed = time.perf_counter() - start
        sampler.close()
    return 1e6 * elapsed / (segments * config.ppo.segment_length * config.env.num_envs)


def variant_row(env_id: str, name: str, own: list[str], seeds: list[int], out_dir: Path, args: argparse.Namespace
                ) -> Row:
    """``own``: the variant's overrides, applied after the common ``--set`` ones."""
    sets = [*args.sets, *own]
    runs = [learn_one(env_id, seed, out_dir / name, args.total_steps, args.episodes, args.timeout, sets)
            for seed in seeds]
    reached = [steps_to_reach(Path(r["run_dir"]), args.solved_at) for r in runs] if args.solved_at is not None else []
    solved = [s for s in reached if s is not None]
    return {
        "env": env_id, "variant": name, "overrides": " ".join(own) or "-", "seeds": len(runs),
        "env_steps": runs[0]["env_steps"], "train": spread([r["episode_return_mean"] for r in runs]),
        "eval": spread([r["eval_return"] for r in runs]),
        "solved": f"{len(solved)}/{len(runs)}" if args.solved_at is not None else None,
        "steps_to_solve": int(statistics.median(solved)) if solved else None,
        "train_steps_per_s": round(statistics.fmean(r["env_steps"] / r["train_s"] for r in runs)),
        "actor_us_per_step": round(actor_us_per_step(env_id, sets), 1),
        "wall_s": round(statistics.fmean(r["wall_s"] for r in runs), 1),
        "per_seed": [{**{k: r[k] for k in ("seed", "episode_return_mean", "eval_return", "wall_s", "run_dir")},
                      "steps_to_solve": s} for r, s in zip(runs, reached or [None] * len(runs), strict=True)],
    }


def register(sub: argparse._SubParsersAction) -> None:
    """Add `python -m benchmarks variants`."""
    bench = sub.add_parser("variants", help="config variants of one env side by side: return, steps to solve, "
                           "actor cost per step")
    bench.add_argument("--env", required=True, help="env id (its preset is the base of every variant)")
    bench.add_argument("--variant", dest="variants", action="append", required=True, metavar="NAME[:KEY=VALUE,...]",
                       help="a variant and its config overrides (repeatable), e.g. lstm:model.recurrent=lstm; a "
                       "value's own commas go inside brackets: shared:env.wrappers=[a:b,c:d]")
    bench.add_argument("--seeds", default="1,2,3", help="comma-separated seeds (default 1,2,3)")
    bench.add_argument("--total-steps", type=positive(int, "--total-steps"), help="budget (default: the preset's)")
    bench.add_argument("--solved-at", type=float, help="report the env steps to first reach this training return")
    bench.add_argument("--episodes", type=positive(int, "--episodes"), default=10,
                       help="deterministic evaluation episodes per seed (default 10)")
    bench.add_argument("--out-dir", type=Path, help="where the runs go (default runs/bench-variants-<timestamp>)")
    bench.add_argument("--timeout", type=positive(float, "--timeout"), default=7200.0, help="seconds per run")
    bench.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                       help="config override for every variant (repeatable)")
    add_common_args(bench)
    bench.set_defaults(func=cmd_variants)


def cmd_variants(args: argparse.Namespace) -> int:
    env_id = check_env_id(args.env)
    variants = [parse_variant(v) for v in args.variants]
    if len({name for name, _ in variants}) != len(variants):
        raise UsageError("--variant names must differ; name each one, e.g. --variant mask --variant no-mask:...")
    seeds = parse_counts(args.seeds, "--seeds", minimum=0)
    out_dir = args.out_dir or Path("runs") / f"bench-variants-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}"
    info = machine()
    if args.address:
        os.environ["RAY_ADDRESS"] = args.address  # every run joins it
    rows = [variant_row(env_id, name, sets, seeds, out_dir, args) for name, sets in variants]
    key = args.section or f"variants-{env_id.replace('/', '_')}"
    figure = Path(args.write_docs).parent / f"bench-{key}.png" if args.write_docs else out_dir / f"{key}.png"
    plot_runs([Path(r["run_dir"]) for row in rows for r in row["per_seed"]], figure)
    note = (f"Each variant trained once per seed to the same budget (early stopping off); `train`: mean +- std over "
            f"seeds of the last 100 training episodes' return; `eval`: of `dppo eval` ({args.episodes} deterministic "
            f"episodes per seed, seeds from {EVAL_SEED}); `solved`: seeds whose training return reached "
            f"{args.solved_at}, `steps_to_solve` the median env steps they took; `actor_us_per_step`: one actor "
            "(a Sampler, one thread, random weights) per env step; `train_steps_per_s`: env steps over training time "
            "(start-up excluded), mean over seeds; `wall_s`: mean launch-to-exit time of a run. "
            f"Every variant: {' '.join(args.sets) or 'the preset (the defaults for an env without one)'}.")
    columns = ["variant", "overrides", "seeds", "env_steps", "train", "eval", "solved", "steps_to_solve",
               "train_steps_per_s", "actor_us_per_step", "wall_s"]
    emit(args, rows, columns, key, f"Variants, {env_id}", note, info, figure)
    return 0
