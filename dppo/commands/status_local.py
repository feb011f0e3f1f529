"""``dppo status [RUN_DIR ...]``: local runs, running or ended, one line each (:mod:`dppo.run.run_status` reads
them); with no run dir, every run under ./runs."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from dppo.run.run_status import LocalRun, read_run, runs_under

DEFAULT_ROOT = Path("runs")


def show(run_dirs: list[str], output: str) -> int:
    """Print the runs (a table, or JSON); a path that is not a run directory is bad input (one line, exit 2)."""
    paths = [Path(p) for p in run_dirs] or runs_under(DEFAULT_ROOT)
    runs = [read_run(path) for path in paths]
    if output == "json":
        print(json.dumps([asdict(r) for r in runs], indent=2))
    elif not runs:
        print(f"no dppo runs under ./{DEFAULT_ROOT}; pass a run dir (dppo status RUN_DIR), or -n NAMESPACE for "
              "runs on Kubernetes")
    else:
        print(table(runs))
    return 0


def table(runs: list[LocalRun]) -> str:
    """Aligned columns; ``-`` where the run has not said (a running run's restarts and hangs come with its
    summary); why each run ended (or who runs it) after the columns."""
    header = ["RUN", "STATE", "ENV", "ITER", "ENV STEPS", "RETURN", "FAILURES", "RESTARTS", "HANGS", "CHECKPOINT"]
    rows = [[r.run_dir, r.state, r.env or "-", dash(r.iteration), dash(r.env_steps),
             "-" if r.episode_return_mean is None else f"{r.episode_return_mean:.1f}", dash(r.env_failures),
             dash(r.actor_restarts), dash(r.hangs), r.last_checkpoint or "-"] for r in runs]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]]
    return "\n".join([*lines, "", *(f"{r.run_dir}: {r.why}" for r in runs)])


def dash(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"
