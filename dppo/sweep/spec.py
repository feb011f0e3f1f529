"""The sweep file: a base dppo config, a search space over its keys, a scheduler and how many trials.

```yaml
base: {env: Pendulum-v1}          # a preset (env: ID) or a config file (config: path.yaml), then set: overrides
set: {run.total_steps: 100000}
space:
  ppo.learning_rate: loguniform(1e-4, 1e-3)
  ppo.gae_lambda: choice([0.9, 0.95, 0.98])
  run.seed: grid([1, 2])
scheduler: {name: asha}           # none | asha | pbt
trials: 8                         # samples of the space (each grid point is tried that many times)
concurrent: 2
```
Every key and every value a distribution can take is checked against the pydantic config before anything runs,
so a typo or a float for an integer key is one line, not a failed trial.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator

from dppo.config import Config, ConfigError, MetricsConfig, load_config, read_yaml
from dppo.config.base import Section, describe
from dppo.errors import UsageError

DISTRIBUTION = re.compile(r"^\s*(loguniform|uniform|randint|choice|grid)\s*\((.*)\)\s*$", re.S)


def _number(value: Any) -> Any:
    """YAML reads 1e-4 as a string (its floats need a dot): make it the number it is."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    if isinstance(value, list):
        return [_number(v) for v in value]
    return value


class Distribution:
    """One key's search space: ``kind`` and its arguments (bounds, or the values to choose among)."""

    def __init__(self, key: str, text: str) -> None:
        match = DISTRIBUTION.match(str(text))
        if match is None:
            raise UsageError(f"sweep space {key}: {text!r} is not one of loguniform(a, b), uniform(a, b), "
                             "randint(a, b), choice([...]), grid([...])")
        self.key, self.kind = key, match.group(1)
        try:
            args = [_number(a) for a in yaml.safe_load(f"[{match.group(2)}]")]
        except (yaml.YAMLError, TypeError):
            args = None
        if self.kind in ("choice", "grid"):
            ok = isinstance(args, list) and len(args) == 1 and isinstance(args[0], list) and args[0]
            self.values = args[0] if ok else []
        else:
            ok = (isinstance(args, list) and len(args) == 2 and all(isinstance(a, int | float) for a in args)
                  and args[0] < args[1] and (self.kind != "loguniform" or args[0] > 0))
            self.values = args if ok else []
        if not ok:
            raise UsageError(f"sweep space {key}: {text!r} has the wrong arguments; write e.g. loguniform(1e-4, 1e-3) "
                             "(0 < low < high), randint(1, 8) or choice([0.9, 0.95])")

    def tune_domain(self) -> Any:
        """The Ray Tune search space object for this distribution."""
        from ray import tune

        if self.kind == "grid":
            return tune.grid_search(self.values)
        if self.kind == "choice":
            return tune.choice(self.values)
        return {"loguniform": tune.loguniform, "uniform": tune.uniform, "randint": tune.randint}[self.kind](
            *self.values)

    def mutation(self) -> Any:
        """What PBT draws a resampled value from (a grid cannot be mutated: it is a list of fixed points)."""
        return self.values if self.kind == "choice" else self.tune_domain()


def format_value(value: Any) -> str:
    """A searched value as people read it (the log, trials.md): floats to 4 significant digits, 0.002157 rather
    than 0.002157135141933016; the exact values are in each trial's config.yaml and in best-config.yaml."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def format_params(params: dict[str, Any]) -> str:
    """One trial's searched values, ``key=value`` sorted by key."""
    return " ".join(f"{key}={format_value(value)}" for key, value in sorted(params.items()))


class SchedulerSpec(Section):
    name: Literal["none", "asha", "pbt"] = "none"
    """none: every trial to its budget; asha: stop poor trials early; pbt: population-based training."""
    grace_iterations: int = Field(5, ge=1)
    """asha: iterations every trial runs before it can be stopped."""
    reduction_factor: float = Field(3.0, gt=1)
    """asha: the fraction 1/reduction_factor of trials promoted at each rung."""
    perturbation_interval: int = Field(5, ge=1)
    """pbt: iterations between exploit/explore steps (trials checkpoint at this interval)."""
    quantile: float = Field(0.25, gt=0, le=0.5)
    """pbt: the bottom fraction of trials that copy one of the top fraction."""
    mutate: list[str] | None = None
    """pbt: the space keys it perturbs (default: every key that is not a grid)."""
    synch: bool = False
    """pbt: trials wait for each other at every perturbation (Tune's synchronous PBT), so each exploit compares
    them at the same iteration whatever the order they report in; the faster ones idle until the slowest catches
    up. Off: each trial is compared whenever it reaches the interval, against where the others are then."""


class SweepSpec(Section):
    base: dict[str, str] = Field(default_factory=dict)
    """{env: ID} for that env's preset, or {config: path} for a config file (relative to the sweep file)."""
    set: dict[str, Any] = Field(default_factory=dict)
    """Overrides of the base config for every trial (dotted keys)."""
    space: dict[str, str]
    """Dotted config key -> distribution."""
    scheduler: SchedulerSpec = Field(default_factory=SchedulerSpec)
    trials: int = Field(4, ge=1)
    """Samples of the space (with grid keys: of each grid point)."""
    concurrent: int = Field(2, ge=1)
    """Trials running at once; each reserves driver_cpus + actors x run.actor_cpus CPUs."""
    driver_cpus: float = Field(0.5, gt=0)
    """Ray CPUs of each trial's driver (its coordinator and, with one learner, the update)."""
    metric: str = "episode_return_mean"
    """The progress.jsonl key the search maximizes."""
    name: str = "sweep"
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    """The sweep's Prometheus endpoint (port 0: off): every trial's run metrics with a ``trial`` label, served
    by the sweep driver (the trials serve none)."""

    @field_validator("base")
    @classmethod
    def _one_base(cls, base: dict[str, str]) -> dict[str, str]:
        if len(base) > 1 or not set(base) <= {"env", "config"}:
            raise ValueError("base takes one of env: ID (its preset) or config: path.yaml")
        return base


class Sweep:
    """A checked sweep: the spec, its base config (as a dict) and each key's distribution."""

    def __init__(self, spec: SweepSpec, base: dict[str, Any], space: dict[str, Distribution]) -> None:
        self.spec, self.base, self.space = spec, base, space

    def trial_config(self, params: dict[str, Any]) -> Config:
        """The base config with one trial's values."""
        return load_config(None, None, [f"{k}={yaml.safe_dump(v, default_flow_style=True).strip()}"
                                        for k, v in params.items()], base=self.base)

    def total_trials(self) -> int:
        """Trials Tune makes: ``trials`` samples of every point of the grid keys."""
        return self.spec.trials * math.prod(len(d.values) for d in self.space.values() if d.kind == "grid")

    def mutated(self) -> dict[str, Any]:
        keys = self.spec.scheduler.mutate or [k for k, d in self.space.items() if d.kind != "grid"]
        return {key: self.space[key].mutation() for key in keys}


def load_sweep(path: str | Path, metrics_port: int | None = None) -> Sweep:
    """Read and check a sweep file (``metrics_port``: --metrics-port, over the file's metrics.port); any problem
    is a UsageError of one line."""
    path = Path(path)
    data = read_yaml(path)
    if metrics_port is not None:
        data["metrics"] = {**(data.get("metrics") or {}), "port": metrics_port}
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as err:
        problems = describe(err, SweepSpec, {}, key_list="docs/sweeps.md lists the keys")
        raise UsageError(f"sweep file {str(path)!r}: {problems}") from None
    sets = [f"{k}={yaml.safe_dump(v, default_flow_style=True).strip()}" for k, v in spec.set.items()]
    config_file = spec.base.get("config")
    try:
        config = load_config(path.parent / config_file if config_file else None,
                             {"env.id": spec.base["env"]} if "env" in spec.base else None, sets)
    except ConfigError as err:
        raise UsageError(f"sweep file {str(path)!r}: base: {err}") from None
    base = config.model_dump(mode="json")
    space = {key: Distribution(key, text) for key, text in spec.space.items()}
    sweep = Sweep(spec, base, space)
    for key, dist in space.items():  # every value a distribution can take must be a valid config
        for value in dist.values:
            try:
                sweep.trial_config({key: value})
            except ConfigError as err:
                raise UsageError(f"sweep space {key}: {value!r} does not fit the config: {err}") from None
    unknown = set(spec.scheduler.mutate or []) - set(space)
    if unknown:
        raise UsageError(f"scheduler.mutate names {sorted(unknown)}, which are not in space: list keys of space")
    if spec.scheduler.name == "pbt" and not sweep.mutated():
        raise UsageError("scheduler pbt needs a space key to perturb that is not a grid; add one (e.g. "
                         "ppo.learning_rate: loguniform(1e-4, 1e-3))")
    return sweep
