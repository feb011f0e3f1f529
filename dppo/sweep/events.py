"""One log line per trial event (started, continued from a checkpoint, finished, failed)."""

from __future__ import annotations

import sys
from typing import Any

from ray import tune

from dppo.run.logs import format_return
from dppo.sweep.spec import format_params


class TrialEvents(tune.Callback):
    """Prints the events of the sweep's trials to stderr, one line each."""

    def _line(self, trial: Any, what: str) -> None:
        print(f"trial {trial.trial_id} {what} ({format_params(trial.config)})", file=sys.stderr, flush=True)

    def __init__(self) -> None:
        self.started: set[str] = set()

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """A trial starts once; it starts again after a pause (PBT's exploit, ASHA's rungs) from a checkpoint."""
        again = trial.trial_id in self.started
        self.started.add(trial.trial_id)
        self._line(trial, "continues from a checkpoint" if again else "started")

    def on_trial_restore(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._line(trial, "restored from a checkpoint")

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        result = trial.last_result or {}
        score = result.get("episode_return_mean")
        self._line(trial, f"finished at {result.get('env_steps', 0):,} env steps, return "
                          f"{'-' if score is None else format_return(score)}")

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._line(trial, "failed; the other trials go on")
