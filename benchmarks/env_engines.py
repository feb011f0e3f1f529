"""`python -m benchmarks envs`: Atari env steps per second of the two C++ vector envs, ale-py's and EnvPool's.

Which engine steps Atari faster per core decides what ``env.vectorization: ale`` is built on, so both are
measured the way dppo steps them (random actions from one batch per step, every env stepped each call, EnvPool
in its synchronous mode: batch = all envs) with the same preprocessing (:mod:`dppo.envs.atari`). Repeats of
the two engines alternate, so the load of a shared machine falls on both alike. A second table checks the
semantics that matter to learning: the same seed's episodes under random actions, lives and life losses in
``info``, raw (unclipped) rewards, observation shape and dtype, and how much the first frames agree.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from dppo.bench.common import Row, add_common_args, check_env_id, machine, parse_counts
from dppo.bench.docs import emit
from dppo.cli_args import positive
from dppo.errors import UsageError
from dppo.markdown import table

ENGINES = ("ale", "envpool")


def make_engine(engine: str, env_id: str, num_envs: int, threads: int, seed: int) -> Any:
    """A vector env of ``engine``, reset with ``seed`` (EnvPool takes its seed when made)."""
    from dppo.envs.atari import ale_vector_env, envpool_vector_env

    if engine == "ale":
        envs = ale_vector_env(env_id, num_envs, threads)
        return envs, envs.reset(seed=seed)
    envs = envpool_vector_env(env_id, num_envs, threads, seed)
    return envs, envs.reset()


def _time_steps(envs: Any, actions: np.ndarray) -> tuple[float, float]:
    """Env steps per second of wall-clock and per CPU-second of this process (all its threads) over ``actions``
    (vector steps x envs). CPU time is what one core buys, and what the load of a shared machine distorts least."""
    start, cpu = time.perf_counter(), time.process_time()
    for action in actions:
        envs.step(action)
    return actions.size / (time.perf_counter() - start), actions.size / (time.process_time() - cpu)


def spread(values: list[float]) -> dict[str, float]:
    """``{median, min, max}`` (the docs print it as ``median (min-max)``)."""
    return {"median": round(statistics.median(values), 1), "min": round(min(values), 1), "max": round(max(values), 1)}


def bench_speed(engines: list[str], env_id: str, thread_counts: list[int], env_counts: list[int], steps: int,
                warmup: int, repeats: int, seed: int = 1) -> list[Row]:
    """One row per engine, thread count and number of envs: env steps/s over ``repeats`` timed blocks of
    ``steps`` env steps each, after ``warmup`` env steps; the engines' blocks alternate."""
    rows: list[Row] = []
    rng = np.random.default_rng(seed)
    for threads in thread_counts:
        for num_envs in env_counts:
            made = {e: make_engine(e, env_id, num_envs, threads, seed)[0] for e in engines}
            n_actions = made[engines[0]].single_action_space.n
            try:
                for envs in made.values():
                    _time_steps(envs, rng.integers(0, n_actions, (max(1, warmup // num_envs), num_envs)))
                rates: dict[str, list[float]] = {e: [] for e in engines}
                cpu_rates: dict[str, list[float]] = {e: [] for e in engines}
                for _ in range(repeats):
                    actions = rng.integers(0, n_actions, (max(1, steps // num_envs), num_envs))
                    for engine, envs in made.items():
                        wall, cpu = _time_steps(envs, actions)
                        rates[engine].append(wall)
                        cpu_rates[engine].append(cpu)
            finally:
                for envs in made.values():
                    envs.close()
            base = statistics.median(rates[engines[0]])
            cpu_base = statistics.median(cpu_rates[engines[0]])
            for engine in engines:
                median, cpu_median = statistics.median(rates[engine]), statistics.median(cpu_rates[engine])
                rows.append({"engine": engine, "threads": threads, "envs": num_envs,
                             "steps_per_s": spread(rates[engine]), "per_thread": round(median / threads, 1),
                             f"vs_{engines[0]}": round(median / base, 3),
                             "steps_per_cpu_s": spread(cpu_rates[engine]),
                             f"cpu_vs_{engines[0]}": round(cpu_median / cpu_base, 3)})
    return rows


def run_episodes(engine: str, env_id: str, num_envs: int, episodes: int, seed: int, max_steps: int) -> Row:
    """Random actions (seeded) until ``episodes`` full games end or ``max_steps`` vector steps pass: returns,
    lengths, rewards, lives. EnvPool's NEXT_STEP autoreset spends one ignored step per ended episode: not
    counted."""
    envs, (obs, info) = make_engine(engine, env_id, num_envs, 1, seed)
    rng = np.random.default_rng(seed)
    returns, lengths = np.zeros(num_envs), np.zeros(num_envs, np.int64)
    finished_returns: list[float] = []
    finished_lengths: list[int] = []
    lives, start_lives = np.asarray(info["lives"]), int(np.max(info["lives"]))
    life_losses, end_lives, max_reward, truncations = 0, set(), 0.0, 0
    resetting = np.zeros(num_envs, bool)  # EnvPool: this step only resets these envs
    first = np.asarray(obs)[0]
    first_frame = first[-1].copy()
    reset_stack = "zeros" if not first[0].any() else "copies" if (first == first[-1]).all() else "other"
    try:
        for _ in range(max_steps):
            obs, reward, terminated, truncated, info = envs.step(rng.integers(0, envs.single_action_space.n, num_envs))
            live = ~resetting
            now = np.asarray(info["lives"])
            done = (terminated | truncated) & live
            life_losses += int(np.sum((now < lives) & live & ~done))
            returns[live] += reward[live]
            lengths[live] += 1
            max_reward = max(max_reward, float(np.max(reward)))
            truncations += int(np.sum(truncated & live))
            for i in np.flatnonzero(done):
                finished_returns.append(float(returns[i]))
                finished_lengths.append(int(lengths[i]))
                end_lives.add(int(lives[i]))  # ale-py's SAME_STEP info holds the next game's lives already
            lives = now
            returns[done], lengths[done] = 0.0, 0
            resetting = done if engine == "envpool" else np.zeros(num_envs, bool)
            if len(finished_returns) >= episodes:
                break
    finally:
        envs.close()
    if not finished_returns:
        raise UsageError(f"no episode of {env_id} ended within {max_steps} steps; raise --check-steps")
    return {"engine": engine, "envs": num_envs, "episodes": len(finished_returns),
            "return": spread(finished_returns), "return_mean": round(float(np.mean(finished_returns)), 2),
            "length": spread(finished_lengths), "length_mean": round(float(np.mean(finished_lengths)), 1),
            "max_step_reward": max_reward, "start_lives": start_lives,
            "lives_before_end": ",".join(map(str, sorted(end_lives))), "life_losses_in_info": life_losses,
            "truncations": truncations, "obs": f"{tuple(np.asarray(obs).shape[1:])} {np.asarray(obs).dtype}",
            "reset_stack": reset_stack, "first_frame": first_frame}


def check_semantics(engines: list[str], env_id: str, num_envs: int, episodes: int, seed: int,
                    max_steps: int) -> list[Row]:
    """One row per engine; ``same_first_frame`` is the share of pixels of env 0's first frame equal to the
    first engine's (the no-op count is random in each, so the ball may differ; the resize should not)."""
    rows = [run_episodes(e, env_id, num_envs, episodes, seed, max_steps) for e in engines]
    reference = rows[0]["first_frame"]
    for row in rows:
        frame = row.pop("first_frame")
        row["same_first_frame"] = round(float(np.mean(frame == reference)), 3)
    return rows


SPEED_COLUMNS = ["engine", "threads", "envs", "steps_per_s", "per_thread"]
CHECK_COLUMNS = ["engine", "envs", "episodes", "return", "return_mean", "length", "length_mean", "max_step_reward",
                 "start_lives", "lives_before_end", "life_losses_in_info", "truncations", "obs", "reset_stack",
                 "same_first_frame"]


def register(sub: argparse._SubParsersAction) -> None:
    """Add `python -m benchmarks envs`."""
    envs = sub.add_parser("envs", help="Atari env steps/s: ale-py's vector env against EnvPool's, same preprocessing")
    envs.add_argument("--env", default="ALE/Breakout-v5", help="ALE/ id (default ALE/Breakout-v5)")
    envs.add_argument("--engines", default=",".join(ENGINES), help="comma-separated, of ale,envpool (default both)")
    envs.add_argument("--threads", default="1,2", help="comma-separated thread counts per vector env (default 1,2)")
    envs.add_argument("--envs", default="8,16", help="comma-separated numbers of envs per vector env (default 8,16)")
    envs.add_argument("--steps", type=positive(int, "--steps"), default=10_000,
                      help="env steps per timed block (default 10000)")
    envs.add_argument("--warmup", type=positive(int, "--warmup"), default=1_000,
                      help="env steps before timing (default 1000)")
    envs.add_argument("--repeats", type=positive(int, "--repeats"), default=5, help="timed blocks per row (default 5)")
    envs.add_argument("--check-episodes", type=positive(int, "--check-episodes"), default=32,
                      help="full games per engine in the semantics table (default 32)")
    envs.add_argument("--check-steps", type=positive(int, "--check-steps"), default=20_000,
                      help="at most this many vector steps per engine for them (default 20000)")
    envs.add_argument("--seed", type=int, default=1, help="seed of the envs and the random actions (default 1)")
    add_common_args(envs, address=False)
    envs.set_defaults(func=cmd_envs)


def verdict(rows: list[Row], engines: list[str]) -> str:
    """One sentence: each other engine's median CPU-second rate over the first's, across the rows."""
    parts = []
    for engine in engines[1:]:
        ratios = [r[f"cpu_vs_{engines[0]}"] for r in rows if r["engine"] == engine]
        parts.append(f"{engine} steps {statistics.median(ratios):.2f}x as many env steps per CPU-second as "
                     f"{engines[0]} (median over its {len(ratios)} rows, {min(ratios):.2f}-{max(ratios):.2f})")
    return "; ".join(parts) + "." if parts else ""


def parse_engines(text: str) -> list[str]:
    """"ale,envpool" -> ["ale", "envpool"]; anything else a usage error."""
    engines = [part.strip() for part in text.split(",") if part.strip()]
    if not engines or any(e not in ENGINES for e in engines) or len(set(engines)) != len(engines):
        raise UsageError(f"--engines {text!r}: give distinct names from {','.join(ENGINES)}, e.g. ale,envpool")
    return engines


def cmd_envs(args: argparse.Namespace) -> int:
    engines, env_id = parse_engines(args.engines), args.env
    if not env_id.startswith("ALE/"):
        raise UsageError(f"--env {env_id!r}: python -m benchmarks envs measures Atari; give an ALE/ id such as "
                         "ALE/Breakout-v5")
    check_env_id(env_id)
    threads, env_counts = parse_counts(args.threads, "--threads"), parse_counts(args.envs, "--envs")
    info = machine()
    speed = bench_speed(engines, env_id, threads, env_counts, args.steps, args.warmup, args.repeats, args.seed)
    checks = check_semantics(engines, env_id, min(env_counts), args.check_episodes, args.seed, args.check_steps)
    check_md = table(checks, CHECK_COLUMNS)
    print(check_md + "\n", flush=True)
    relative = f"vs_{engines[0]}"
    note = (f"Env steps per second of each engine's vector env alone (random actions, no policy), "
            f"{args.steps:,} env steps per timed block after {args.warmup:,} of warm-up, {args.repeats} blocks per "
            f"row, the engines' blocks alternating: `steps_per_s` is median (min-max), `per_thread` the median over "
            f"the threads, `{relative}` the median over the {engines[0]} row's; `steps_per_cpu_s` counts the CPU "
            f"time of the process (all its threads) instead of the wall-clock: what one core buys, the figure the "
            f"load of a shared machine distorts least (`cpu_{relative}` as above). Same preprocessing in both "
            "(dppo/envs/atari.py): no sticky actions, up to 30 no-ops and FIRE on reset, frame skip 4 with max-pool, "
            "84x84 gray, 4 stacked frames, 108,000 frames at most, no life-loss episodes, raw rewards. EnvPool runs "
            "synchronously (batch = all envs) with its NEXT_STEP autoreset; ale-py with SAME_STEP, as dppo uses "
            "it.\n\nSemantics, seed "
            f"{args.seed}, {min(env_counts)} envs, 1 thread, random actions until {args.check_episodes} games end "
            "(return and length: median (min-max) over them; `life_losses_in_info`: lives that fell in `info` "
            "without the game ending; `lives_before_end`: lives one step before games ended; `max_step_reward` above 1 "
            "shows raw rewards where the game gives them (a random Breakout player only hits 1-point bricks; "
            "ALE/SpaceInvaders-v5 gives up to 30 in both engines); `reset_stack`: what "
            "the 3 older frames of a reset observation hold; `same_first_frame`: "
            f"share of env 0's first 84x84 frame equal to {engines[0]}'s):\n\n{check_md}\n\n{verdict(speed, engines)}")
    emit(args, speed, [*SPEED_COLUMNS, relative, "steps_per_cpu_s", f"cpu_{relative}"], f"envs-{env_id.split('/')[-1]}",
         f"Atari env engines, {env_id}: ale-py against EnvPool", note, info)
    if args.json:
        Path(args.json).write_text(json.dumps([{"kind": "speed", **r} for r in speed]
                                              + [{"kind": "semantics", **r} for r in checks], indent=2) + "\n")
    return 0
