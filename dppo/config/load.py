"""Building the resolved config: a preset or YAML file, then CLI flags, then ``--set a.b=c`` items; pydantic
validates the result and every error becomes one line that names the field and the fix (:class:`ConfigError`)."""

from __future__ import annotations

import copy
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from dppo.config.base import ConfigError, describe
from dppo.config.env import DEFAULT_ENV_ID
from dppo.config.root import Config

PRESETS_DIR = Path(__file__).parent.parent / "presets"
GPU_PRESETS_DIR = PRESETS_DIR / "gpu"  # for many actors and a learner on a GPU (configs/gpu/ in the repository)
MANY_ACTORS = 8  # from this many actors on, an env's GPU preset is the one to use (on a GPU machine)
FAR = 4  # minibatches per epoch this many times the design's (or fewer) are worth a note


class ConfigNote(UserWarning):
    """Something about the resolved config a user should know that is not an error: one line on stderr, once."""


def preset_path(env_id: str, gpu: bool = False) -> Path | None:
    """The bundled preset whose ``env.id`` is ``env_id``, if there is one; ``gpu``: the one for many actors and a
    learner on a GPU (presets/gpu/)."""
    for path in sorted((GPU_PRESETS_DIR if gpu else PRESETS_DIR).glob("*.yaml")):
        data = yaml.safe_load(path.read_text()) or {}
        if data.get("env", {}).get("id") == env_id:
            return path
    return None


def cuda_available() -> bool:
    """Whether this process sees a GPU (``run.device: auto`` then trains on it); torch only loads when asked."""
    import torch

    return torch.cuda.is_available()


def shown_path(path: Path) -> str:
    """A preset's path as a user passes it to --config: configs/... in the repository, else the installed file."""
    in_repo = Path("configs") / path.relative_to(PRESETS_DIR)
    return str(in_repo) if in_repo.is_file() and in_repo.resolve() == path.resolve() else str(path)


def choose_preset(env_id: str, actors: int | None, device: str | None,
                  has_gpu: Callable[[], bool] = cuda_available) -> Path | None:
    """The preset for ``env_id``: its GPU preset when the run asks for MANY_ACTORS or more and the learner resolves
    to a GPU (``device`` auto asks ``has_gpu``), else the CPU one. Either choice among the two is said in one
    note: the GPU preset taken, or, without a GPU, the one to use on a GPU machine."""
    preset, gpu_preset = preset_path(env_id), preset_path(env_id, gpu=True)
    if preset is None or gpu_preset is None or actors is None or actors < MANY_ACTORS:
        return preset
    if device == "cuda" or (device in (None, "auto") and has_gpu()):
        warnings.warn(f"{env_id} with {actors} actors and a GPU learner: using the preset {shown_path(gpu_preset)} "
                      f"(pass --config {shown_path(preset)} for the CPU one)", ConfigNote, stacklevel=3)
        return gpu_preset
    warnings.warn(f"{env_id} with {actors} actors: the learner is on the CPU, so the preset is {shown_path(preset)}; "
                  f"on a GPU machine use --config {shown_path(gpu_preset)} (dppo picks it there)", ConfigNote,
                  stacklevel=3)
    return preset


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


# Keys renamed since they were published: (section, old) -> new. Users' YAML files outlive our refactors.
RENAMED = {("run", "torch_threads"): "actor_threads", ("run", "actor_num_cpus"): "actor_cpus"}


# What other PPO code calls our keys (Stable-Baselines3, CleanRL, RLlib): a "did you mean" for people who
# bring their hyperparameters from there. Names that differ only in spelling are found without this table.
ALIASES = {
    "lr": "ppo.learning_rate", "n_steps": "ppo.segment_length", "num_steps": "ppo.segment_length",
    "rollout_fragment_length": "ppo.segment_length", "n_epochs": "ppo.epochs", "update_epochs": "ppo.epochs",
    "num_epochs": "ppo.epochs", "batch_size": "ppo.minibatch_size",
    "ent_coef": "ppo.entropy_coef", "vf_coef": "ppo.value_coef", "vf_loss_coeff": "ppo.value_coef",
    "clip_range": "ppo.clip_coef", "clip_param": "ppo.clip_coef", "clip_range_vf": "ppo.value_clip_coef",
    "vf_clip_param": "ppo.value_clip_coef", "clip_vloss": "ppo.clip_value_loss", "norm_adv": "ppo.normalize_advantages",
    "normalize_advantage": "ppo.normalize_advantages", "lambda": "ppo.gae_lambda", "lam": "ppo.gae_lambda",
    "total_timesteps": "run.total_steps", "num_workers": "run.actors", "num_env_runners": "run.actors",
    "env_id": "env.id", "net_arch": "model.hidden_sizes",
    **{old: f"{section}.{new}" for (section, old), new in RENAMED.items()},
}


class DeprecatedKey(ConfigNote):
    """A config key under its old name: it still works; the message names the new one."""


def renamed_keys(data: dict[str, Any], warn: bool = True) -> dict[str, Any]:
    """``data`` with deprecated keys under their new names (a warning each unless ``warn`` is false: a
    checkpoint's stored config is not the user's to fix); both names at once is an error."""
    data = dict(data)
    for (section, old), new in RENAMED.items():
        values = data.get(section)
        if not isinstance(values, dict) or old not in values:
            continue
        if new in values:
            raise ConfigError(f"{section}.{old} and {section}.{new} are both set; keep only {section}.{new} "
                              f"({section}.{old} is its deprecated name)")
        data[section] = {(new if key == old else key): value for key, value in values.items()}
        if warn:
            warnings.warn(f"config key {section}.{old} is deprecated; use {section}.{new}", DeprecatedKey,
                          stacklevel=3)
    return data


def validate(data: dict[str, Any], warn: bool = True) -> Config:
    """Validate a nested dict into a Config, or raise ConfigError with one line."""
    try:
        return Config.model_validate(numbers_in_e_notation(renamed_keys(data, warn)))
    except ValidationError as err:
        raise ConfigError(describe(err, Config, ALIASES)) from None


def load_config(
    path: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    sets: list[str] | None = None,
    base: dict[str, Any] | None = None,
    has_gpu: Callable[[], bool] = cuda_available,
) -> Config:
    """The resolved config (:func:`load_config_with_source`)."""
    return load_config_with_source(path, overrides, sets, base, has_gpu)[0]


def load_config_with_source(
    path: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    sets: list[str] | None = None,
    base: dict[str, Any] | None = None,
    has_gpu: Callable[[], bool] = cuda_available,
) -> tuple[Config, str]:
    """Build the resolved config: preset or file, then flag overrides (dotted keys), then ``--set`` items; and what
    it started from ("the preset configs/cartpole.yaml", the file, "the defaults"), for `dppo train`'s first line.

    Without ``path`` the preset for the requested env id is used (CartPole-v1 when none is given), so
    ``dppo train --env Pendulum-v1`` gets tuned hyperparameters; with many actors on a GPU machine, the env's GPU
    preset (:func:`choose_preset`; ``has_gpu`` answers whether the learner would see one). ``base``: a resolved
    config (as a dict) to start from instead (a sweep's trials).
    """
    overrides = overrides or {}
    pairs = [(key.split("."), value) for key, value in overrides.items() if value is not None]
    pairs += [parse_override(item) for item in sets or []]
    source = str(path)  # what the note below calls the file the run starts from
    if base is not None:
        data = copy.deepcopy(base)
    elif path is not None:
        data = read_yaml(path)
    else:
        env_id = next((v for k, v in pairs if k == ["env", "id"]), DEFAULT_ENV_ID)
        entry_point = any(k == ["env", "entry_point"] and v for k, v in pairs)
        actors = next((v for k, v in pairs if k == ["run", "actors"]), None)
        device = next((v for k, v in pairs if k == ["run", "device"]), None)
        preset = None if entry_point else choose_preset(env_id, actors if isinstance(actors, int) else None,
                                                        device, has_gpu)
        data = read_yaml(preset) if preset else {}
        source = f"the preset {shown_path(preset)}" if preset else "the defaults"
    designed = copy.deepcopy(data)
    one_batch_rule(data, pairs)
    one_env_name(data, pairs)
    for keys, value in pairs:
        merge(data, keys, value)
    config = validate(data)
    if base is None and pairs:
        note = minibatch_note(designed, config, source)
        if note:
            warnings.warn(note, ConfigNote, stacklevel=3)
    return config, source


BATCH_RULES = ("minibatch_size", "num_minibatches")


def one_batch_rule(data: dict[str, Any], pairs: list[tuple[list[str], Any]]) -> None:
    """A flag or ``--set`` that gives one batch rule (ppo.minibatch_size or ppo.num_minibatches) replaces the
    other rule of the file or preset underneath: the user chose one rule, and has not set both."""
    given = {keys[1] for keys, value in pairs if len(keys) == 2 and keys[0] == "ppo" and keys[1] in BATCH_RULES
             and value is not None}
    ppo = data.get("ppo")
    if len(given) == 1 and isinstance(ppo, dict):
        ppo.pop(next(rule for rule in BATCH_RULES if rule not in given), None)


def one_env_name(data: dict[str, Any], pairs: list[tuple[list[str], Any]]) -> None:
    """A flag or ``--set`` that names the env (env.id or env.entry_point) replaces the other name of the file or
    preset underneath: ``--set env.entry_point=mysim:make`` over a preset's env.id names one env, not two."""
    given = {keys[1] for keys, value in pairs if len(keys) == 2 and keys[0] == "env"
             and keys[1] in ("id", "entry_point") and value is not None}
    env = data.get("env")
    if len(given) == 1 and isinstance(env, dict):
        env.pop("entry_point" if "id" in given else "id", None)


def minibatch_note(designed: dict[str, Any], config: Config, source: str) -> str | None:
    """A fixed ppo.minibatch_size with a batch far from the one its file was designed for (--actors 16 on a preset
    for 2) makes many times the SGD steps per epoch, each on a small share of the batch: one line that says so and
    gives the count that keeps the design. None when the run keeps it (or the file alone is no valid config)."""
    if config.ppo.minibatch_size is None or not config.batch_known:  # many agents: the batch is sized at start
        return None
    try:
        design = validate(designed, warn=False)
    except ConfigError:
        return None
    if config.batch_size == design.batch_size:
        return None
    planned = max(1, design.batch_size // design.minibatch_size)
    now = max(1, config.batch_size // config.minibatch_size)
    if max(now, planned) < FAR * min(now, planned):
        return None
    return (f"ppo.minibatch_size {config.minibatch_size} makes {now} minibatch{'' if now == 1 else 'es'} per epoch "
            f"of this run's batch of "
            f"{config.batch_size} samples, where {source} plans {planned} of its {design.batch_size}; "
            f"--set ppo.num_minibatches={planned} keeps its plan (minibatches of "
            f"{config.batch_size // planned // config.sampling_unit * config.sampling_unit} samples)")
