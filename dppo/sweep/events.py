"""One log line per trial event (started, continued from a checkpoint, finished, failed), and Tune's own console
output off: the sweep's log is these lines."""

from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import Path
from typing import Any

from ray import tune

from dppo.run.logs import format_return
from dppo.sweep.spec import format_params


def silence_tune() -> None:
    """Tune's console output, off: its default engine prints a banner and a TensorBoard hint at its state folder
    even at verbose=0 (the legacy one, RAY_AIR_NEW_OUTPUT=0, prints nothing at verbose=0); a failed trial's
    traceback goes to its error file only (TUNE_PRINT_ALL_TRIAL_ERRORS=0; the failed line names the file); and
    the closing "Trials did not complete" repeats the summary's count of failed trials (filtered). Ray's
    documented switches, read when the Tuner runs. Under PBT Tune also warns its own users to reuse actors and write
    reset_config, which a dppo user cannot act on (filtered)."""
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    os.environ["TUNE_PRINT_ALL_TRIAL_ERRORS"] = "0"
    warnings.filterwarnings("ignore", message="Consider boosting PBT performance", category=UserWarning)
    logging.getLogger("ray.tune.tune").addFilter(
        lambda record: not record.getMessage().startswith("Trials did not complete"))


def last_error(trial: Any) -> str:
    """The failed trial's error in one line (the last line of Tune's error file) and where its traceback is."""
    try:  # Tune writes it in its staging folder and copies it to the sweep's (trial.path) as it goes
        lines = [line for line in Path(trial.error_file).read_text().splitlines() if line.strip()]
    except (OSError, TypeError):
        return f"its traceback is in {trial.path}"
    copy = Path(trial.path, Path(trial.error_file).name)
    return f"{lines[-1].strip() if lines else 'no message'} (traceback in {copy})"


class TrialEvents(tune.Callback):
    """Prints the events of the sweep's trials to stderr, one line each."""

    def _line(self, trial: Any, what: str, after: str = "") -> None:
        print(f"trial {trial.trial_id} {what} ({format_params(trial.config)}){after}", file=sys.stderr, flush=True)

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
        self._line(trial, "failed; the other trials go on", f": {last_error(trial)}")
