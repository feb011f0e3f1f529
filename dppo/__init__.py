"""dppo: distributed PPO on Ray, from a laptop to a KubeRay cluster.

``dppo.train(...)`` trains and ``dppo.load(run_dir).act(obs)`` acts (docs/python-api.md). ``import dppo`` stays
cheap: torch and Ray load when a run or a policy needs them.
"""

from typing import Any

from dppo.errors import RunFailure, StopRun, UsageError

__version__ = "0.1.0"
__all__ = ["IterationInfo", "RunFailure", "StopRun", "TrainResult", "TrainedPolicy", "UsageError",
           "load", "train"]

_LAZY = {"train": "dppo.api", "load": "dppo.api", "TrainResult": "dppo.api", "IterationInfo": "dppo.run.callbacks",
         "TrainedPolicy": "dppo.run.trained_policy"}


def __getattr__(name: str) -> Any:
    """The API's names, imported on first use (PEP 562)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dppo' has no attribute {name!r}")
