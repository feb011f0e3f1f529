"""The curves of a long run's readings (:mod:`dppo.bench.chaos_monitor`) as one PNG for docs/benchmarks.md: the
RSS of the run's processes and of Ray's over the training minutes, Ray's object store and the run's /dev/shm,
and the run directories' size beside their checkpoint count; the warm-up's end a dotted line on each."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from dppo.bench.chaos_growth import series, warmup_end_s


def minutes_of(samples: list[dict[str, Any]], t_s: float) -> float:
    """A reading's time as minutes of training (its offset from the first reading that saw training)."""
    origin = next((s["t_s"] - s["training_s"] for s in samples if s.get("training_s") is not None), 0.0)
    return (t_s - origin) / 60.0


RUN_ROLES = ("driver", "actor", "learner", "inference", "evaluation", "job supervisor")


def plot_long_run(samples: list[dict[str, Any]], warmup_s: float, title: str, output: Path) -> Path:
    """Four panels (the run's processes, Ray's processes summed by role and node, object store and /dev/shm, run
    dir and checkpoints), saved to ``output``."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    figure = Figure(figsize=(13, 8.5), layout="constrained")
    (run, ray_own), (store, disk) = figure.subplots(2, 2)
    summed: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    for (role, node, pid), readings in sorted(series(samples).items()):
        if len(readings) < 3:
            continue  # a worker started and gone
        if role in RUN_ROLES:
            run.plot([minutes_of(samples, r[0]) for r in readings], [r[1] for r in readings], linewidth=1.3,
                     label=f"{role} ({node}, pid {pid})")
        else:
            for t_s, rss, *_ in readings:
                summed[f"{role} ({node})"][t_s] += rss
    for label, points in sorted(summed.items(), key=lambda kv: -max(kv[1].values())):
        ray_own.plot([minutes_of(samples, t) for t in points], list(points.values()), linewidth=1.1, label=label)
    run.set(xlabel="minutes of training", ylabel="RSS (MiB)", title="RSS of the run's processes")
    ray_own.set(xlabel="minutes of training", ylabel="RSS (MiB, log)", yscale="log",
                title="RSS of Ray's processes (summed by role and node)")
    for panel, size, columns in ((run, "x-small", 1), (ray_own, "xx-small", 3)):
        if panel.lines:  # a short run's processes may all have fewer than 3 readings: a note, not an empty legend
            panel.legend(fontsize=size, ncol=columns, loc="lower right")
        else:
            panel.text(0.5, 0.5, "no process read 3 times", transform=panel.transAxes, ha="center", color="gray")
    at = [minutes_of(samples, s["t_s"]) for s in samples]
    store.plot(at, [(s.get("object_store") or {}).get("used_mib") for s in samples], label="Ray object store (MiB)")
    store.plot(at, [s["shm"]["mib"] for s in samples], label="the run's /dev/shm (MiB)")
    store.set(xlabel="minutes of training", ylabel="MiB", title="Object store and /dev/shm")
    store.legend(fontsize="small")
    disk.plot(at, [s["run_dir"]["mib"] for s in samples], label="run dir (MiB)")
    disk.plot(at, [s["run_dir"]["other_mib"] for s in samples], label="run dir less checkpoints (MiB)")
    disk.set(xlabel="minutes of training", ylabel="MiB", title="Run directory and checkpoints")
    count = disk.twinx()
    count.step(at, [s["run_dir"]["checkpoints"] for s in samples], where="post", color="gray", linestyle="--",
               label="checkpoints (count)")
    count.set_ylabel("checkpoints")
    count.set_ylim(bottom=0, top=max([s["run_dir"]["checkpoints"] for s in samples] + [1]) + 1)
    lines, labels = disk.get_legend_handles_labels()
    more, more_labels = count.get_legend_handles_labels()
    disk.legend(lines + more, labels + more_labels, fontsize="small", loc="upper left")
    end = warmup_end_s(samples, warmup_s)
    for ax in (run, ray_own, store, disk):
        ax.grid(True, alpha=0.3)
        if end is not None:
            ax.axvline(minutes_of(samples, end), color="gray", linestyle=":", linewidth=1)
    figure.suptitle(title)
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=100)
    return output
