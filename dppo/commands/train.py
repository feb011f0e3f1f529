"""`dppo train`: the command line of a training run, a thin layer over the one path :func:`dppo.train` takes too
(:mod:`dppo.run.launch`: what is checked in which order, what a stop does).

Exits: 0 when the run ended by its own rules; 2 bad input (one line, nothing written); 1 a failed run; 130 for
SIGINT, 143 for SIGTERM (128 + the signal's number, as a shell reports a process ended by it), whether the stop came
before training (nothing written) or during it (the round in progress ends, then a final checkpoint).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dppo.cli_args import whole_number
from dppo.run.launch import TRAIN_FLAGS, outcome_line, resolve_run_dir, start_line  # noqa: F401 - tests read them here

if TYPE_CHECKING:
    from dppo.config import Config
    from dppo.run.launch import TrainRequest
    from dppo.run.lock import RunLock


def config_reference() -> str:
    """Every config key with its default and docstring, for ``dppo train --help``."""
    from dppo.config import Config

    lines = ["config keys (YAML sections, or --set section.key=value):"]
    for section, field in Config.model_fields.items():
        keys = getattr(field.annotation, "model_fields", None)  # a section's keys; else a top-level key (policies)
        for key, sub in (keys or {"": field}).items():
            default = sub.default if sub.default_factory is None else sub.default_factory()
            doc = " ".join((sub.description or "").split())
            lines.append(f"  {section}{'.' if key else ''}{key} = {default!r}\n      {doc}")
    return "\n".join(lines)


def register(sub: argparse._SubParsersAction) -> None:
    train = sub.add_parser("train", help="train a policy", epilog=config_reference(),
                           formatter_class=argparse.RawDescriptionHelpFormatter,
                           description="Train with PPO. No arguments: CartPole-v1 preset, 2 actors, local Ray.")
    train.add_argument("--config", help="YAML config (default: the bundled preset for --env)")
    train.add_argument("--env", help="registered gymnasium id (CartPole-v1; picks its preset when --config is not "
                       "given), or module.path:EnvId-v0 to import your module first; for an unregistered env "
                       "use --set env.entry_point=module.path:MyEnv (see docs/environments.md)")
    train.add_argument("--actors", type=whole_number, help="N: Ray actors collecting in parallel")
    train.add_argument("--envs-per-actor", type=whole_number, help="E: envs in each actor's vector env")
    train.add_argument("--segment-length", type=whole_number, help="T: steps per env per iteration")
    train.add_argument("--total-steps", type=whole_number, help="stop after this many env steps")
    train.add_argument("--target-return", type=float, help="stop when the 100-episode mean return reaches this")
    train.add_argument("--time-limit", type=float, metavar="SECONDS",
                       help="stop with a checkpoint after this many seconds of training, counted over the whole "
                       "run: a resumed run's earlier training included")
    train.add_argument("--seed", type=whole_number, help="seed for everything")
    train.add_argument("--run-dir", help="output directory (default runs/<env>-<timestamp>)")
    resume = train.add_mutually_exclusive_group()
    resume.add_argument("--resume", action="store_true",
                        help="continue the run in --run-dir from its newest checkpoint")
    resume.add_argument("--auto-resume", action="store_true",
                        help="resume when --run-dir holds a checkpoint, else start fresh (for retried jobs)")
    train.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port (0: off)")
    train.add_argument("--address", help="Ray cluster to join (default: RAY_ADDRESS, else a local Ray)")
    train.add_argument("--log-format", choices=["text", "json", "none"],
                       help="per-iteration stdout lines (none: in train.log only)")
    train.add_argument("--no-tensorboard", dest="tensorboard", action="store_const", const=False,
                       help="do not write TensorBoard event files to <run-dir>/tensorboard/")
    train.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                       help="override any config key, e.g. --set ppo.learning_rate=3e-4 (repeatable)")
    train.set_defaults(func=cmd_train)


def request_of(args: argparse.Namespace) -> TrainRequest:
    """The run the command line asks for: each flag given as its config key, then the --set items."""
    from dppo.run.launch import TrainRequest

    overrides = {key: getattr(args, dest) for dest, key in TRAIN_FLAGS.items()}
    return TrainRequest(config_path=args.config, overrides=overrides, sets=list(args.sets), resume=args.resume,
                        auto_resume=args.auto_resume)


def prepare(args: argparse.Namespace) -> tuple[Config, Path, dict[str, Any] | None, str, RunLock]:
    """Everything checked, the run dir's lock taken: :func:`dppo.run.launch.prepare` of the command line's run."""
    from dppo.run.launch import prepare as prepare_request

    return prepare_request(request_of(args))


def cmd_train(args: argparse.Namespace) -> int:
    from dppo.errors import RunFailure
    from dppo.run.launch import launch
    from dppo.run.signals import Stopped, StopSignals, stopped_before_training

    signals = StopSignals()
    signals.install()  # a stop at any moment from here on: see dppo.run.launch
    try:
        launch(request_of(args), signals)
    except Stopped as stop:
        from dppo.distributed.cluster import kill_children

        kill_children()  # a local Ray, also one still starting
        print(f"dppo: {stopped_before_training(stop.signum)}: nothing written", file=sys.stderr, flush=True)
        return 128 + stop.signum
    except RunFailure as err:
        print(f"dppo: run failed: {err}", file=sys.stderr, flush=True)
        return 1
    return signals.exit_code or 0  # 130 / 143 when a stop was asked for, whenever it came
