"""The options `dppo tune` compares, as the ``--set`` lines a user would pass to `dppo train`: actors, envs per
actor, segment length, where each actor's policy runs, and the CPUs (ale-py's threads) of an actor.

By default every candidate keeps the config's batch (actors x envs x segment length: the actors split the config's
envs among them), so it trains the same policy from the same samples, only sooner or later; its minibatches per
epoch (``ppo.num_minibatches``) are then the config's, and so its updates per sample. With ``change_batch`` (`dppo
tune --change-batch`) envs are also halved and doubled, and a candidate keeps the config's minibatches per epoch for
its own batch. Only what the config and the cluster allow is listed: halves and the service need an even number of
envs (or one, for the service), a policy map runs its policies in the actors, a GPU share needs a node with a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dppo.config import Config

# Where each actor's policy runs: in its thread, on a worker thread while the other half of its envs steps, on a
# GPU share (alone or in halves), or in the inference service that batches every actor's.
PLACEMENTS = ("actor", "halves", "gpu", "gpu-halves", "server")


@dataclass(frozen=True)
class Candidate:
    """One setting of the options: the config keys it sets (:meth:`sets`)."""

    actors: int
    envs_per_actor: int
    segment_length: int
    placement: str = "actor"
    actor_cpus: float = 1.0
    actor_gpus: float = 0.0  # the share of a GPU each actor asks for (placements gpu*)

    @property
    def name(self) -> str:
        cpus = f" {self.actor_cpus:g}cpu" if self.actor_cpus != 1 else ""
        return f"{self.actors}x{self.envs_per_actor} T{self.segment_length} {self.placement}{cpus}"

    @property
    def batch(self) -> int:
        return self.actors * self.envs_per_actor * self.segment_length

    def sets(self, minibatches: int | None) -> list[str]:
        """``--set`` lines (KEY=VALUE) for `dppo train`; ``minibatches``: the config's per epoch, kept."""
        lines = [f"run.actors={self.actors}", f"env.num_envs={self.envs_per_actor}",
                 f"ppo.segment_length={self.segment_length}", f"run.actor_cpus={self.actor_cpus:g}",
                 f"run.inference={'server' if self.placement == 'server' else 'actor'}",
                 f"run.actor_halves={2 if self.placement.endswith('halves') else 1}",
                 f"run.actor_gpus={self.actor_gpus:g}"]
        if minibatches is not None:
            lines += ["ppo.minibatch_size=null", f"ppo.num_minibatches={minibatches}"]
        return lines


def minibatches_per_epoch(config: Config) -> int:
    """How many minibatches the config makes of its own batch (kept for every candidate's)."""
    if config.ppo.num_minibatches is not None:
        return config.ppo.num_minibatches
    return max(1, config.batch_size // max(1, config.minibatch_size))


def around(value: int, low: int = 1) -> list[int]:
    """``value`` halved, as is and doubled (none below ``low``), in that order."""
    return sorted({max(low, value // 2), value, value * 2})


def actor_counts(cpus: float, actor_cpus: float, preset: int) -> list[int]:
    """1, 2, 4, ... actors and the count that fills the CPUs (``actor_cpus`` each), with the config's own if it fits."""
    most = max(1, int(cpus // actor_cpus))
    counts = {1, most}
    n = 2
    while n < most:
        counts.add(n)
        n *= 2
    if preset <= most:
        counts.add(preset)
    return sorted(counts)


def placements(envs: int, gpus: float, policies: int) -> list[str]:
    """Where the policy may run for actors of ``envs`` envs (``gpus``: the most any node has)."""
    if policies > 1:
        return ["actor"]
    found = ["actor"]
    if envs % 2 == 0:
        found.append("halves")
    if gpus > 0:
        found += ["gpu", "gpu-halves"] if envs % 2 == 0 else ["gpu"]
    if envs % 2 == 0 or envs == 1:
        found.append("server")
    return found


def gpu_share(actors: int, gpus: float) -> float:
    """Each actor's share when ``actors`` split the GPUs of a node with ``gpus`` (whole GPUs above one, Ray's rule)."""
    share = gpus / actors
    return float(int(share)) if share >= 1 else int(share * 100) / 100


def same_batch_envs(config: Config, actors: int) -> list[int]:
    """Envs per actor that keep the config's envs in all (actors x envs) with ``actors`` actors, if they divide."""
    total = config.run.actors * config.env.num_envs
    return [total // actors] if total % actors == 0 else []


def grid(config: Config, cpus: float, gpus: float, actors: list[int] | None = None, envs: list[int] | None = None,
         segment_lengths: list[int] | None = None, places: list[str] | None = None,
         actor_cpus: list[float] | None = None, change_batch: bool = False) -> list[Candidate]:
    """Every candidate on a cluster of ``cpus`` CPUs whose largest node has ``gpus`` GPUs; an option not given is
    varied around the config's value (envs: those that keep the batch, or with ``change_batch`` halved and doubled;
    segment length: the config's only, since it changes what is learned from). Without ``change_batch`` a candidate
    of the options given whose batch is not the config's is left out. The config's own setting comes first, then its
    neighbours, so a budget that ends early has measured those."""
    base = Candidate(config.run.actors, config.env.num_envs, config.ppo.segment_length,
                     placement_of(config), config.run.actor_cpus, config.run.actor_gpus)
    found: list[Candidate] = []
    for cpu in actor_cpus or [config.run.actor_cpus]:
        for count in actors or actor_counts(cpus, cpu, config.run.actors):
            if count * cpu > cpus:
                continue
            for num_envs in envs or (around(config.env.num_envs) if change_batch else same_batch_envs(config, count)):
                for length in segment_lengths or [config.ppo.segment_length]:
                    if not change_batch and count * num_envs * length != base.batch:
                        continue
                    for place in placements(num_envs, gpus, len(config.policy_names)):
                        if places is not None and place not in places:
                            continue
                        share = gpu_share(count, gpus) if place.startswith("gpu") else 0.0
                        if place.startswith("gpu") and share <= 0:
                            continue
                        found.append(Candidate(count, num_envs, length, place, cpu, share))
    return sorted(found, key=lambda c: distance(c, base))


def distance(a: Candidate, b: Candidate) -> int:
    """How many options two candidates set differently."""
    fields = ("placement", "actors", "envs_per_actor", "actor_cpus", "segment_length")
    return sum(getattr(a, f) != getattr(b, f) for f in fields)


def placement_of(config: Config) -> str:
    """The placement a config runs (``auto`` inference: the actors)."""
    run = config.run
    if run.inference == "server":
        return "server"
    halves = "-halves" if run.actor_halves == 2 else ""
    if run.actor_gpus > 0:
        return f"gpu{halves}"
    return "halves" if halves else "actor"
