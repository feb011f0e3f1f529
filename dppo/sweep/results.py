"""A finished (or stopped) sweep's outputs in its directory: the table of trials, the best config as a ready
``--config`` file, and one figure with every trial's curve."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from dppo.markdown import table
from dppo.run.curves import plot_runs
from dppo.run.logs import format_return
from dppo.run.run_dir import atomic_write
from dppo.sweep.spec import Sweep, format_params

COLUMNS = ["trial", "state", "final_return", "best_return", "env_steps", "wall_s", "config"]


def trial_rows(sweep_dir: Path, result_grid: Any, metric: str) -> list[dict[str, Any]]:
    """One row per trial, from its own run directory (progress.jsonl) and Tune's record of it."""
    rows = []
    for result in result_grid:
        run_dir = sweep_dir / "trials" / str((result.metrics or {}).get("trial_id", Path(result.path).name))
        progress = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()] \
            if (run_dir / "progress.jsonl").is_file() else []
        values = [r[metric] for r in progress if r.get(metric) is not None]
        rows.append({
            "trial": run_dir.name, "state": "ERROR" if result.error else "TERMINATED",
            "final_return": values[-1] if values else None, "best_return": max(values) if values else None,
            "env_steps": progress[-1]["env_steps"] if progress else 0,
            "wall_s": progress[-1]["wall_s"] if progress else None,
            "config": format_params(result.config or {}),
            "params": dict(result.config or {}), "run_dir": str(run_dir),
            "error": str(result.error).splitlines()[0] if result.error else None,
        })
    return rows


def write_results(sweep: Sweep, sweep_dir: Path, rows: list[dict[str, Any]]) -> Path | None:
    """trials.csv, trials.md, best-config.yaml and trials.png; returns the best config file (None: no trial
    reported the metric)."""
    with open(sweep_dir / "trials.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    atomic_write(sweep_dir / "trials.md", (table([_readable(r) for r in rows], COLUMNS) + "\n").encode())
    runs = [Path(r["run_dir"]) for r in rows if (Path(r["run_dir"]) / "progress.jsonl").is_file()]
    if runs:
        plot_runs(runs, sweep_dir / "trials.png")
    scored = [r for r in rows if r["final_return"] is not None]
    if not scored:
        return None
    best = max(scored, key=lambda r: r["final_return"])
    config = sweep.trial_config(best["params"])
    config.run.run_dir = None
    header = (f"# best trial of sweep {sweep.spec.name!r}: {best['trial']}, final {sweep.spec.metric} "
              f"{format_return(best['final_return'])}\n")
    path = sweep_dir / "best-config.yaml"
    atomic_write(path, (header + config.to_yaml()).encode())
    return path


def _readable(row: dict[str, Any]) -> dict[str, Any]:
    """trials.md's row: returns to the digits of dppo's iteration lines (trials.csv keeps them exact)."""
    return {**row, **{key: format_return(row[key]) for key in ("final_return", "best_return")
                      if row[key] is not None}}
