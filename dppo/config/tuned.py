"""A tune result kept for the machine it was measured on, so ``run.inference: auto`` follows a measurement.

`dppo tune` writes one file per env under ``~/.cache/dppo/tune`` (``DPPO_TUNE_DIR`` elsewhere), with the machine
it ran on (host name, CPU count, GPUs); a run whose ``run.inference`` is ``auto`` uses the data path that file says
when its machine matches, and says which file it followed. No Ray, no torch here: the driver reads it at start-up.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
from pathlib import Path
from typing import Any


def tune_dir() -> Path:
    return Path(os.environ.get("DPPO_TUNE_DIR") or Path.home() / ".cache" / "dppo" / "tune")


def result_path(env_name: str) -> Path:
    return tune_dir() / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', env_name)}.json"


def this_machine(gpus: list[str] | None = None) -> dict[str, Any]:
    """What a result must have been measured on to be followed here (``gpus``: their names, when known)."""
    if gpus is None:  # NVIDIA's driver lists them (no CUDA call: the driver reads this before torch starts)
        gpus = []
        for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
            with contextlib.suppress(OSError):
                gpus += [row.split(":", 1)[1].strip() for row in info.read_text().splitlines()
                         if row.startswith("Model")]
    return {"host": socket.gethostname(), "cpus": os.cpu_count(), "gpus": sorted(gpus)}


def save(env_name: str, result: dict[str, Any]) -> Path:
    """``result`` (the settings, their speed, the table) as this machine's for ``env_name``; written whole or not at
    all (a temp file renamed)."""
    path = result_path(env_name)
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_suffix(".json.tmp")
    temp.write_text(json.dumps({"env": env_name, "machine": this_machine(), **result}, indent=2) + "\n")
    temp.replace(path)
    return path


def tuned(env_name: str) -> tuple[dict[str, Any], Path] | None:
    """This machine's result for ``env_name`` and its file, if there is one (another machine's, or a file that
    cannot be read, is none)."""
    path = result_path(env_name)
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(result, dict) or result.get("machine") != this_machine():
        return None
    return result, path


def auto_inference(env_name: str, num_envs: int) -> tuple[str, str]:
    """What ``run.inference: auto`` becomes for ``env_name`` with ``num_envs`` envs per actor, and why (a line's
    end): the measured data path of this machine's tune result, else the actors (no measurement found them slower
    than the service everywhere: issue 42)."""
    found = tuned(env_name)
    if found is None:
        return "actor", f"auto: no `dppo tune` result for {env_name} on this machine"
    result, path = found
    mode = result.get("settings", {}).get("run.inference", "actor")
    if mode == "server" and num_envs > 1 and num_envs % 2:
        return "actor", f"auto: {path} measured the service, which needs an even env.num_envs (not {num_envs})"
    return mode, f"auto: as `dppo tune` measured on this machine ({path}, {result.get('at', 'undated')})"
