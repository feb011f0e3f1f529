"""A sweep's trial: one whole dppo run (the same Coordinator as `dppo train`) inside a Ray Tune trial.

The trial reports every iteration's progress record to Tune, with the run's checkpoint whenever one was written
that iteration. A trial that Tune restores from a checkpoint (a paused ASHA trial, a PBT exploit of another
trial's checkpoint) resumes from it with the config Tune hands it now: under PBT that is the *perturbed*
hyperparameters, and the Trainer reads its learning rate, clip range and the rest from the config at every
update, so the perturbed values are the ones in effect (the weights, optimizer and normalizer statistics are the
source's). Each progress record carries the trial's searched values (``hp/<key>``) and its id, so the change is
in progress.jsonl and TensorBoard.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from dppo.sweep.spec import Sweep

CHECKPOINT_FILE = "ckpt.pt"


def trial_bundles(sweep: Sweep) -> list[dict[str, float]]:
    """One placement group per trial: its driver, then a bundle per actor (and per learner process), so a trial's
    actors are reserved together and the cluster is never oversubscribed."""
    run = sweep.trial_config({}).run
    actor = {"CPU": run.actor_cpus, **({"GPU": run.actor_gpus} if run.actor_gpus else {})}  # its GPU share too
    bundles = [{"CPU": sweep.spec.driver_cpus}] + [actor] * run.actors
    if run.learners > 1:
        bundles += [{"CPU": run.learner_cpus}] * run.learners
    return bundles


def trial_resources(sweep: Sweep) -> Any:
    """Tune's resources of a trial: its placement group."""
    from ray import tune

    return tune.PlacementGroupFactory(trial_bundles(sweep))


def run_trial(params: dict[str, Any], sweep: Sweep, sweep_dir: str) -> None:
    """Tune's function trainable: train with ``params`` applied to the sweep's base config."""
    from ray import tune

    from dppo.run.checkpoint import decode
    from dppo.run.coordinator import Coordinator

    context = tune.get_context()
    trial_id = context.get_trial_id()
    config = sweep.trial_config(params)
    config.metrics.port = 0  # trials share nodes: the sweep driver serves their metrics (dppo.sweep.metrics)
    config.run.log_format = "none"  # iteration lines in the trial's train.log; the sweep logs trial events
    if sweep.spec.scheduler.name == "pbt":  # a checkpoint at every perturbation, for other trials to exploit
        config.run.checkpoint_every = sweep.spec.scheduler.perturbation_interval
    run_dir = Path(sweep_dir) / "trials" / trial_id
    config.run.run_dir, config.run.name = str(run_dir), trial_id
    resume, source = None, trial_id
    restored = tune.get_checkpoint()
    if restored is not None:
        with restored.as_directory() as directory:
            resume = decode((Path(directory) / CHECKPOINT_FILE).read_bytes(), f"trial {trial_id}'s checkpoint")
        source = resume["config"]["run"].get("name") or trial_id  # another trial's, when PBT exploits it
        resume["config"] = config.model_dump(mode="json")  # continue with this trial's (perturbed) values
        _drop_later_checkpoints(run_dir / "checkpoints", resume["counters"]["iteration"])
    coordinator = Coordinator(config, run_dir, resume, on_iteration=_reporter(config.run.seed))
    coordinator.record_extra = {"trial": trial_id, **{f"hp/{k}": v for k, v in params.items()}}
    coordinator.start()
    coordinator.run_dir.path.mkdir(parents=True, exist_ok=True)
    coordinator.run_dir.write_config(config.to_yaml())
    if resume is not None:
        exploited = f" from trial {source}'s checkpoint" if source != trial_id else ""
        coordinator.reporter.message(f"trial {trial_id} resumes at iteration {coordinator.state.counters.iteration}"
                                     f"{exploited} with {params}")
    try:
        coordinator.run()
    finally:
        coordinator.shutdown()


def _drop_later_checkpoints(directory: Path, iteration: int) -> None:
    """A trial restored from an earlier point (another trial's checkpoint under PBT) drops its own later ones, which
    belong to the line it left."""
    from dppo.run.checkpoint import NAME, CheckpointStore

    for path in CheckpointStore(directory, 1).list():
        if int(NAME.match(path.name).group(1)) > iteration:
            path.unlink(missing_ok=True)


def _reporter(seed: int) -> Any:
    """The on_iteration callback: the record to Tune, with a copy of this iteration's checkpoint when there is one."""
    from ray import tune

    def report(record: dict[str, Any], checkpoint: Path | None) -> None:
        metrics = {k: v for k, v in record.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        metrics.setdefault("episode_return_mean", float("-inf"))  # no episode finished yet: the worst score
        if checkpoint is None:
            tune.report(metrics)
            return
        with tempfile.TemporaryDirectory(prefix="dppo-trial-") as directory:
            shutil.copyfile(checkpoint, Path(directory) / CHECKPOINT_FILE)
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(directory))

    return report
