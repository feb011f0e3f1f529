"""The ``dppo`` command: train, eval, export, plot, bench, status.

Exit codes: 0 success; 2 bad input (one line on stderr, no traceback, nothing written); 1 failure.
Heavy imports (torch, ray) happen inside the commands so ``dppo --help`` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import math
import os
import re
import sys
import time
import warnings
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from dppo.errors import UsageError

if TYPE_CHECKING:
    from dppo.run.startup import PhaseClock

# Subcommands that live in their own modules; each exposes register(subparsers).
COMMAND_MODULES = ("dppo.commands.plot", "dppo.bench.suite", "dppo.commands.status")

# Flags of `dppo train` that set a config key (dest -> dotted key).
TRAIN_FLAGS = {
    "env": "env.id", "actors": "run.actors", "envs_per_actor": "env.num_envs",
    "segment_length": "ppo.segment_length", "total_steps": "run.total_steps", "target_return": "run.target_return",
    "time_limit": "run.time_limit_s",
    "seed": "run.seed", "run_dir": "run.run_dir", "metrics_port": "metrics.port", "address": "run.address",
    "log_format": "run.log_format", "tensorboard": "run.tensorboard",
}


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (exit 2) instead of usage + message."""

    def error(self, message: str) -> NoReturn:
        fail(f"{self.prog}: {message} (see {self.prog} --help)")


def whole_number(text: str) -> int:
    """An integer flag that also takes 1e6 or 2.5e5, the way step budgets are written, when exact."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    return int(value)


def fail(message: str, code: int = 2) -> NoReturn:
    print(f"dppo: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def config_reference() -> str:
    """Every config key with its default and docstring, for ``dppo train --help``."""
    from dppo.config import Config

    lines = ["config keys (YAML sections, or --set section.key=value):"]
    for section, field in Config.model_fields.items():
        for key, sub in field.annotation.model_fields.items():  # type: ignore[union-attr]
            default = sub.default if sub.default_factory is None else sub.default_factory()
            doc = " ".join((sub.description or "").split())
            lines.append(f"  {section}.{key} = {default!r}\n      {doc}")
    return "\n".join(lines)


def build_parser() -> Parser:
    parser = Parser(prog="dppo", description="Distributed PPO on Ray: a laptop or a KubeRay cluster, one command.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    train = sub.add_parser("train", help="train a policy", epilog=config_reference(),
                           formatter_class=argparse.RawDescriptionHelpFormatter,
                           description="Train with PPO. No arguments: CartPole-v1 preset, 2 actors, local Ray.")
    train.add_argument("--config", help="YAML config (default: the bundled preset for --env)")
    train.add_argument("--env", help="registered gymnasium id (CartPole-v1; picks its preset when --config is not "
                       "given), or module.path:EnvId-v0 to import your module first; for an unregistered env "
                       "use --set env.entry_point=module.path:MyEnv (see the README, 'Your own environment')")
    train.add_argument("--actors", type=whole_number, help="N: Ray actors collecting in parallel")
    train.add_argument("--envs-per-actor", type=whole_number, help="E: envs in each actor's vector env")
    train.add_argument("--segment-length", type=whole_number, help="T: steps per env per iteration")
    train.add_argument("--total-steps", type=whole_number, help="stop after this many env steps")
    train.add_argument("--target-return", type=float, help="stop when the 100-episode mean return reaches this")
    train.add_argument("--time-limit", type=float, metavar="SECONDS",
                       help="stop with a checkpoint after this many seconds of training")
    train.add_argument("--seed", type=whole_number, help="seed for everything")
    train.add_argument("--run-dir", help="output directory (default runs/<env>-<timestamp>)")
    resume = train.add_mutually_exclusive_group()
    resume.add_argument("--resume", action="store_true",
                        help="continue the run in --run-dir from its newest checkpoint")
    resume.add_argument("--auto-resume", action="store_true",
                        help="resume when --run-dir holds a checkpoint, else start fresh (for retried jobs)")
    train.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port (0: off)")
    train.add_argument("--address", help="Ray cluster to join (default: RAY_ADDRESS, else a local Ray)")
    train.add_argument("--log-format", choices=["text", "json"], help="per-iteration stdout lines")
    train.add_argument("--no-tensorboard", dest="tensorboard", action="store_const", const=False,
                       help="do not write TensorBoard event files to <run-dir>/tensorboard/")
    train.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                       help="override any config key, e.g. --set ppo.learning_rate=3e-4 (repeatable)")
    train.set_defaults(func=cmd_train)

    ev = sub.add_parser("eval", help="run greedy episodes from a checkpoint and print the mean return")
    ev.add_argument("--checkpoint", required=True, help="a ckpt-*.pt file or a run directory")
    ev.add_argument("--episodes", type=int, default=10, help="episodes to run (default 10)")
    ev.add_argument("--seed", type=int, default=0, help="seed of the first episode")
    ev.add_argument("--video", help="record videos of the episodes into this directory (needs moviepy)")
    ev.set_defaults(func=cmd_eval)

    ex = sub.add_parser("export", help="export the deterministic policy for deployment (ONNX or TorchScript)",
                        description="The checkpoint's deterministic policy, observation normalization included: "
                        "raw observation in, env action out, dynamic batch dimension.")
    ex.add_argument("--checkpoint", required=True, help="a ckpt-*.pt file or a run directory")
    ex.add_argument("-o", "--output", required=True, type=Path, help="file to write, e.g. policy.onnx")
    ex.add_argument("--format", choices=["onnx", "torchscript"],
                    help="default: from the file name (.pt/.ts: torchscript, else onnx)")
    ex.set_defaults(func=cmd_export)

    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


# ---- train ---------------------------------------------------------------------------------------
def resolve_run_dir(config_dir: str | None, env_name: str) -> Path:
    if config_dir:
        return Path(config_dir)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", env_name.rpartition(":")[2] or env_name)  # no '/' or ':' in names
    return Path("runs") / f"{safe}-{stamp}"


def import_from_cwd() -> None:
    """Make modules in the working directory importable, as ``python -m`` would (the console script
    puts its own bin directory first instead)."""
    from dppo.envs.make import add_import_paths, driver_import_paths

    add_import_paths(driver_import_paths())


def prepare_train(args: argparse.Namespace) -> tuple[Any, Path, dict[str, Any] | None]:
    """Validate everything (config, run dir, checkpoint) before anything is written."""
    from dppo.config import load_config

    overrides = {key: getattr(args, dest) for dest, key in TRAIN_FLAGS.items()}
    config_path = args.config
    run_dir_arg = args.run_dir
    resume_state = None
    if (args.resume or args.auto_resume) and not run_dir_arg:
        probe = load_config(config_path, overrides, args.sets) if config_path else None
        run_dir_arg = probe.run.run_dir if probe else None
        if not run_dir_arg:
            fail("--resume needs the run to continue: pass --run-dir DIR")
    if run_dir_arg:
        path = Path(run_dir_arg)
        if path.exists() and not path.is_dir():
            fail(f"run dir {str(path)!r} is a file; pass a directory to --run-dir")
        found = None
        if (args.resume or args.auto_resume) and path.is_dir():
            from dppo.run.checkpoint import newest_intact  # imports torch: only when resuming

            found = newest_intact(path / "checkpoints")
        if args.resume and found is None:
            fail(f"--resume: no intact checkpoint in {str(path / 'checkpoints')!r}; "
                 "start a new run without --resume or pass the right --run-dir")
        if found is not None:
            resume_state = found[1]
            if config_path is None and (path / "config.yaml").is_file():
                config_path = str(path / "config.yaml")
    config = load_config(config_path, overrides, args.sets)
    from dppo.envs.make import env_spaces

    env_spaces(config)  # the env can be made and its spaces are supported, before anything is written
    run_dir = resolve_run_dir(run_dir_arg or config.run.run_dir, config.env.name)
    fresh_retry = args.auto_resume and resume_state is None
    if resume_state is None and not fresh_retry and (run_dir / "progress.jsonl").exists():
        fail(f"run dir {str(run_dir)!r} already holds a run; pass --resume to continue it or another --run-dir")
    if resume_state is not None:
        check_compatible(resume_state, config)
    config.run.run_dir = str(run_dir)
    if fresh_retry:  # a retried job that died before its first checkpoint: its progress lines describe lost work
        (run_dir / "progress.jsonl").unlink(missing_ok=True)
    return config, run_dir, resume_state


def check_compatible(state: dict[str, Any], config: Any) -> None:
    """A checkpoint resumes only into the same env and network shape (checked before anything is written)."""
    from dppo.run.checkpoint import CheckpointError

    if state.get("env_id") != config.env.name:
        raise CheckpointError(f"the checkpoint is for env {state.get('env_id')!r}, not {config.env.name!r}; "
                              "resume with the run's own config or start a new --run-dir")
    saved = state.get("config", {}).get("model")
    if saved != config.model.model_dump(mode="json"):
        raise CheckpointError(f"the checkpoint's model settings {saved} differ from the config's; "
                              "resume with the run's own model section")


def connect_ray(config: Any) -> None:
    """Join --address / RAY_ADDRESS, or start a quiet local Ray sized to fit every actor."""
    import logging

    import ray

    address = config.run.address or os.environ.get("RAY_ADDRESS")
    quiet: dict[str, Any] = {"logging_level": logging.ERROR, "log_to_driver": False}
    if config.run.runtime_env:
        quiet["runtime_env"] = config.run.runtime_env
    try:
        if address:
            ray.init(address=address, **quiet)
        else:
            needed = config.run.actors * config.run.actor_num_cpus  # learner processes reserve CPUs too
            if config.run.learners > 1:
                needed += config.run.learners * config.run.learner_cpus
            cpus = max(os.cpu_count() or 1, math.ceil(needed))
            ray.init(address="local", num_cpus=cpus, include_dashboard=False, **quiet)
    except (ConnectionError, ValueError, RuntimeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        fail(f"cannot connect to Ray at {address!r}: {first}; check --address / RAY_ADDRESS")


def start_learner(config: Any, run_dir: Path, resume_state: dict[str, Any] | None, clock: PhaseClock) -> Any:
    """Start (or join) Ray and build the Learner at the same time: a local Ray start is mostly waiting on
    the processes it launches, the build mostly torch's import and the model, so the build runs in a
    helper thread meanwhile. With several learners the build asks the cluster for GPUs: it waits for Ray.
    Phases: ``ray_init`` (with the build running beside it), then ``learner``, what is left of the build."""
    from concurrent.futures import ThreadPoolExecutor

    def build() -> Any:
        from dppo.run.coordinator import Learner

        return Learner(config, run_dir, resume_state)

    pool = ThreadPoolExecutor(1, thread_name_prefix="learner-build")
    building = pool.submit(build) if config.run.learners == 1 else None
    connect_ray(config)
    clock.mark("ray_init")
    learner = building.result() if building else build()  # a UsageError in the build is raised here
    clock.mark("learner")
    pool.shutdown(wait=False)
    return learner


def cmd_train(args: argparse.Namespace) -> int:
    from dppo.run.startup import PhaseClock

    clock = PhaseClock()  # start-up phases, reported in summary.json
    import_from_cwd()
    warnings.filterwarnings("ignore", module="gymnasium")  # env-checker chatter; errors still surface
    config, run_dir, resume_state = prepare_train(args)
    clock.mark("config")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    learner = start_learner(config, run_dir, resume_state, clock)
    from dppo.run.coordinator import RunFailure

    try:
        learner.start_actors()  # every actor made its envs: a module missing on a worker is bad input
    except RunFailure as err:
        print(f"dppo: run failed: {err}", file=sys.stderr, flush=True)
        return 1
    clock.mark("actors_ready")
    learner.startup_s = clock.phases
    run_dir.mkdir(parents=True, exist_ok=True)
    from dppo.run.checkpoint import atomic_write

    atomic_write(run_dir / "config.yaml", config.to_yaml().encode())
    if resume_state is not None:
        learner.output.message(f"resuming {run_dir} at iteration {learner.counters.iteration}, "
                               f"{learner.counters.env_steps:,} env steps")
    try:
        summary = learner.run()
    except RunFailure as err:
        learner.output.to_file(f"run failed: {err}")
        print(f"dppo: run failed: {err}", file=sys.stderr, flush=True)
        learner.shutdown()
        return 1
    learner.shutdown()
    verdict = "solved" if summary["solved"] else "stopped"
    mean = summary["episode_return_mean"]
    line = (f"{verdict} ({summary['reason']}): return {mean if mean is None else round(mean, 1)} after "
            f"{summary['env_steps']:,} env steps, {summary['iterations']} iterations, {summary['wall_s']:.1f} s "
            f"-> {run_dir / 'summary.json'}")
    learner.output.to_file(line)
    print(line, file=sys.stdout if config.run.log_format == "text" else sys.stderr,
          flush=True)  # with JSON logs, stdout carries only the per-iteration objects
    if config.metrics.port and config.metrics.linger_s > 0 and summary["reason"] != "signal":
        time.sleep(config.metrics.linger_s)  # let Prometheus scrape the final values
    learner.metrics.shutdown()
    return 143 if summary["reason"] == "signal" else 0


# ---- eval ----------------------------------------------------------------------------------------
def cmd_eval(args: argparse.Namespace) -> int:
    if args.episodes < 1:
        fail("--episodes must be >= 1")
    from dppo.config import validate
    from dppo.run.checkpoint import load

    state = load(args.checkpoint)
    import_from_cwd()
    config = validate(state["config"])
    from dppo.commands.evaluate import evaluate

    returns = evaluate(config, state, args.episodes, args.seed, args.video)
    mean = sum(returns) / len(returns)
    print(f"mean return {mean:.2f} over {len(returns)} episodes (min {min(returns):.2f}, max {max(returns):.2f})")
    return 0


# ---- export --------------------------------------------------------------------------------------
def cmd_export(args: argparse.Namespace) -> int:
    from dppo.run.checkpoint import load

    state = load(args.checkpoint)
    import_from_cwd()
    try:
        from dppo.commands.export import export, format_for, policy_from_checkpoint
    except ImportError as err:
        fail(f"dppo export needs {err.name}: pip install 'dppo[export]'")
    policy, config = policy_from_checkpoint(state)
    fmt = format_for(args.output, args.format)
    export(policy, args.output, fmt)
    print(f"wrote {args.output} ({fmt}; env {config.env.name}; inputs {', '.join(policy.input_names())}; "
          "output action)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UsageError as err:
        fail(str(err).splitlines()[0])
    except KeyboardInterrupt:
        return 130


def stop_ray(ray: Any) -> None:
    """Leave a joined cluster with ray.shutdown (its job ends cleanly); stop a local Ray this process
    started by killing its processes, all of them this process's descendants (GCS, raylet, its agents and
    workers). ray.shutdown would stop them one by one, about 1.4 s here, protecting nothing: the actors are
    stopped and every file of the run is closed by now."""
    node = getattr(ray._private.worker, "_global_node", None)
    if node is None or not getattr(node, "head", False):
        ray.shutdown()
        return
    import psutil

    for process in psutil.Process().children(recursive=True):  # SIGKILL lands at once; no need to wait
        with contextlib.suppress(psutil.Error):
            process.kill()


def entry() -> NoReturn:
    """The `dppo` console script and `python -m dppo`: main(), then an exit without the interpreter's
    teardown of torch, Ray and their threads (about 1.8 s here). By then everything that protects data is
    done: checkpoints and summary.json written atomically, logs written and closed, TensorBoard closed,
    the actors stopped; a joined cluster is left here, a local Ray goes with this process. Crashes (a
    traceback) take the ordinary way out."""
    try:
        code = main()
    except SystemExit as stop:  # fail(): exit 2 after its one line
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        stop_ray(ray)
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()
