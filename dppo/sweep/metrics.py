"""The sweep's Prometheus metrics, served by the sweep driver (one endpoint for the whole sweep, where a single
run's driver would serve its own): every trial's run metrics with a ``trial`` label, and trials by state.

The trials report each iteration's progress record to Tune, which hands it to this callback in the driver, so
the trials themselves serve nothing (they may share a node: one port each would collide). The label is bounded:
a trial's series are removed once it has ended and another trial starts (or the sweep ends), so at most
``concurrent`` trials' series are live at once plus those just ended; the ended ones keep their history in
Prometheus and their final values in trials.csv.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from ray import tune

from dppo.run.metrics import DIAGNOSTIC_GAUGES, INFO_PREFIX, Exporter

STATES = ("PENDING", "RUNNING", "PAUSED", "TERMINATED", "ERROR")
_LIVE: dict[str, TrialMetrics] = {}  # this driver process's instance per sweep name


def live_metrics(sweep_name: str, env: str) -> TrialMetrics:
    """The instance this process serves for the sweep (what an unpickled callback becomes)."""
    return _LIVE.get(sweep_name) or TrialMetrics(sweep_name, env)


class TrialMetrics(tune.Callback, Exporter):
    """Tune callback: each trial's progress record into ``trial``-labelled gauges and counters."""

    def __init__(self, sweep_name: str, env: str) -> None:
        self.sweep_name, self.env = sweep_name, env
        _LIVE[sweep_name] = self
        self.registry = r = CollectorRegistry()
        self.diagnostics = {key: Gauge(name, help_text, ["trial"], registry=r)
                            for key, (name, help_text) in DIAGNOSTIC_GAUGES.items()}
        self.env_info = Gauge("dppo_env_info", "The env's own figures (metrics.info_keys) of each trial: a key's mean "
                              "over the episodes that ended in its last iteration.", ["trial", "key"], registry=r)
        self._info_series: set[tuple[str, str]] = set()  # (trial, key) of the dppo_env_info series that exist
        self.env_steps = Counter("dppo_env_steps", "Env steps collected by each trial's actors.", ["trial"],
                                 registry=r)
        self.trials = Gauge("dppo_sweep_trials", "Trials of the sweep by Tune state.", ["state"], registry=r)
        self.restores = Counter("dppo_sweep_trial_restores", "Trials restored from a checkpoint (a PBT exploit of "
                                "another trial's, or a paused trial going on).", registry=r)
        self.failures = Counter("dppo_sweep_trial_failures", "Trials that failed.", registry=r)
        Gauge("dppo_run_info", "Constant 1, labelled with the sweep's env id and name.", ["env", "run"],
              registry=r).labels(env=env, run=sweep_name).set(1)
        for state in STATES:
            self.trials.labels(state=state)
        self._ended: set[str] = set()
        self._live: set[str] = set()

    def __reduce__(self) -> tuple:
        """Tune pickles its run config, callbacks included, into the sweep directory: a resumed sweep gets the
        instance its own process serves, not a copy of a registry (which holds locks) that nothing serves."""
        return live_metrics, (self.sweep_name, self.env)

    def _count_states(self, trials: list, ending: Any = None, state: str = "") -> None:
        """Trials by state; ``ending`` is counted as ``state`` (Tune calls back before it sets the status)."""
        counts = dict.fromkeys(STATES, 0)
        for trial in trials:
            status = state if trial is ending else trial.status
            counts[status] = counts.get(status, 0) + 1
        for state in STATES:
            self.trials.labels(state=state).set(counts[state])

    def forget_ended(self) -> None:
        """Remove the series of trials that have ended (their last values have had a scrape interval)."""
        for trial in self._ended & self._live:
            for metric in (*self.diagnostics.values(), self.env_steps):
                metric.remove(trial)
            for series in [s for s in self._info_series if s[0] == trial]:
                self.env_info.remove(*series)
                self._info_series.discard(series)
        self._live -= self._ended
        self._ended.clear()

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.forget_ended()
        self._count_states(trials)

    def on_trial_restore(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.restores.inc()

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        label = trial.trial_id
        self._live.add(label)
        self._ended.discard(label)
        for key, gauge in self.diagnostics.items():
            value = result.get(key)
            if isinstance(value, int | float) and value != float("-inf"):
                gauge.labels(trial=label).set(value)
        for key, value in result.items():
            if isinstance(key, str) and key.startswith(INFO_PREFIX):  # no value: no series (as a run's own)
                series = (label, key.removeprefix(INFO_PREFIX))
                if isinstance(value, int | float):
                    self.env_info.labels(*series).set(value)
                    self._info_series.add(series)
                else:  # removing a series that is not there does nothing
                    self.env_info.remove(*series)
                    self._info_series.discard(series)
        self.env_steps.labels(trial=label).inc(max(0, result.get("env_steps_delta", 0)))
        self._count_states(trials)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._ended.add(trial.trial_id)
        self._count_states(trials, trial, "TERMINATED")

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._ended.add(trial.trial_id)
        self.failures.inc()
        self._count_states(trials, trial, "ERROR")

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        self._count_states(trials)
