"""Learning curves of run directories, and the figure that draws them (mean return against wall-clock time
and against env steps, one curve per run).

Here rather than in `dppo plot` because the benchmarks draw the same figure for their docs sections.
Reads each run directory's ``progress.jsonl`` (and, when present, ``config.yaml`` for the actor count
and ``summary.json`` for the target return and env id). matplotlib loads only when a figure is drawn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from dppo.errors import UsageError
from dppo.run.run_dir import RunDir

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@dataclass(frozen=True)
class Curve:
    """One run's learning curve: iterations where a mean return exists (some early ones have none)."""

    label: str
    wall_s: list[float]
    env_steps: list[int]
    episode_return_mean: list[float]
    target_return: float | None
    env_id: str | None


def load_curve(run_dir: Path) -> Curve:
    if not run_dir.is_dir():
        raise UsageError(f"run directory {run_dir} does not exist; pass directories made by `dppo train`")
    files = RunDir(run_dir)
    progress = files.progress
    if not progress.is_file():
        raise UsageError(f"{run_dir} has no progress.jsonl; pass a run directory made by `dppo train`")
    records = files.read_progress()
    points = [r for r in records if isinstance(r.get("episode_return_mean"), (int, float))
              and math.isfinite(r["episode_return_mean"])]
    if not points:
        raise UsageError(f"{progress} has no iteration with a finished episode yet; nothing to plot")
    missing = {"wall_s", "env_steps"} - points[0].keys()
    if missing:
        raise UsageError(f"{progress} lacks {', '.join(sorted(missing))}; is this a dppo progress file?")
    summary = files.read_summary() or {}
    target = summary.get("target_return")
    return Curve(
        label=_label(run_dir),
        wall_s=[float(r["wall_s"]) for r in points],
        env_steps=[int(r["env_steps"]) for r in points],
        episode_return_mean=[float(r["episode_return_mean"]) for r in points],
        target_return=float(target) if isinstance(target, (int, float)) else None,
        env_id=summary.get("env") if isinstance(summary.get("env"), str) else None,
    )


def _label(run_dir: Path) -> str:
    """The run's name, with its actor count when config.yaml says it."""
    try:
        config = yaml.safe_load(RunDir(run_dir).config.read_text()) or {}
        actors = config["run"]["actors"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return run_dir.resolve().name
    return f"{run_dir.resolve().name} ({actors} actor{'s' if actors != 1 else ''})"


def plot_runs(run_dirs: list[Path], output: Path | None) -> Figure:
    """Draw the two panels (return vs wall-clock seconds, return vs env steps); save to output if given."""
    if not run_dirs:
        raise UsageError("no run directory given; pass one or more directories made by `dppo train`")
    curves = [load_curve(Path(d)) for d in run_dirs]

    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, 4.2), layout="constrained")
    by_time, by_steps = figure.subplots(1, 2, sharey=True)
    for curve in curves:
        line, = by_time.plot(curve.wall_s, curve.episode_return_mean, label=curve.label, linewidth=1.8)
        by_steps.plot(curve.env_steps, curve.episode_return_mean, label=curve.label, linewidth=1.8,
                      color=line.get_color())
    targets = {c.target_return for c in curves}
    target = targets.pop() if len(targets) == 1 else None
    if target is not None:  # a shared target: a dotted line, kept out of the legend
        for ax in (by_time, by_steps):
            ax.axhline(target, color="gray", linestyle=":", linewidth=1, label="_target_return")
    envs = {c.env_id for c in curves}
    if len(envs) == 1 and None not in envs:
        figure.suptitle(envs.pop())
    by_time.set(xlabel="wall-clock time (s)", ylabel="mean return (last 100 episodes)",
                title="Return against wall-clock time")
    by_steps.set(xlabel="env steps", title="Return against env steps")
    for ax in (by_time, by_steps):
        ax.grid(True, alpha=0.3)
        ax.set_xlim(left=0)
        ax.legend(loc="lower right", fontsize="small")
    if output is not None:
        output = Path(output)
        output.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(output, dpi=120)
    return figure
