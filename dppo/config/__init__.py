"""The one typed source of truth for a training run.

YAML goes in, CLI flags and ``--set a.b=c`` overrides go on top, and pydantic validates the result. Every
field carries a docstring; ``dppo train --help`` and the README reference are built from them. Errors are
one line that names the field and the fix (:class:`ConfigError`). One module per group of sections.
"""

from dppo.config.base import ConfigError
from dppo.config.env import DEFAULT_ENV_ID, EnvConfig, WrapperConfig
from dppo.config.load import PRESETS_DIR, ConfigNote, DeprecatedKey, load_config, preset_path, read_yaml, validate
from dppo.config.ppo import ModelConfig, PPOConfig
from dppo.config.root import Config
from dppo.config.run import FaultConfig, MetricsConfig, RunConfig
from dppo.config.selfplay import SelfPlayConfig

__all__ = [
    "DEFAULT_ENV_ID", "PRESETS_DIR", "Config", "ConfigError", "ConfigNote", "DeprecatedKey", "EnvConfig", "FaultConfig",
    "MetricsConfig", "ModelConfig", "PPOConfig", "RunConfig", "SelfPlayConfig", "WrapperConfig", "load_config",
    "preset_path", "read_yaml", "validate",
]
