"""Which data path a run's policy takes (run.inference), decided once at start-up: the setting, or for ``auto``
the one `dppo tune` measured fastest on this machine (:mod:`dppo.config.tuned`)."""

from __future__ import annotations

from dppo.config import Config
from dppo.config.tuned import auto_inference
from dppo.errors import UsageError


def choose_inference(config: Config) -> tuple[str, str]:
    """What run.inference is, and for ``auto`` why (a line's end): the data path `dppo tune` measured fastest on
    this machine when it saved a result for this env (:mod:`dppo.config.tuned`), else the actors, the mode no
    measurement found slower everywhere (issue 42); actors that run their own policy keep it."""
    run = config.run
    if run.inference != "auto":
        return run.inference, ""
    if len(config.policy_names) > 1 or run.actor_halves == 2 or run.actor_gpus > 0:
        return "actor", "auto: the actors run their own policy (a policy map, run.actor_halves or run.actor_gpus)"
    return auto_inference(config.env.name, config.env.num_envs)


def resolve_inference(config: Config) -> Config:
    """The config with run.inference decided (:func:`choose_inference`); the service needs an even E (or 1) to
    step two halves."""
    mode = choose_inference(config)[0]
    num_envs = config.env.num_envs
    if mode == "server" and num_envs > 1 and num_envs % 2:
        raise UsageError(f"run.inference=server steps each actor's envs in two halves, so env.num_envs must be even "
                         f"(or 1), not {num_envs}; set env.num_envs={num_envs + 1} or run.inference=actor")
    return config.model_copy(update={"run": config.run.model_copy(update={"inference": mode})})
