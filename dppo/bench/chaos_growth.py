"""What the per-minute readings of :mod:`dppo.bench.chaos_monitor` say about a long run: each process's RSS growth
per hour after a warm-up (a least-squares line through its readings after the warm-up, as % of its first reading
there; a process started later, such as a node's brought back by the chaos, gets a warm-up of its own), the most
open files, Ray's object store, /dev/shm, and the run directories against their checkpoint count; and the verdict
against issue 56's targets. Pure (readings in, rows and words out), so it is tested on recorded readings without
Ray.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from dppo.markdown import table

RSS_LIMIT_PCT_PER_H = 5.0  # no process's RSS grows more than this after the warm-up
MIN_FIT_SAMPLES = 3  # a line through fewer readings says nothing


def warmup_end_s(samples: list[dict[str, Any]], warmup_s: float) -> float | None:
    """The monitor's time (``t_s``) at which the warm-up ends: ``warmup_s`` after training began (the first
    reading that saw it, less its ``training_s``); None when no reading saw training."""
    for sample in samples:
        if sample.get("training_s") is not None:
            return sample["t_s"] - sample["training_s"] + warmup_s
    return None


def growth_pct_per_h(times_s: list[float], values: list[float]) -> float | None:
    """The slope of the least-squares line through (time, value), per hour, as % of the first value; None with
    fewer than MIN_FIT_SAMPLES readings, a zero first value or no time between them."""
    if len(values) < MIN_FIT_SAMPLES or not values[0] or times_s[-1] <= times_s[0]:
        return None
    slope = float(np.polyfit(np.asarray(times_s, float), np.asarray(values, float), 1)[0])
    return round(slope * 3600.0 / values[0] * 100.0, 2)


Reading = tuple[float, float, int, float | None]  # t_s, RSS MiB, open files, private MiB (None: not read)


def growth_error_pct_per_h(times_s: list[float], values: list[float]) -> float | None:
    """Two standard errors of :func:`growth_pct_per_h`'s slope (about 95 % of lines through such readings fall
    within it): a process whose RSS swings (a raylet moving objects) fits a slope its swings alone can make."""
    if len(values) <= MIN_FIT_SAMPLES or not values[0]:
        return None
    t, v = np.asarray(times_s, float), np.asarray(values, float)
    spread = float(((t - t.mean()) ** 2).sum())
    if spread <= 0:
        return None
    slope, intercept = np.polyfit(t, v, 1)
    residual = float(((v - (slope * t + intercept)) ** 2).sum()) / (len(v) - 2)
    return round(2.0 * (residual / spread) ** 0.5 * 3600.0 / values[0] * 100.0, 2)


def series(samples: list[dict[str, Any]]) -> dict[tuple[str, str, int], list[Reading]]:
    """Per process (role, node, pid): its readings in time order. Private: RSS less its shared pages (libraries,
    files, Ray's object store), the memory only the process holds (its heap)."""
    found: dict[tuple[str, str, int], list[Reading]] = defaultdict(list)
    for sample in samples:
        for p in sample["processes"]:
            private = p["rss_mib"] - p["shared_mib"] if "shared_mib" in p else None
            found[(p["role"], p["node"], p["pid"])].append((sample["t_s"], p["rss_mib"], p["fds"], private))
    return found


def starts_s(samples: list[dict[str, Any]]) -> dict[tuple[str, str, int], float]:
    """When each process (role, node, pid) started, on the readings' clock: its first reading less its age there
    (readings written without ``age_s``: its first reading)."""
    started: dict[tuple[str, str, int], float] = {}
    for sample in samples:
        for p in sample["processes"]:
            started.setdefault((p["role"], p["node"], p["pid"]), sample["t_s"] - p.get("age_s", 0.0))
    return started


def process_rows(samples: list[dict[str, Any]], warmup_s: float) -> list[dict[str, Any]]:
    """One row per process seen in at least MIN_FIT_SAMPLES readings after its warm-up, by role and node: RSS at
    the warm-up's end and at the last reading, growth %/h after the warm-up (of RSS and of its private part), the
    most open files. The warm-up ends ``warmup_s`` into training, or into the process's own life when it started
    later: a node's agents brought back by the chaos climb for minutes after their start, as every process does
    after the run's."""
    end = warmup_end_s(samples, warmup_s)
    started = starts_s(samples)
    rows = []
    for (role, node, pid), readings in series(samples).items():
        start = None if end is None else max(end, started[(role, node, pid)] + warmup_s)
        after = [r for r in readings if start is not None and r[0] >= start]
        if len(after) < MIN_FIT_SAMPLES:
            continue
        rows.append({"process": role, "node": node, "pid": pid, "readings": len(after),
                     "RSS at warm-up end (MiB)": after[0][1], "RSS at end (MiB)": after[-1][1],
                     "growth (%/h)": growth_pct_per_h([r[0] for r in after], [r[1] for r in after]),
                     "± (%/h)": growth_error_pct_per_h([r[0] for r in after], [r[1] for r in after]),
                     "private growth (%/h)": growth_pct_per_h([r[0] for r in after if r[3] is not None],
                                                              [r[3] for r in after if r[3] is not None]),
                     "open files max": max(r[2] for r in readings)})
    return sorted(rows, key=lambda r: (r["node"], r["process"], r["pid"]))


def after_warmup(samples: list[dict[str, Any]], warmup_s: float) -> list[dict[str, Any]]:
    end = warmup_end_s(samples, warmup_s)
    return [s for s in samples if end is not None and s["t_s"] >= end]


def totals_row(samples: list[dict[str, Any]], warmup_s: float, keep: int) -> dict[str, Any]:
    """The run as a whole: minutes trained, readings, object store, /dev/shm, run dirs against checkpoints."""
    after = after_warmup(samples, warmup_s)
    stores = [s["object_store"]["used_mib"] for s in samples if s.get("object_store")]
    store_after = [(s["t_s"], s["object_store"]["used_mib"]) for s in after if s.get("object_store")]
    dirs = [s["run_dir"] for s in samples]
    other = [(s["t_s"], s["run_dir"]["other_mib"]) for s in after]
    logs = [(s["t_s"], s["ray_logs_mib"]) for s in after if s.get("ray_logs_mib") is not None]
    trained = [s["training_s"] for s in samples if s.get("training_s") is not None]
    return {
        "minutes trained": round(max(trained) / 60, 1) if trained else 0.0, "readings": len(samples),
        "readings after warm-up": len(after),
        "object store max (MiB)": round(max(stores), 1) if stores else None,
        "object store growth (MiB/h)": mib_per_h(store_after),
        "/dev/shm entries max": max((s["shm"]["entries"] for s in samples), default=0),
        "/dev/shm max (MiB)": round(max((s["shm"]["mib"] for s in samples), default=0.0), 1),
        "checkpoints max": max((most_in_one_run(d) for d in dirs), default=0), "keep_checkpoints": keep,
        "largest checkpoint (MiB)": round(max((d["largest_checkpoint_mib"] for d in dirs), default=0.0), 2),
        "run dir at end (MiB)": round(dirs[-1]["mib"], 2) if dirs else None,
        "run dir max (MiB)": round(max((d["mib"] for d in dirs), default=0.0), 2),
        "run dir less checkpoints growth (MiB/h)": mib_per_h(other),
        "Ray logs growth (MiB/h)": mib_per_h(logs),
        "env steps": next((s["env_steps"] for s in reversed(samples) if s.get("env_steps") is not None), None),
        "load average": round(float(np.mean([s["load"] for s in samples])), 2) if samples else None,
    }


def most_in_one_run(run_dirs: dict[str, Any]) -> int:
    """The most checkpoints one run dir held at a reading (each run's own keep_checkpoints bounds it; a reading
    older than the per-run count has the sum, of its one run)."""
    return max(run_dirs.get("checkpoints_per_run", {}).values(), default=run_dirs["checkpoints"])


def mib_per_h(points: list[tuple[float, float]]) -> float | None:
    """The slope of the least-squares line through (t_s, MiB), in MiB per hour."""
    if len(points) < MIN_FIT_SAMPLES or points[-1][0] <= points[0][0]:
        return None
    slope = float(np.polyfit([p[0] for p in points], [p[1] for p in points], 1)[0])
    return round(slope * 3600.0, 3)


def checkpoint_bound_ok(total: dict[str, Any]) -> bool:
    """Each run dir is bounded by its checkpoints: never more than keep_checkpoints + 1 in one at a reading (the
    newest is written before the oldest goes); what is not a checkpoint is reported as MiB/h."""
    return total["checkpoints max"] <= total["keep_checkpoints"] + 1


def private_words(row: dict[str, Any]) -> str:
    """What of a process's growth is its own memory (its private part's growth), when it was read."""
    private = row.get("private growth (%/h)")
    return "" if private is None else f" (private {private:+.1f} %/h)"


def error_words(row: dict[str, Any]) -> str:
    error = row.get("± (%/h)")
    return "" if error is None else f" ± {error:.1f}"


def growing(row: dict[str, Any]) -> bool:
    """Growth beyond the target by more than its own error bar (the ±, two standard errors): a slope the swings
    alone could make is not flagged."""
    growth, error = row["growth (%/h)"], row.get("± (%/h)") or 0.0
    return growth is not None and growth - error > RSS_LIMIT_PCT_PER_H


def problems(procs: list[dict[str, Any]], total: dict[str, Any], shm_left: int,
             statuses: list[str]) -> list[str]:
    """What the readings find wrong against the targets: RSS growth per process (beyond its error bar), /dev/shm
    left, a run dir over its checkpoints, a run that did not succeed (each run by its number)."""
    found = []
    if grown := [r for r in procs if growing(r)]:
        found.append("RSS grows more than 5 %/h: " + ", ".join(
            f"{r['process']} on {r['node']} (pid {r['pid']}) {r['growth (%/h)']:+.1f}{error_words(r)} %/h"
            f"{private_words(r)}" for r in grown))
    if shm_left:
        found.append(f"{shm_left} /dev/shm entries left behind")
    if not checkpoint_bound_ok(total):
        found.append(f"{total['checkpoints max']} checkpoints at once in one run dir, more than keep_checkpoints "
                     f"{total['keep_checkpoints']} + 1")
    many = len(statuses) > 1
    found += [f"run {i} ended {status}" if many else f"the run ended {status}"
              for i, status in enumerate(statuses, start=1) if status != "SUCCEEDED"]
    return found


def verdict(procs: list[dict[str, Any]], total: dict[str, Any], shm_left: int, statuses: list[str],
            minutes: float) -> list[str]:
    """The long run's verdict against the targets, in words (the problems, or within the targets), then what was
    read."""
    found = problems(procs, total, shm_left, statuses)
    if not procs:
        found.append("no process was read long enough after the warm-up to fit its growth")
    fitted = [r for r in procs if r["growth (%/h)"] is not None]
    worst = max(fitted, key=lambda r: r["growth (%/h)"], default=None)
    worst_words = (f"the fastest-growing process {worst['process']} on {worst['node']} at {worst['growth (%/h)']:+.2f}"
                   " %/h" if worst else "no growth fitted")
    first = ("PROBLEMS: " + "; ".join(found) if found else
             f"within the targets: no process's RSS grows more than {RSS_LIMIT_PCT_PER_H:g} %/h beyond its error bar "
             f"after the warm-up ({worst_words}), nothing left in /dev/shm, at most {total['checkpoints max']} "
             f"checkpoints in a run dir (keep_checkpoints {total['keep_checkpoints']})")
    second = (f"{total['minutes trained']:g} of {minutes:g} minutes trained ({total['env steps'] or 0:,} env steps), "
              f"{total['readings']} readings ({total['readings after warm-up']} after the warm-up), "
              f"{len(procs)} processes fitted; {worst_words}")
    return [first, second]


LEGEND = """\
- **growth (%/h)**: the slope of a least-squares line through the process's RSS readings after the warm-up, per
  hour, as % of its first reading after it (the target: at most 5 %/h); a process started later (a node brought
  back, a replaced actor) is fitted after the same warm-up of its own life; **readings**: the readings it was fitted
  on (one a `--sample-s`); a process with fewer than 3 (a worker started and gone) has no row; **±**: two
  standard errors of that slope (a process whose RSS swings, as a raylet moving large objects does, fits slopes
  its swings alone can make: the growth is told from them only beyond this); **private growth
  (%/h)**: the same of its RSS less its shared pages (libraries, files, Ray's object store), the memory only it
  holds: where a process leaks, this grows. Processes are
  named by role: Ray's own (gcs, raylet, agents, dashboard, job supervisor, idle workers) and the run's (driver,
  actor, learner, inference, evaluation), each on its node (`head`, `worker-N`). RSS counts the pages of Ray's
  object store a process has touched (a raylet's grows as the store fills); samples.jsonl keeps each reading's
  shared part (`shared_mib`) beside it.
- **object store**: Ray's `ray_object_store_memory` gauge summed over the nodes' metrics ports (bytes of objects
  in shared memory, spilled and fallback); **/dev/shm**: the entries the run's processes had mapped or open (Ray's
  object store itself maps an unlinked file: not counted); **left at end**: those still there after the run
  ended.
- **checkpoints max**: the most `ckpt-*.pt` files at one reading (the newest is written before the oldest is
  pruned: keep_checkpoints + 1 at most); **run dir less checkpoints growth**: progress.jsonl and train.log,
  which grow with the iterations by design; **Ray logs growth**: the cluster's session directory (its logs)."""


def readings(samples: list[dict[str, Any]], warmup_s: float, keep: int, shm_left: int, statuses: list[str]
             ) -> tuple[list[dict[str, Any]], dict[str, Any], list[str]]:
    """The readings' process rows, their totals and what they find wrong (:func:`problems`)."""
    procs = process_rows(samples, warmup_s)
    total = totals_row(samples, warmup_s, keep) | {"/dev/shm left at end": shm_left}
    return procs, total, problems(procs, total, shm_left, statuses)


def tables_text(procs: list[dict[str, Any]], total: dict[str, Any]) -> str:
    """The readings' tables and their legend (no verdict: the report it is part of has one)."""
    return "\n\n".join([table(procs, list(procs[0]) if procs else ["process"]), table([total], list(total)), LEGEND])


def report_text(samples: list[dict[str, Any]], warmup_s: float, keep: int, shm_left: int, statuses: list[str],
                minutes: float) -> tuple[str, dict[str, Any]]:
    """The long-run report (verdict, processes, totals, legend) and its figures as a dict for results.json."""
    procs, total, _ = readings(samples, warmup_s, keep, shm_left, statuses)
    words = verdict(procs, total, shm_left, statuses, minutes)
    text = "\n\n".join(["\n".join(words), tables_text(procs, total)])
    return text, {"verdict": words, "processes": procs, "totals": total, "warmup_s": warmup_s}
