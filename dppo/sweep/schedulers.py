"""The sweep file's scheduler as Ray Tune's own: ASHA (early stopping) or population-based training."""

from __future__ import annotations

from typing import Any

from dppo.sweep.spec import Sweep


def make_scheduler(sweep: Sweep) -> Any:
    """None (FIFO: every trial to its budget), ASHAScheduler or PopulationBasedTraining; time is in iterations
    (one Tune report per dppo iteration)."""
    from ray.tune.schedulers import ASHAScheduler, PopulationBasedTraining

    spec = sweep.spec.scheduler
    if spec.name == "asha":
        return ASHAScheduler(time_attr="training_iteration", grace_period=spec.grace_iterations,
                             reduction_factor=spec.reduction_factor, max_t=sweep.trial_config({}).num_iterations)
    if spec.name == "pbt":
        return PopulationBasedTraining(time_attr="training_iteration", perturbation_interval=spec.perturbation_interval,
                                       quantile_fraction=spec.quantile, hyperparam_mutations=sweep.mutated(),
                                       synch=spec.synch)
    return None
