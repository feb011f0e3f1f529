"""TensorBoard event files: how RL people compare runs (CleanRL, Stable-Baselines3 and RLlib write them).

Every scalar of a progress record is written under the same name, grouped as CleanRL does (``charts/``,
``losses/``, ``time/``; a policy's, in a run of several, as ``losses/POLICY/policy_loss``), with env steps as the
x axis; the resolved config goes in as text. A resumed run
purges events past its checkpoint (TensorBoard's ``purge_step``), so its curves continue without
duplicate steps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

LOSSES = {"policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "explained_variance", "grad_norm"}


def tag(key: str) -> str:
    """progress.jsonl key -> TensorBoard tag; a policy's key (``POLICY/key``, a run of several policies) goes to its
    place under its run-wide key's group: ``losses/POLICY/policy_loss``."""
    if key.startswith("info/"):  # the env's own figures (metrics.info_keys): a group of their own
        return key
    name, sep, inner = key.rpartition("/")
    if sep:
        group, _, rest = tag(inner).partition("/")
        return f"{group}/{name}/{rest}"
    if key in LOSSES:
        return f"losses/{key}"
    if key.startswith("eval_"):  # evaluation while training (run.eval_every)
        return f"eval/{key[len('eval_'):]}"
    if key.endswith("_s") or key == "steps_per_s":
        return f"time/{key}"
    return f"charts/{key}"


class TensorBoardLog:
    """Writes ``<run_dir>/tensorboard/``; ``resume_steps`` is the checkpoint's env steps when resuming."""

    def __init__(self, directory: Path, config_yaml: str, resume_steps: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        purge = None if resume_steps is None else resume_steps + 1
        self.writer = SummaryWriter(str(directory), purge_step=purge)
        if resume_steps is None:
            self.writer.add_text("config", f"```yaml\n{config_yaml}```", 0)

    def record(self, record: dict[str, Any]) -> None:
        step = int(record["env_steps"])
        for key, value in record.items():
            if key == "env_steps" or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue  # None (NaN in the record) and non-numbers have no point on a curve
            self.writer.add_scalar(tag(key), value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
