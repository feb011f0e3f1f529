"""How many of a sweep's trials the cluster holds at once. Tune starts a trial only when its whole placement group
fits and queues the rest without a word, so a sweep that asks ``concurrent: 2`` of a cluster that holds one trial
ran at half speed silently; the sweep says so at the start, with what one trial needs and how to get more."""

from __future__ import annotations

import math

from dppo.sweep.spec import Sweep


def trial_needs(bundles: list[dict[str, float]]) -> dict[str, float]:
    """Every Ray resource one trial reserves: the sum of its bundles."""
    needs: dict[str, float] = {}
    for bundle in bundles:
        for resource, amount in bundle.items():
            needs[resource] = needs.get(resource, 0.0) + amount
    return {resource: amount for resource, amount in needs.items() if amount > 0}


def trials_at_once(needs: dict[str, float], cluster: dict[str, float]) -> int:
    """Trials the cluster's resources hold together (an upper bound: a bundle must also fit on one node)."""
    return min(math.floor(cluster.get(resource, 0.0) / amount + 1e-9) for resource, amount in needs.items())


def concurrency_note(sweep: Sweep, bundles: list[dict[str, float]], cluster: dict[str, float],
                     local: bool) -> str | None:
    """One line when the cluster holds fewer trials than the sweep would run at once (None: it holds them all):
    what one trial needs, what the cluster has, and what to change. ``local``: a Ray this sweep started, which
    cannot grow; a joined cluster may (an autoscaler adds nodes for the queued trials)."""
    needs = trial_needs(bundles)
    wanted = min(sweep.spec.concurrent, sweep.total_trials())
    fits = trials_at_once(needs, cluster)
    if fits >= wanted:
        return None
    run = sweep.trial_config({}).run
    parts = [f"driver_cpus {sweep.spec.driver_cpus:g}", f"{run.actors} actor{'s' * (run.actors != 1)} x "
             f"run.actor_cpus {run.actor_cpus:g}"]
    if run.learners > 1:
        parts.append(f"{run.learners} learners x run.learner_cpus {run.learner_cpus:g}")
    need = ", ".join(f"{amount:g} Ray CPUs ({' + '.join(parts)})" if resource == "CPU" else f"{amount:g} {resource}"
                     for resource, amount in needs.items())
    has = ", ".join(f"{cluster.get(resource, 0.0):g}" + ("" if resource == "CPU" else f" {resource}")
                    for resource in needs)
    where = "this local Ray has" if local else "the cluster has"
    grows = "" if local else " (more start if it autoscales)"
    more = ("lower run.actors, run.actor_cpus or driver_cpus, or join a bigger cluster with --address" if local
            else "lower run.actors, run.actor_cpus or driver_cpus, or add nodes")
    if fits == 0:
        wait = "no trial can start" if local else "trials wait until it grows (an autoscaler adds nodes for them)"
        return f"sweep {sweep.spec.name!r}: one trial needs {need} and {where} {has}: {wait}; {more}"
    total = sweep.total_trials()
    asked = f"concurrent: {sweep.spec.concurrent}" + (f", {total} trials" if total < sweep.spec.concurrent else "")
    return (f"sweep {sweep.spec.name!r}: {fits} trial{'s' * (fits != 1)} at a time, not {wanted} ({asked}): one trial "
            f"needs {need} and {where} {has}{grows}; for more at once {more}")
