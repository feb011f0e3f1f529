"""The calls a run makes every round or env step leave no task event in Ray's GCS (dppo.distributed.ray_calls
.per_round): the GCS keeps every task event up to 100,000, so they made a long run's GCS grow (docs/benchmarks.md,
the long runs)."""

from __future__ import annotations

import time
from pathlib import Path

from runs import train_small

PER_ROUND = {"Actor.sample", "InferenceService.load", "InferenceService.stats", "InferenceService.act",
             "Evaluator.evaluate", "Learner.update", "Learner.weights"}


def task_names() -> list[str]:
    """Every task event's function in the session cluster's GCS (read from the GCS: the cluster has no dashboard)."""
    import ray

    events = ray._private.state.state._get_all_task_events()
    return [e.task_info.func_or_class_name for e in events if e.HasField("task_info")]


def test_a_run_s_per_round_calls_keep_no_task_event(tmp_path: Path, ray_address: str) -> None:
    done = train_small(ray_address, tmp_path / "run", "--set", "run.inference=server", "--set", "run.eval_every=1",
                       total_steps=2048)
    assert done.returncode == 0, done.stderr[-2000:]
    time.sleep(2.0)  # the workers send their task events every second
    names = task_names()
    started = {name for name in names if name.endswith(".__init__")}
    assert {"Actor.__init__", "InferenceService.__init__", "Evaluator.__init__"} <= started  # events are kept
    assert not PER_ROUND.intersection(names), sorted(PER_ROUND.intersection(names))
