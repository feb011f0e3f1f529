"""`python -m benchmarks selfplay`: train a two-player game by self-play (`dppo train --config F`, one run per seed),
then play the trained policy against fixed opponents (`dppo eval --opponent`: random, minimax) as each seat, and chart
the learner's Elo against its snapshot pool over the run."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from dppo.bench.common import Row, add_common_args, machine, parse_counts
from dppo.bench.docs import emit
from dppo.cli_args import positive
from dppo.config.selfplay import FIXED_PLAYER, FIXED_PLAYER_HINT
from dppo.errors import UsageError

OUTCOMES = re.compile(r"win/draw/loss: first seat (\d+/\d+/\d+), second seat (\d+/\d+/\d+)")


def train(config: Path, seed: int, run_dir: Path, timeout_s: float) -> dict[str, Any]:
    """One `dppo train` run (its own local Ray); its summary."""
    cmd = [sys.executable, "-m", "dppo", "train", "--config", str(config), "--seed", str(seed), "--run-dir",
           str(run_dir), "--no-tensorboard", "--log-format", "none"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode == 2:  # bad input: the config's own one line
        line = (done.stderr.strip().splitlines() or ["refused (exit 2)"])[-1]
        raise UsageError(f"--config {config}: {line.removeprefix('dppo: error: ')}")
    if done.returncode != 0:
        raise RuntimeError(f"dppo train (seed {seed}) exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return json.loads((run_dir / "summary.json").read_text())


def play(run_dir: Path, opponent: str, games: int, seed: int, timeout_s: float, best: bool = False) -> Row:
    """`dppo eval --opponent`: greedy games of the run's last checkpoint (``best``: its best.pt), seats alternating;
    wins/draws/losses."""
    cmd = [sys.executable, "-m", "dppo", "eval", "--checkpoint", str(run_dir), "--opponent", opponent,
           "--episodes", str(games), "--seed", str(seed), *(["--best"] if best else [])]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    found = OUTCOMES.search(done.stdout)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"dppo eval --opponent {opponent} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    first, second = found.group(1), found.group(2)
    won, _, lost = (sum(int(part.split("/")[i]) for part in (first, second)) for i in range(3))
    return {f"{opponent}_first": first, f"{opponent}_second": second,
            f"{opponent}_win_rate": round(won / games, 3), f"{opponent}_losses": lost}


def worst_cases(run_dir: Path, best: bool = False) -> str:
    """The greedy policy's worst result as the first / the second player over every line any opponent can play
    (:func:`dppo.envs.minimax.worst_case`): ``draw/draw`` in tic-tac-toe is a player that nobody beats, so its
    games against minimax are no luck of the draw. Full-depth search: small games only."""
    from dppo.config import validate
    from dppo.envs.make import make_env, make_pettingzoo_env
    from dppo.envs.minimax import worst_case
    from dppo.rl.agent import Agent, export_weights
    from dppo.run.checkpoint import load
    from dppo.run.trained import trained_model

    checkpoint = load(run_dir, best=best)
    config = validate(checkpoint["config"], warn=False)
    env = make_env(config.env)
    trained = trained_model(checkpoint, (env.observation_space, env.action_space))
    env.close()
    agent = Agent(env.observation_space, env.action_space, trained.config.model)
    agent.load(export_weights(trained.model), 0)

    def choose(observation: Any) -> Any:
        action, _, _ = agent.act(agent.obs_spec.encode_one(observation), greedy=True)
        return agent.action_spec.to_env(action)[0]

    names = {1.0: "win", 0.0: "draw", -1.0: "loss"}
    return "/".join(names[worst_case(lambda: make_pettingzoo_env(config.env), choose, seat)] for seat in (0, 1))


def elo_figure(runs: dict[int, Path], path: Path, title: str) -> Path:
    """The learner's Elo and its self-play win rate against env steps, one line per seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (elo, win) = plt.subplots(1, 2, figsize=(10, 3.6))
    for seed, run_dir in runs.items():
        records = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
        steps = [r["env_steps"] for r in records]
        elo.plot(steps, [r["selfplay_elo"] for r in records], label=f"seed {seed}")
        win.plot(steps, [r["selfplay_win_rate"] for r in records], label=f"seed {seed}", alpha=0.7)
    elo.set(xlabel="env steps (learner moves)", ylabel="Elo against the snapshot pool", title=title)
    win.set(xlabel="env steps (learner moves)", ylabel="share of games won against the pool", ylim=(0, 1))
    elo.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def register(sub: argparse._SubParsersAction) -> None:
    """Add `python -m benchmarks selfplay`."""
    parser = sub.add_parser("selfplay", help="a two-player game by self-play: Elo over the run, then games against "
                            "random and minimax players")
    parser.add_argument("--config", required=True, help="the training config (e.g. configs/tictactoe.yaml)")
    parser.add_argument("--seeds", default="1", help="comma-separated seeds, one run each (default 1)")
    parser.add_argument("--opponents", default="random,minimax",
                        help="comma-separated: random, minimax, minimax:DEPTH (default random,minimax)")
    parser.add_argument("--games", type=positive(int, "--games"), default=200,
                        help="games against each opponent, half as each seat (default 200)")
    parser.add_argument("--out-dir", default="runs/bench-selfplay",
                        help="where the runs go (default runs/bench-selfplay)")
    parser.add_argument("--best", action="store_true",
                        help="also play the run's best evaluated weights (best.pt: run.eval_every against "
                        "selfplay.eval_opponent), a row of their own")
    parser.add_argument("--timeout", type=positive(float, "--timeout"), default=3600.0,
                        help="seconds one training run may take (default 3600)")
    add_common_args(parser, address=False)
    parser.set_defaults(func=cmd_selfplay)


def cmd_selfplay(args: argparse.Namespace) -> int:
    config = Path(args.config)
    if not config.is_file():
        raise UsageError(f"--config {args.config}: no such file; e.g. configs/tictactoe.yaml")
    opponents = [o.strip() for o in args.opponents.split(",") if o.strip()]
    if not opponents or not all(FIXED_PLAYER.fullmatch(o) for o in opponents):
        raise UsageError(f"--opponents {args.opponents!r}: give {FIXED_PLAYER_HINT}, comma-separated")
    from dppo.config import load_config
    from dppo.distributed.evaluation import EVAL_SEED_OFFSET
    from dppo.envs.make import is_self_play

    if not is_self_play(load_config(config).env):
        raise UsageError(f"--config {args.config}: its env is not a two-player turn-based game (a PettingZoo AEC "
                         "env such as pettingzoo.classic.tictactoe_v3); python -m benchmarks selfplay measures "
                         "self-play")
    if args.games % 2:
        raise UsageError(f"--games {args.games}: give an even number (half as each seat)")
    info, rows, runs = machine(), [], {}
    for seed in parse_counts(args.seeds, "--seeds", minimum=0):
        run_dir = runs[seed] = Path(args.out_dir) / f"{config.stem}-seed{seed}"
        summary = train(config, seed, run_dir, args.timeout)
        last = json.loads((run_dir / "progress.jsonl").read_text().splitlines()[-1])
        for best in (False, True) if args.best else (False,):
            row: Row = {"seed": seed, "weights": "best.pt" if best else "last", "env_steps": summary["env_steps"],
                        "wall_s": round(summary["wall_s"], 1), "elo": last["selfplay_elo"],
                        "pool": last["selfplay_pool_size"]}
            for opponent in opponents:
                row.update(play(run_dir, opponent, args.games, seed, args.timeout, best))
            if "minimax" in opponents:
                row["worst_case"] = worst_cases(run_dir, best)
            rows.append(row)
            print(f"seed {seed}: {row}", flush=True)
    figure = elo_figure(runs, Path(args.write_docs).parent / "figures" / f"selfplay-{config.stem}.png",
                        f"{config.stem}: Elo by self-play") if args.write_docs else None
    columns = ["seed", "weights", "env_steps", "wall_s", "elo", "pool"]
    for opponent in opponents:
        columns += [f"{opponent}_first", f"{opponent}_second", f"{opponent}_win_rate", f"{opponent}_losses"]
    if "minimax" in opponents:
        columns.append("worst_case")
    note = (f"Self-play training of `{args.config}` (`dppo train --config {args.config} --seed S`), then "
            f"{args.games} greedy games of the last checkpoint against each opponent, seats alternating "
            f"(`dppo eval --opponent O --episodes {args.games}`; `best.pt` rows: `--best`, the weights the "
            "evaluation while training rated best against `selfplay.eval_opponent`, in games of its own seeded from "
            f"`run.seed` + {EVAL_SEED_OFFSET:,}: model selection on other games than these): `O_first` / "
            "`O_second` are wins/draws/losses with the policy as the first / second player, `O_win_rate` and "
            "`O_losses` over all games. `elo`: the learner's rating against its own snapshot pool at the end (it "
            "starts at 1000; a relative scale). `minimax` is a perfect player (negamax over the game, ties broken at "
            "random). `worst_case`: the policy's worst result as the first / the second player over every line any "
            "opponent can play, searched exhaustively (`draw/draw`: no player, minimax with any tie-break included, "
            "ever beats it).")
    emit(args, rows, columns, args.section or f"selfplay-{config.stem}", f"Self-play: {config.stem}", note, info,
         figure)
    return 0
