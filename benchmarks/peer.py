"""`python -m benchmarks peer`: dppo against RLlib's multi-agent PPO on the same cooperative task (MPE simple_spread,
one policy shared by every agent), seed by seed on this machine, at equal agent steps.

RLlib runs in a venv of its own, installed as a user would (``--peer-python``), through the script
:mod:`benchmarks.peer_rllib`, configured from dppo's config so that both sides train the same env with the same
PPO, batch and CPUs (the script's docstring says what is matched and how). The runs go one after the other, never
together: wall-clock time is half of what is compared. Each run is timed from launch to exit.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dppo.bench.common import Row, add_common_args, machine, parse_counts
from dppo.bench.docs import emit
from dppo.cli_args import positive, whole_number
from dppo.errors import UsageError, first_line

if TYPE_CHECKING:
    from dppo.config import Config
    from dppo.run.curves import Curve

PEER_NAME = "RLlib PPO"
PATCHED_NAME = "RLlib PPO, time limit bootstrapped"  # --patched-peer: peer_rllib.bootstrap_truncation applied
PEER_SCRIPT = Path(__file__).with_name("peer_rllib.py")
PEER_PREFIX = "dppo-peer "  # what peer_rllib.py starts its machine-readable lines with (it imports nothing of dppo)
PEER_VENV = Path(".cache/peer-rllib")
# RLlib as its users install it, beside dppo's Ray version; CPU torch first (a bare torch pulls a CUDA build).
PEER_PACKAGES = (("torch==2.13.0",), ("ray[rllib]==2.60.0", "mpe2", "pettingzoo"))
VENV_COMMANDS = f"python3 -m venv {PEER_VENV} && " + " && ".join(
    f"{PEER_VENV}/bin/pip install {shlex.join(group)}" for group in PEER_PACKAGES)
VENV_HINT = f"create the peer's venv: {VENV_COMMANDS}"


@dataclass(frozen=True)
class PeerRun:
    """What the peer printed: its start (versions, agents, epoch time) and one record per iteration."""

    start: dict[str, Any]
    iterations: list[dict[str, Any]]
    done: dict[str, Any] | None


def parse_peer_output(text: str) -> PeerRun:
    """The peer's ``dppo-peer {json}`` lines out of everything it printed (RLlib's own lines are skipped)."""
    start, done, iterations = None, None, []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.startswith(PEER_PREFIX):
            continue
        try:
            record = json.loads(line[len(PEER_PREFIX):])
        except json.JSONDecodeError:
            raise RuntimeError(f"peer output line {number} is not JSON: {line[:200]!r}") from None
        event = record.get("event") if isinstance(record, dict) else None
        if event in ("start", "versions"):
            start = record
        elif event == "iteration":
            if not {"agent_steps", "t", "episode_return_mean"} <= record.keys():
                raise RuntimeError(f"peer output line {number} lacks agent_steps, t or episode_return_mean")
            iterations.append(record)
        elif event == "done":
            done = record
        else:
            raise RuntimeError(f"peer output line {number} has an unknown event {event!r}")
    if start is None:
        raise RuntimeError("the peer printed no start line (dppo-peer {\"event\": \"start\", ...})")
    return PeerRun(start, iterations, done)


def run_peer_script(python: Path, args: list[str], timeout_s: float) -> tuple[subprocess.CompletedProcess, float]:
    """``python peer_rllib.py ARGS``; its output and wall seconds from launch to exit."""
    from dppo.bench.runs import stop_process_tree

    started = time.perf_counter()
    proc = subprocess.Popen([str(python), str(PEER_SCRIPT), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop_process_tree(proc)
        raise UsageError(f"the peer ran past --timeout {timeout_s:g}s; raise --timeout (seconds per run)") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), time.perf_counter() - started


def check_peer_python(python: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """The peer's versions, or a usage error naming how to make a venv that has RLlib and the env."""
    if not python.is_file():
        raise UsageError(f"--peer-python {python}: no such interpreter; {VENV_HINT}")
    try:
        done, _ = run_peer_script(python, ["--check", "--spec", json.dumps(spec)], 300.0)
    except OSError as err:
        raise UsageError(f"--peer-python {python} cannot run ({first_line(err)}); {VENV_HINT}") from None
    try:
        versions = parse_peer_output(done.stdout).start if done.returncode == 0 else None
    except RuntimeError:
        versions = None
    if versions is None:
        last = first_line((done.stderr.strip().splitlines() or ["no output"])[-1])
        raise UsageError(f"--peer-python {python} cannot run RLlib's PPO on {spec['env']} ({last}); {VENV_HINT}")
    return {k: v for k, v in versions.items() if k != "event"}


# dppo settings the peer script has no counterpart for: (what is off in a mirrorable config, its key).
UNMIRRORED = (
    (lambda c: not c.env.global_state, "env.global_state"), (lambda c: c.model.recurrent == "none", "model.recurrent"),
    (lambda c: not (c.env.normalize_obs or c.env.normalize_reward or c.env.clip_reward), "env.normalize_*/clip_reward"),
    (lambda c: not c.env.wrappers, "env.wrappers"), (lambda c: not c.policies, "policies"),
    (lambda c: c.ppo.target_kl is None, "ppo.target_kl"), (lambda c: not c.ppo.clip_value_loss, "ppo.clip_value_loss"),
    (lambda c: not c.ppo.normalize_value, "ppo.normalize_value"),
    (lambda c: c.ppo.normalize_advantages, "ppo.normalize_advantages"),
)


def peer_spec(config: Config, source: str) -> dict[str, Any]:
    """peer_rllib.py's spec for a run of ``config`` (its seed and budget included); a usage error for a config it
    cannot mirror."""
    from dppo.envs.make import is_self_play
    from dppo.run.state import RETURN_WINDOW

    if not config.env.multiagent:
        raise UsageError(f"--config {source}: env {config.env.id!r} is not a PettingZoo env; the peer benchmark "
                         "compares many agents in one env (e.g. examples/simple-spread.yaml)")
    for mirrored, key in UNMIRRORED:
        if not mirrored(config):
            raise UsageError(f"--config {source}: the peer has no counterpart for {key}; leave it at its default")
    if is_self_play(config.env):
        raise UsageError(f"--config {source}: a turn-based game; the peer benchmark is for cooperative Parallel envs")
    ppo = config.ppo
    return {"env": config.env.id, "env_kwargs": dict(config.env.kwargs), "agent_id_in_obs": config.env.agent_id_in_obs,
            "seed": config.run.seed, "agent_steps": config.run.total_steps, "runners": config.run.actors,
            "columns_per_runner": config.columns, "segment_length": ppo.segment_length, "epochs": ppo.epochs,
            "minibatch_size": config.minibatch_size, "learning_rate": ppo.learning_rate, "anneal_lr": ppo.anneal_lr,
            "gamma": ppo.gamma, "gae_lambda": ppo.gae_lambda, "clip_coef": ppo.clip_coef,
            "value_coef": ppo.value_coef, "entropy_coef": ppo.entropy_coef, "max_grad_norm": ppo.max_grad_norm,
            "hidden_sizes": list(config.model.hidden_sizes), "activation": config.model.activation,
            "window": RETURN_WINDOW, "patch_truncation": False}


def peer_run(python: Path, spec: dict[str, Any], out_dir: Path, timeout_s: float) -> Row:
    """One peer run: launch-to-exit seconds, its final return and its curve (wall seconds since launch)."""
    launched = time.time()
    done, wall = run_peer_script(python, ["--spec", json.dumps(spec)], timeout_s)
    out_dir.mkdir(parents=True, exist_ok=True)
    log = out_dir / f"peer{'-patched' if spec.get('patch_truncation') else ''}-seed{spec['seed']}.log"
    log.write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"the peer (seed {spec['seed']}) exited {done.returncode}: "
                           f"{first_line((done.stderr.strip().splitlines() or ['no output'])[-1])}")
    run = parse_peer_output(done.stdout)
    if run.done is None or not run.iterations:
        raise RuntimeError(f"the peer (seed {spec['seed']}) ended without its done line; see {out_dir}")
    from dppo.run.curves import Curve

    points = [r for r in run.iterations if r["episode_return_mean"] is not None]
    curve = Curve(log.stem, [r["t"] - launched for r in points],
                  [int(r["agent_steps"]) for r in points], [float(r["episode_return_mean"]) for r in points],
                  None, spec["env"])
    last = run.iterations[-1]
    return {"seed": spec["seed"], "agent_steps": int(last["agent_steps"]), "return": last["episode_return_mean"],
            "wall_s": round(wall, 2), "train_s": round(last["t"] - run.start["t"], 2),
            "startup_s": round(run.start["t"] - launched, 2), "curve": curve}


def dppo_run(config_path: Path, seed: int, total_steps: int, run_dir: Path, timeout_s: float) -> Row:
    """One `dppo train` run (solve's launch-to-exit timing); its curve's clock moved to count from launch."""
    from dppo.bench.runs import run_train
    from dppo.run.curves import load_curve

    row = run_train(["--config", str(config_path), "--seed", str(seed), "--total-steps", str(total_steps),
                     "--set", "run.target_return=null", "--log-format", "json"], run_dir, timeout_s)
    curve = load_curve(run_dir)
    launch_to_clock = row["wall_s"] - row["train_s"] - row["exit_s"]  # the coordinator's clock starts after launch
    curve = replace(curve, label=f"dppo seed {seed}", wall_s=[t + launch_to_clock for t in curve.wall_s])
    return {"seed": seed, "agent_steps": row["env_steps"], "return": row["episode_return_mean"],
            "wall_s": row["wall_s"], "train_s": row["train_s"], "startup_s": round(launch_to_clock, 2), "curve": curve}


def figure(curves: dict[str, list[Curve]], path: Path, title: str) -> Path:
    """Return against agent steps and against wall-clock time since launch: one line per seed, a colour per system."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2), layout="constrained")
    by_steps, by_time = fig.subplots(1, 2, sharey=True)
    for color, (system, runs) in zip(("tab:blue", "tab:orange", "tab:green"), curves.items(), strict=False):
        for i, curve in enumerate(runs):
            label = system if i == 0 else f"_{system}"  # one legend entry per system
            by_steps.plot(curve.env_steps, curve.episode_return_mean, color=color, label=label, linewidth=1.4)
            by_time.plot(curve.wall_s, curve.episode_return_mean, color=color, label=label, linewidth=1.4)
    fig.suptitle(title)
    by_steps.set(xlabel="agent steps", ylabel="mean return per agent (last 100 agent episodes)",
                 title="Return against agent steps")
    by_time.set(xlabel="wall-clock time since launch (s)", title="Return against wall-clock time")
    for ax in (by_steps, by_time):
        ax.grid(True, alpha=0.3)
        ax.set_xlim(left=0)
        ax.legend(loc="lower right", fontsize="small")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


def spread(values: list[float], digits: int) -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.{digits}f} +- {std:.{digits}f}"


def system_row(system: str, version: str, runs: list[Row]) -> Row:
    """One system's row: mean +- std over seeds, then each seed's numbers."""
    if any(r["return"] is None for r in runs):
        raise UsageError(f"{system}: no episode finished within --total-steps; give a budget of several iterations")
    return {"system": system, "version": version, "seeds": len(runs),
            "agent_steps": "/".join(str(r["agent_steps"]) for r in runs) if len({r["agent_steps"] for r in runs}) > 1
            else runs[0]["agent_steps"],
            "return": spread([r["return"] for r in runs], 2), "wall_s": spread([r["wall_s"] for r in runs], 1),
            "train_s": spread([r["train_s"] for r in runs], 1), "startup_s": spread([r["startup_s"] for r in runs], 1),
            "per_seed": ", ".join(f"{r['seed']}: {r['return']:.2f} in {r['wall_s']:.0f}s" for r in runs)}


def register(sub: argparse._SubParsersAction) -> None:
    """Add `python -m benchmarks peer`."""
    bench = sub.add_parser("peer", help="dppo against RLlib's multi-agent PPO on a cooperative task, same agent steps")
    bench.add_argument("--peer-python", type=Path, default=PEER_VENV / "bin" / "python",
                       help=f"the python of a venv with RLlib (default {PEER_VENV}/bin/python); {VENV_HINT}")
    bench.add_argument("--config", type=Path, default=Path("examples/simple-spread.yaml"),
                       help="dppo's side (default examples/simple-spread.yaml); the peer mirrors it")
    bench.add_argument("--seeds", default="1,2,3", help="comma-separated seeds (default 1,2,3)")
    bench.add_argument("--total-steps", type=whole_number, help="agent steps per run (default: the config's)")
    bench.add_argument("--out-dir", type=Path, help="where the runs go (default runs/bench-peer-<timestamp>)")
    bench.add_argument("--patched-peer", action="store_true",
                       help="also run RLlib with its multi-agent time-limit truncation patched (bootstrapped, as "
                       "dppo does, not taken as termination): a third row that shows what that one difference costs")
    bench.add_argument("--timeout", type=positive(float, "--timeout"), default=3600.0, help="seconds per run")
    add_common_args(bench, address=False)
    bench.set_defaults(func=cmd_peer)


def load_side(path: Path, total_steps: int | None) -> Config:
    """dppo's config, the budget overridden; a usage error for a missing or invalid file."""
    from dppo.config import load_config
    from dppo.envs.make import with_agents

    if not path.is_file():
        raise UsageError(f"--config {path}: no such file; e.g. examples/simple-spread.yaml")
    if total_steps is not None and total_steps < 1:
        raise UsageError(f"--total-steps {total_steps}: give a positive number of agent steps, e.g. 300000")
    return with_agents(load_config(path, overrides={"run.total_steps": total_steps}))  # columns: copies x agents


def describe(config: Config, source: Path, versions: dict[str, Any], patched: bool) -> str:
    """The section's note: what runs on each side, what is matched, what is not, and what each column means."""
    ppo, env = config.ppo, config.env
    kwargs = ", ".join(f"{k}={v}" for k, v in env.kwargs.items())
    return (
        f"dppo (`dppo train --config {source}`) and RLlib's multi-agent PPO (new API stack, ray {versions['ray']}, "
        f"torch {versions['torch']}, in a venv of its own: `{VENV_COMMANDS}`; the script `benchmarks/peer_rllib.py`) "
        f"train the same PettingZoo env, {env.id} ({kwargs}), one policy shared by all agents, the agent's one-hot "
        f"index in its observation, to {config.run.total_steps:,} agent steps each (an agent step: one agent's "
        "action; RLlib counts env steps, each one step of every agent, and the script converts), one run at a time. "
        f"Same PPO on both sides: {config.run.actors} env runners / actors of one CPU each with {config.columns} agent "
        f"columns each, T={ppo.segment_length}, {ppo.epochs} epochs of minibatches of {config.minibatch_size} agent "
        f"steps, lr {ppo.learning_rate:g}{' annealed to 0' if ppo.anneal_lr else ''}, gamma {ppo.gamma:g}, lambda "
        f"{ppo.gae_lambda:g}, clip {ppo.clip_coef:g}, value coefficient {ppo.value_coef:g} (RLlib's vf_loss_coeff "
        f"{ppo.value_coef / 2:g}: its value loss lacks dppo's 1/2), entropy {ppo.entropy_coef:g}, grad-norm clip "
        f"{ppo.max_grad_norm:g}, separate policy and value MLPs {list(config.model.hidden_sizes)} "
        f"{config.model.activation}; RLlib's KL penalty and value-loss clip off, its learner in the driver with one "
        "torch thread (dppo: run.learner_threads 1). Not matched: RLlib's own weight init, Adam eps (1e-8 vs 1e-5), "
        "advantages normalized per batch (dppo: per minibatch), and the time limit: when every agent of an episode "
        "is done, RLlib's MultiAgentEpisode marks each one terminated, so at MPE's max_cycles (a truncation) its GAE "
        "takes V(final observation) as 0 where dppo bootstraps it"
        + (f"; the row `{PATCHED_NAME}` runs RLlib with that one line patched (`patch_truncation` in "
           "peer_rllib.py)" if patched else "") +
        ". RLlib publishes no tuned MPE example, so both use dppo's example settings. `return`: mean per-agent "
        "episode return over the last 100 finished agent episodes at the budget (RLlib's counted by the script from "
        "the episodes its env runners return), mean +- std over seeds; `wall_s`: launch to exit of one run; "
        "`startup_s`: launch to the training clock's start; `train_s`: that clock at the last iteration. The "
        "figure's clock counts from launch.")


def cmd_peer(args: argparse.Namespace) -> int:
    config = load_side(args.config, args.total_steps)
    seeds = parse_counts(args.seeds, "--seeds", minimum=0)
    spec = peer_spec(config, str(args.config))
    peer_versions = check_peer_python(args.peer_python, spec)
    out_dir = args.out_dir or Path("runs") / f"bench-peer-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}"
    info, steps = machine(), config.run.total_steps
    import dppo

    peers = {PEER_NAME: spec, **({PATCHED_NAME: {**spec, "patch_truncation": True}} if args.patched_peer else {})}
    versions = {"dppo": dppo.__version__, PEER_NAME: f"ray {peer_versions['ray']}",
                PATCHED_NAME: f"ray {peer_versions['ray']} + patch"}
    runs: dict[str, list[Row]] = {name: [] for name in ("dppo", *peers)}
    for seed in seeds:  # one run at a time, the systems alternating within each seed
        runs["dppo"].append(dppo_run(args.config, seed, steps, out_dir / f"dppo-seed{seed}", args.timeout))
        for name, peer_side in peers.items():
            runs[name].append(peer_run(args.peer_python, {**peer_side, "seed": seed}, out_dir, args.timeout))
        print(f"seed {seed}: " + "; ".join(f"{name} {r[-1]['return']:.2f} in {r[-1]['wall_s']:.0f}s"
                                           for name, r in runs.items()), flush=True)
    rows = [system_row(name, versions[name], system) for name, system in runs.items()]
    key = args.section or f"peer-rllib-{args.config.stem}"
    path = (Path(args.write_docs).parent if args.write_docs else out_dir) / f"bench-{key}.png"
    kwargs = ", ".join(f"{k}={v}" for k, v in config.env.kwargs.items())
    figure({name: [r["curve"] for r in rs] for name, rs in runs.items()}, path,
           f"{config.env.id} ({kwargs}): dppo and RLlib's PPO, {len(seeds)} seed{'s' if len(seeds) > 1 else ''}")
    note = describe(config, args.config, peer_versions, args.patched_peer)
    note += f" Load average (1 min) at the end: {os.getloadavg()[0]:.2f}."
    columns = ["system", "version", "seeds", "agent_steps", "return", "wall_s", "train_s", "startup_s", "per_seed"]
    for row, system in zip(rows, runs.values(), strict=True):
        row["runs"] = [{k: v for k, v in r.items() if k != "curve"} for r in system]
    emit(args, rows, columns, key, f"Against a peer: {config.env.id}, dppo and RLlib's PPO", note, info, path)
    return 0
