"""The one typed source of truth for a training run.

YAML goes in, CLI flags and ``--set a.b=c`` overrides go on top, and pydantic validates the result.
Every field carries a docstring; ``dppo train --help`` and the README reference are built from them.
Errors are turned into one line that names the field and the fix (:class:`ConfigError`).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dppo.errors import UsageError

PRESETS_DIR = Path(__file__).parent / "presets"
DEFAULT_ENV_ID = "CartPole-v1"


class ConfigError(UsageError):
    """Bad configuration: the message is one line that names the field and how to fix it."""


class _Section(BaseModel):
    """Strict base: unknown keys are errors (a typo must not silently fall back to a default)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)


class WrapperConfig(_Section):
    name: str
    """``module.path:Class`` or the name of one of gymnasium's wrappers, e.g. FlattenObservation."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the wrapper (the env is the first positional argument)."""

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        return {"name": data} if isinstance(data, str) else data


def _module_ref(value: str | None, example: str) -> str | None:
    if value is not None and (not value.strip() or value.startswith(":") or value.endswith(":")):
        raise ValueError(f"{value!r} is not valid; write e.g. {example}")
    return value


class EnvConfig(_Section):
    id: str | None = DEFAULT_ENV_ID
    """Gymnasium env id (CartPole-v1, LunarLander-v3, ...) or module.path:EnvId-v0, which imports
    module.path (registering the env) first, as gymnasium.make does. Null when entry_point is set."""
    entry_point: str | None = None
    """module.path:callable: an Env subclass or a function returning an Env, called with env.kwargs,
    for envs that are not registered. The module must be importable on every Ray worker."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the env (passed to gymnasium.make or to the entry point)."""
    max_episode_steps: int | None = Field(None, ge=1)
    """Time limit (episodes are truncated there and bootstrapped); null keeps the env's own."""
    wrappers: list[WrapperConfig] = Field(default_factory=list)
    """Wrappers applied in order after the env is made: a name, or {name: module:Class, kwargs: {...}}."""
    num_envs: int = Field(8, ge=1, le=4096)
    """E: environments stepped in one gymnasium vector env inside each actor."""
    vectorization: Literal["sync", "async", "ale"] = "sync"
    """sync: the E envs are stepped one after another in the actor's process; async: each env in its
    own subprocess (helps when env steps wait on I/O or are expensive); ale: ale-py's C++ vector env
    (ALE/ ids with env.atari; preprocessing in threads, the fastest for Atari)."""
    atari: bool = False
    """The standard Atari preprocessing (30 no-ops, frame skip 4 with max-pool, 84x84 gray, 4 stacked
    frames, FIRE on reset, no sticky actions) for ALE/ ids; needs the atari extra."""
    terminal_on_life_loss: bool = False
    """Learn as if a lost life ended the episode (no bootstrap) while episodes and returns stay full games;
    reads info["lives"] (Atari)."""
    clip_reward: bool = False
    """Learn from the sign of each reward; reported returns stay raw (Atari)."""
    normalize_obs: bool = False
    """Running mean/std observation normalization (clip to +-obs_clip). Use for continuous control."""
    normalize_reward: bool = False
    """Scale rewards by the running std of the discounted return. Use for continuous control."""
    obs_clip: float = Field(10.0, gt=0)
    """Normalized observations are clipped to [-obs_clip, obs_clip]."""
    reward_clip: float = Field(10.0, gt=0)
    """Scaled rewards are clipped to [-reward_clip, reward_clip]."""
    latency_ms: float = Field(0.0, ge=0)
    """Artificial per-step latency that releases the CPU (a stand-in for a remote simulator): each step takes
    this long in all, the env's own work included, the rest slept. Benchmarks."""

    @model_validator(mode="before")
    @classmethod
    def _entry_point_replaces_id(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("entry_point") and "id" not in data:
            return {**data, "id": None}
        return data

    @field_validator("id")
    @classmethod
    def _id_format(cls, value: str | None) -> str | None:
        return _module_ref(value, "CartPole-v1 or mypackage.envs:MyEnv-v0")

    @field_validator("entry_point")
    @classmethod
    def _entry_point_format(cls, value: str | None) -> str | None:
        if value is not None and value.count(":") != 1:
            raise ValueError(f"{value!r} is not module.path:callable; write e.g. mypackage.envs:MyEnv")
        return _module_ref(value, "mypackage.envs:MyEnv")

    @model_validator(mode="after")
    def _one_name(self) -> EnvConfig:
        if (self.id is None) == (self.entry_point is None):
            raise ValueError("set exactly one of env.id and env.entry_point")
        if (self.atari or self.vectorization == "ale") and not (self.id or "").startswith("ALE/"):
            raise ValueError("env.atari and env.vectorization=ale need an ALE/ id such as ALE/Breakout-v5")
        if self.vectorization == "ale" and (not self.atari or self.wrappers or self.max_episode_steps):
            raise ValueError("env.vectorization=ale applies the standard Atari preprocessing itself: set "
                             "env.atari=true and no env.wrappers or env.max_episode_steps, or use sync")
        return self

    @property
    def name(self) -> str:
        """How the env is named in logs, metrics, checkpoints and the run directory."""
        return self.id or self.entry_point or ""


class ModelConfig(_Section):
    hidden_sizes: list[int] = Field(default_factory=lambda: [64, 64])
    """Widths of the hidden layers of the policy and value MLPs (separate networks)."""
    activation: Literal["tanh", "relu"] = "tanh"
    """Hidden-layer activation."""
    init_log_std: float = 0.0
    """Initial log standard deviation of the Gaussian policy (continuous actions only)."""

    @field_validator("hidden_sizes")
    @classmethod
    def _positive_widths(cls, sizes: list[int]) -> list[int]:
        if not sizes or any(s < 1 for s in sizes):
            raise ValueError("needs at least one layer and every width >= 1, e.g. [64, 64]")
        return sizes


class PPOConfig(_Section):
    segment_length: int = Field(128, ge=1)
    """T: steps each actor collects per env per iteration."""
    epochs: int = Field(4, ge=1)
    """K: passes over the batch per iteration."""
    minibatch_size: int = Field(256, ge=1)
    """Samples per SGD step; must not exceed the batch (actors x num_envs x segment_length)."""
    learning_rate: float = Field(2.5e-4, gt=0)
    """Adam step size (eps is fixed at 1e-5, as in the reference implementation)."""
    anneal_lr: bool = True
    """Linearly anneal the learning rate to 0 over total_steps."""
    gamma: float = Field(0.99, ge=0, le=1)
    """Discount factor."""
    gae_lambda: float = Field(0.95, ge=0, le=1)
    """GAE lambda."""
    clip_coef: float = Field(0.2, gt=0)
    """Clipping range of the probability ratio."""
    clip_value_loss: bool = False
    """Clip the value update to clip_coef around the old value (the PPO reference code does; off by default
    because with unnormalized returns in the hundreds a 0.2 clip stalls the critic)."""
    value_coef: float = Field(0.5, ge=0)
    """Weight of the value loss."""
    entropy_coef: float = Field(0.01, ge=0)
    """Weight of the entropy bonus."""
    max_grad_norm: float = Field(0.5, gt=0)
    """Global gradient-norm clip."""
    target_kl: float | None = Field(None, gt=0)
    """Stop the epochs of an iteration early when approx-KL exceeds this (off when null)."""
    normalize_advantages: bool = True
    """Normalize advantages per minibatch."""


class RunConfig(_Section):
    actors: int = Field(2, ge=1, le=1024)
    """N: Ray actors collecting segments in parallel."""
    total_steps: int = Field(200_000, ge=1)
    """Stop after this many env steps (all actors together)."""
    target_return: float | None = None
    """Stop when the mean return of the last 100 finished episodes reaches this (off when null)."""
    time_limit_s: float | None = Field(None, gt=0)
    """Stop (with a checkpoint) after this many seconds of training, resumed time included: a wall-clock
    budget, for comparing actor counts at equal time or fitting a run into a job's deadline (off when null)."""
    seed: int = Field(1, ge=0)
    """Seed for torch, numpy and every env; a seeded run is reproducible on the same machine."""
    run_dir: str | None = None
    """Where progress, summary and checkpoints go (default runs/<env>-<timestamp>)."""
    name: str | None = None
    """Run name shown in logs and in the dppo_run_info metric's run label (default: the run dir's name)."""
    checkpoint_every: int = Field(10, ge=1)
    """Write a checkpoint every this many iterations (and always at the end)."""
    keep_checkpoints: int = Field(3, ge=1)
    """How many of the newest checkpoints to keep."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the learner trains: auto picks cuda when available."""
    learners: int = Field(1, ge=1, le=64)
    """L: data-parallel learner processes (torch.distributed through Ray). 1: the update runs in the driver.
    With L > 1 each global minibatch is split evenly, so ppo.minibatch_size must be a multiple of L."""
    learner_cpus: float = Field(1.0, gt=0)
    """Ray CPUs reserved per learner process (run.learners > 1)."""
    learner_resource: str | None = None
    """A custom Ray resource each learner process asks one unit of (run.learners > 1), so learners land on the
    nodes that advertise it and nowhere else; the learners then reserve no Ray CPUs (the Helm chart's
    `learners:` pods advertise `dppo_learner` with num-cpus 0, so actors never land there)."""
    actor_num_cpus: float = Field(1.0, gt=0)
    """Ray CPUs reserved per actor."""
    torch_threads: int = Field(1, ge=1)
    """torch threads in each actor (one is fastest for small batched MLPs)."""
    learner_threads: int = Field(1, ge=1)
    """torch CPU threads of the learner's update: 1 is fastest for small MLPs and keeps a shared machine
    from thrashing; raise it for large networks on a CPU learner."""
    overlap_sampling: bool = False
    """Start the next sampling round before the update, with the weights it is about to replace: actors
    run one policy version behind (as in Cleanba) and sampling hides behind the update."""
    runtime_env: dict[str, Any] | None = None
    """Ray runtime_env for the job (working_dir, py_modules, pip, env_vars): how a user's env code reaches
    the workers of a cluster; passed to ray.init."""
    address: str | None = None
    """Ray cluster to join; null starts a local Ray in-process (RAY_ADDRESS is honoured too)."""
    log_format: Literal["text", "json"] = "text"
    """Per-iteration log lines on stdout: human-readable text or one JSON object per line."""
    tensorboard: bool = True
    """Write TensorBoard event files to <run_dir>/tensorboard/ (every progress.jsonl scalar, env steps on x)."""


class MetricsConfig(_Section):
    port: int = Field(0, ge=0, le=65535)
    """Prometheus metrics port of the learner (0: off)."""
    host: str = "0.0.0.0"
    """Address the metrics server binds to."""
    linger_s: float = Field(0.0, ge=0)
    """Keep serving metrics this long after training ends so the final values get scraped."""


class FaultConfig(_Section):
    max_actor_restarts: int = Field(10, ge=0)
    """Actor restarts allowed within restart_window_s before the run stops (crash-loop guard)."""
    restart_window_s: float = Field(600.0, gt=0)
    """Sliding window for max_actor_restarts and max_learner_restarts."""
    max_learner_restarts: int = Field(3, ge=0)
    """Learner-group restarts (run.learners > 1) allowed within restart_window_s before the run stops."""
    env_retries: int = Field(3, ge=0)
    """An env that raises is recreated and the segment resampled up to this many times in a row."""
    sample_timeout_s: float | None = Field(None, gt=0)
    """Per-iteration deadline for segments; late ones are dropped and counted (off when null)."""
    min_actors_fraction: float = Field(1.0, gt=0, le=1)
    """With sample_timeout_s, train on what arrived if at least this fraction of actors delivered."""
    nonfinite_data: Literal["error", "drop"] = "error"
    """NaN/Inf in observations or rewards: stop the run with an error, or drop the segment and count it."""
    max_nonfinite_updates: int = Field(3, ge=1)
    """Consecutive updates with a NaN/Inf loss or gradient (each skipped) before the run stops."""


class Config(_Section):
    """A whole run: env, model, PPO hyperparameters, run control, metrics and fault handling."""

    env: EnvConfig = Field(default_factory=EnvConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    ppo: PPOConfig = Field(default_factory=PPOConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    faults: FaultConfig = Field(default_factory=FaultConfig)

    @model_validator(mode="after")
    def _minibatch_splits(self) -> Config:
        if self.ppo.minibatch_size % self.run.learners:
            raise ValueError(f"ppo.minibatch_size {self.ppo.minibatch_size} does not split evenly over run.learners "
                             f"{self.run.learners}; make it a multiple of run.learners")
        return self

    @model_validator(mode="after")
    def _minibatch_fits(self) -> Config:
        if self.ppo.minibatch_size > self.batch_size:
            raise ValueError(
                f"ppo.minibatch_size {self.ppo.minibatch_size} exceeds the batch of {self.batch_size} samples "
                f"(run.actors {self.run.actors} x env.num_envs {self.env.num_envs} x ppo.segment_length "
                f"{self.ppo.segment_length}); lower ppo.minibatch_size or raise one of those"
            )
        return self

    @property
    def steps_per_iteration(self) -> int:
        """Env steps gathered per iteration: N x E x T."""
        return self.run.actors * self.env.num_envs * self.ppo.segment_length

    @property
    def batch_size(self) -> int:
        """Samples per update (same as steps per iteration)."""
        return self.steps_per_iteration

    @property
    def num_iterations(self) -> int:
        """Iterations that total_steps allows (the learning-rate schedule spans these)."""
        return max(1, math.ceil(self.run.total_steps / self.steps_per_iteration))

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def preset_path(env_id: str) -> Path | None:
    """The bundled preset whose ``env.id`` is ``env_id``, if there is one."""
    for path in sorted(PRESETS_DIR.glob("*.yaml")):
        data = yaml.safe_load(path.read_text()) or {}
        if data.get("env", {}).get("id") == env_id:
            return path
    return None


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a config file into a dict, with one-line errors for the ways a file can be wrong."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} not found; pass an existing YAML file to --config")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"config file {str(path)!r} is not valid YAML{where}; fix the syntax") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"cannot read config file {str(path)!r}: {err}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of sections (env:, ppo:, run:, ...)")
    return data


def parse_override(item: str) -> tuple[list[str], Any]:
    """``a.b=value`` -> (["a", "b"], value parsed as YAML so numbers, booleans and lists work)."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {item!r} is not key=value; write e.g. --set ppo.learning_rate=3e-4")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return key.strip().split("."), value


def merge(data: dict[str, Any], keys: list[str], value: Any) -> None:
    """Set ``data[k1][k2]... = value``, creating sections on the way."""
    node = data
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{'.'.join(keys)}: {key!r} is a value, not a section; check the key")
        node = child
    node[keys[-1]] = value


def _describe(err: ValidationError) -> str:
    first = err.errors()[0]
    loc = ".".join(str(part) for part in first["loc"]) or "config"
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        return f"unknown key {loc!r}; check the spelling (dppo train --help lists the keys)"
    if first["type"] in {"int_parsing", "float_parsing", "bool_parsing", "int_type", "float_type", "bool_type",
                         "string_type", "list_type", "dict_type", "literal_error", "int_from_float"}:
        return f"{loc}: {msg} (got {first.get('input')!r})"
    if loc == "config":
        return msg
    return f"{loc}: {msg} (got {first.get('input')!r})" if "input" in first and not isinstance(
        first["input"], dict) else f"{loc}: {msg}"


_SCIENTIFIC = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+$")
_FREE_FORM = {"kwargs", "runtime_env", "wrappers"}  # user data, passed on untouched


def numbers_in_e_notation(data: Any) -> Any:
    """``1e6`` as people write step budgets: YAML 1.1 reads it as a string, so make it a float here;
    integer fields then accept it when it is an exact integer (and name the field when it is not)."""
    if isinstance(data, dict):
        return {k: v if k in _FREE_FORM else numbers_in_e_notation(v) for k, v in data.items()}
    if isinstance(data, str) and _SCIENTIFIC.match(data.strip()):
        return float(data)
    return data


def validate(data: dict[str, Any]) -> Config:
    """Validate a nested dict into a Config, or raise ConfigError with one line."""
    try:
        return Config.model_validate(numbers_in_e_notation(data))
    except ValidationError as err:
        raise ConfigError(_describe(err)) from None


def load_config(
    path: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    sets: list[str] | None = None,
) -> Config:
    """Build the resolved config: preset or file, then flag overrides (dotted keys), then ``--set`` items.

    Without ``path`` the preset for the requested env id is used (CartPole-v1 when none is given), so
    ``dppo train --env Pendulum-v1`` gets tuned hyperparameters.
    """
    overrides = overrides or {}
    pairs = [(key.split("."), value) for key, value in overrides.items() if value is not None]
    pairs += [parse_override(item) for item in sets or []]
    if path is not None:
        data = read_yaml(path)
    else:
        env_id = next((v for k, v in pairs if k == ["env", "id"]), DEFAULT_ENV_ID)
        entry_point = any(k == ["env", "entry_point"] and v for k, v in pairs)
        preset = None if entry_point else preset_path(env_id)
        data = read_yaml(preset) if preset else {}
    for keys, value in pairs:
        merge(data, keys, value)
    return validate(data)
