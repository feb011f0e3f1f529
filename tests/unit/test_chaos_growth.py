"""The long-run readings of `dppo bench chaos` (``--no-faults``): a reading of real processes (RSS, open files,
/dev/shm, the run dir), the roles read off Ray's real command lines, and the growth per hour and verdict computed
from readings of the recorded shape (samples.jsonl)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest

from dppo.bench.chaos_cluster import Cluster
from dppo.bench.chaos_growth import (
    growth_error_pct_per_h,
    growth_pct_per_h,
    process_rows,
    report_text,
    totals_row,
    warmup_end_s,
)
from dppo.bench.chaos_monitor import Monitor, dir_sizes, metrics_port, role_of
from dppo.bench.local_cluster import LocalCluster

SITE = "/work/main/.venv/lib/python3.11/site-packages/ray"
SESSION = "/tmp/dppo-cl-ik21fldk/session_2026-11-28_10-10-10_322906_24070"
# Command lines as a local cluster's processes had them (Ray 2.60), cut short, and the role each is read as.
COMMANDS = {
    "/work/main/.venv/bin/python /work/main/.venv/bin/ray start --head --block --port=33737 --num-cpus=0 "
    "--metrics-export-port=37675 --dashboard-agent-listen-port=45639": "ray start",
    f"{SITE}/core/src/ray/gcs/gcs_server --log_dir={SESSION}/logs --config_list=eyJhdXRvbWF0aWNf": "gcs",
    f"{SITE}/core/src/ray/raylet/raylet --raylet_socket_name={SESSION}/sockets/raylet.3": "raylet",
    f"/work/main/.venv/bin/python -u {SITE}/dashboard/agent.py --node-id=70a711d3 --node-ip-address=192.0.2.2":
        "dashboard agent",
    "ray::DashboardAgent": "dashboard agent", "ray::RuntimeEnvAgent": "runtime env agent",
    f"/work/main/.venv/bin/python -u {SITE}/_private/log_monitor.py --session-dir={SESSION}": "log monitor",
    f"/work/main/.venv/bin/python -u {SITE}/autoscaler/_private/monitor.py --logs-dir={SESSION}/logs":
        "autoscaler monitor",
    "/work/main/.venv/bin/python -m ray.util.client.server --address=192.0.2.2:33737 --mode=proxy":
        "ray.util.client.server",
    "ray-dashboard-MetricsHead-0 (/work/main/.venv/bin/python -B -c \"from multiprocessing.forkserver import main":
        "dashboard module",
    "/work/main/.venv/bin/python -B -c from multiprocessing.forkserver import main; main(25, 27, ['ray'":
        "dashboard forkserver",
    "/work/main/.venv/bin/python -B -c from multiprocessing.resource_tracker import main;main(25)": "resource tracker",
    "ray::JobSupervisor": "job supervisor", "ray::IDLE": "idle worker", "ray::Actor": "actor",
    "ray::Actor.sample": "actor", "ray::Learner": "learner", "ray::InferenceService.__init__": "inference",
    "ray::Evaluator": "evaluation",
    "/bin/sh -c /work/main/.venv/bin/python -m dppo train --config /tmp/c/config.yaml --auto-resume": "job shell",
    "/work/main/.venv/bin/python -m dppo train --config /tmp/c/config.yaml --auto-resume --run-dir /tmp/c/run-1":
        "driver",
}


def test_each_process_of_a_ray_cluster_is_named_by_its_role() -> None:
    assert {command: role_of(command) for command in COMMANDS} == COMMANDS
    assert metrics_port(next(iter(COMMANDS))) == 37675 and metrics_port("ray::Actor") is None


def reading(t_s: float, started_s: float, processes: list[tuple[str, str, int, float, int]], checkpoints: int = 3,
            shm: int = 2) -> dict:
    """One reading as Monitor.read writes it to samples.jsonl."""
    return {"t_s": t_s, "training_s": t_s - started_s if t_s >= started_s else None, "at": "2026-11-28T10:00:00Z",
            "load": 3.5, "processes": [{"node": node, "role": role, "pid": pid, "rss_mib": rss, "fds": fds}
                                       for role, node, pid, rss, fds in processes],
            "shm": {"entries": shm, "mib": 0.5 * shm}, "object_store": {"used_mib": 0.04, "objects": 2.0, "nodes": 3},
            "run_dir": {"mib": 0.4 * checkpoints + t_s / 3600, "checkpoints": checkpoints,
                        "checkpoint_mib": 0.4 * checkpoints, "largest_checkpoint_mib": 0.4,
                        "other_mib": t_s / 3600},
            "ray_logs_mib": 2.0 + t_s / 600, "env_steps": int(t_s * 1000)}


def hour_of_readings(grower_pct_per_h: float) -> list[dict]:
    """An hour of a reading a minute, training from minute 1: a raylet flat after a start-up climb, an actor
    growing by ``grower_pct_per_h`` of its 200 MiB after the warm-up (its private 150 MiB by as many MiB), a worker
    gone after two readings."""
    samples = []
    for minute in range(62):
        t = minute * 60.0
        raylet = 30.0 + min(minute, 4) * 2.0  # climbs during the warm-up, then flat
        actor = 200.0 * (1 + grower_pct_per_h / 100 * max(0.0, t - 360.0) / 3600)
        procs = [("raylet", "worker-1", 11, raylet, 60), ("actor", "worker-1", 12, actor, 40 + minute % 3)]
        if minute in (10, 11):
            procs.append(("idle worker", "worker-2", 13, 90.0, 20))
        samples.append(reading(t, 60.0, procs, checkpoints=min(minute, 4)))
        for process in samples[-1]["processes"]:
            process["shared_mib"] = 50.0  # the actor's private part: its RSS less 50 MiB
    return samples


def test_growth_per_hour_is_the_fitted_slope_after_the_warmup_as_a_share_of_its_first_value() -> None:
    hour = [i * 60.0 for i in range(56)]
    assert growth_pct_per_h(hour, [100 + 5 * t / 3600 for t in hour]) == pytest.approx(5.0, abs=0.01)
    assert growth_pct_per_h(hour, [100 - 10 * t / 3600 for t in hour]) == pytest.approx(-10.0, abs=0.01)
    assert growth_pct_per_h(hour[:2], [100, 200]) is None  # two readings fit nothing
    assert growth_error_pct_per_h(hour, [100 + 5 * t / 3600 for t in hour]) == 0.0  # on its line: no doubt
    noise = np.random.default_rng(1).normal(0, 20, len(hour))
    swings = [100 + 5 * t / 3600 + swing for t, swing in zip(hour, noise, strict=True)]
    fitted, error, truth = growth_pct_per_h(hour, swings), growth_error_pct_per_h(hour, swings), 500 / swings[0]
    assert abs(fitted - truth) <= error and error > 5.0  # 20 MiB swings hide a slope of a few %/h
    samples = hour_of_readings(8.0)
    assert warmup_end_s(samples, 300.0) == 360.0  # training from t=60, five minutes of warm-up
    rows = {row["process"]: row for row in process_rows(samples, 300.0)}
    assert set(rows) == {"raylet", "actor"}  # the worker of two readings has no row
    assert rows["raylet"]["growth (%/h)"] == 0.0 and rows["raylet"]["RSS at warm-up end (MiB)"] == 38.0
    assert rows["actor"]["growth (%/h)"] == pytest.approx(8.0, abs=0.05)
    assert rows["actor"]["private growth (%/h)"] == pytest.approx(8.0 * 200 / 150, abs=0.05)
    del samples[-1]["processes"][0]["shared_mib"]  # a reading without its shared part (older samples.jsonl)
    assert process_rows(samples, 300.0)[1]["private growth (%/h)"] == rows["raylet"]["private growth (%/h)"] == 0.0
    assert rows["actor"]["readings"] == 56 and rows["actor"]["open files max"] == 42


def test_a_process_started_later_is_fitted_after_a_warm_up_of_its_own() -> None:
    """A node brought back at 44:30: its agent climbs for its first four minutes, as at any start, then stays flat.
    Fitted from its first reading the climb reads as growth; from five minutes into its own life, as flat. Its
    start is read from its age at its first reading, or is that reading."""
    samples = hour_of_readings(2.0)
    ages = {minute: (minute - 45) * 60.0 + 30.0 for minute in range(45, 62)}  # first read at 45:00
    for minute, age in ages.items():
        samples[minute]["processes"].append({"node": "worker-2", "role": "dashboard agent", "pid": 14, "fds": 30,
                                             "rss_mib": 130.0 + min(age, 240.0) / 60.0, "shared_mib": 40.0,
                                             "age_s": age})
    row = next(r for r in process_rows(samples, 300.0) if r["pid"] == 14)
    assert row["growth (%/h)"] == 0.0 and row["RSS at warm-up end (MiB)"] == 134.0
    assert row["readings"] == 62 - 50  # from 50:00, the first reading past 44:30 plus five minutes
    for minute in ages:
        del samples[minute]["processes"][-1]["age_s"]  # readings written before ages were: its first reading
    row = next(r for r in process_rows(samples, 300.0) if r["pid"] == 14)
    assert row["growth (%/h)"] == 0.0 and row["readings"] == 62 - 50
    climb = [samples[minute]["processes"][-1]["rss_mib"] for minute in ages]
    assert growth_pct_per_h([m * 60.0 for m in ages], climb) > 5.0  # fitted from its first reading


def test_the_verdict_names_a_growing_process_and_what_was_left() -> None:
    text, figures = report_text(hour_of_readings(8.0), 300.0, keep=3, shm_left=0, statuses=["SUCCEEDED"], minutes=60)
    assert figures["verdict"][0].startswith("PROBLEMS: RSS grows more than 5 %/h: actor on worker-1 (pid 12) "
                                            "+8.0 ± 0.0 %/h (private +10.7 %/h)")
    assert text.splitlines()[0] == figures["verdict"][0] and "| raylet | worker-1 | 11 |" in text
    text, figures = report_text(hour_of_readings(2.0), 300.0, keep=3, shm_left=1, statuses=["SUCCEEDED"], minutes=60)
    assert "1 /dev/shm entries left behind" in figures["verdict"][0] and "RSS" not in figures["verdict"][0]
    text, figures = report_text(hour_of_readings(2.0), 300.0, keep=3, shm_left=0, statuses=["SUCCEEDED"], minutes=60)
    assert figures["verdict"][0].startswith("within the targets") and "actor on worker-1 at +2.00 %/h" in text
    assert figures["verdict"][1].startswith("60 of 60 minutes trained (3,660,000 env steps), 62 readings")
    text, figures = report_text(hour_of_readings(2.0), 300.0, keep=2, shm_left=0, statuses=["TIMEOUT"], minutes=60)
    assert "4 checkpoints at once in one run dir, more than keep_checkpoints 2 + 1" in text
    assert "the run ended TIMEOUT" in text
    total = totals_row(hour_of_readings(2.0), 300.0, 3)
    assert total["run dir less checkpoints growth (MiB/h)"] == pytest.approx(1.0, abs=1e-3)
    assert total["Ray logs growth (MiB/h)"] == pytest.approx(6.0, abs=1e-3) and total["checkpoints max"] == 4


def test_a_reading_of_real_processes(tmp_path: Path) -> None:
    """A 'node' of our own (a Python process holding a /dev/shm segment, with a child) read as the monitor reads a
    `ray start` tree; a run dir with checkpoints beside it."""
    from multiprocessing import shared_memory

    segment = shared_memory.SharedMemory(create=True, size=1 << 20)
    # Popen returns once the child's exec has closed its pipe, which the kernel does before it writes the new
    # command line (until then /proc reads it empty): "ready" once it reads (5 s at most)
    script = ("import subprocess, time\nfrom multiprocessing import shared_memory as s\n"
              f"m = s.SharedMemory({segment.name!r})\nc = subprocess.Popen(['sleep', '60'])\n"
              "for _ in range(500):\n    if open(f'/proc/{c.pid}/cmdline').read():\n        break\n"
              "    time.sleep(0.01)\nprint('ready', flush=True)\ntime.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", script],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        checkpoints = tmp_path / "out" / "run-1" / "checkpoints"
        checkpoints.mkdir(parents=True)
        for i in (10, 20):
            (checkpoints / f"ckpt-{i:08d}.pt").write_bytes(b"x" * 300_000)
        (checkpoints / "best.pt").write_bytes(b"x" * 1000)
        (tmp_path / "out" / "run-1" / "progress.jsonl").write_text(json.dumps({"env_steps": 4096}) + "\n")
        local = LocalCluster({}, root=tmp_path / "ray")
        (tmp_path / "ray").mkdir()
        local.nodes["worker-1"] = holder  # type: ignore[assignment]
        monitor = Monitor(Cluster("", {}, local, str(tmp_path)), tmp_path / "out", tmp_path / "samples.jsonl", 60.0,
                          lambda: 0.0)
        sample = monitor.read()
        roles = {(p["node"], p["role"]) for p in sample["processes"]}
        assert {node for node, _ in roles} == {"worker-1"}  # its child and Python's resource tracker too
        assert {role for _, role in roles} == {Path(sys.executable).name, "sleep", "resource tracker"}
        assert all(p["rss_mib"] >= p["shared_mib"] > 0 and p["fds"] >= 3 for p in sample["processes"])
        assert all(0 <= p["age_s"] < 60 for p in sample["processes"])  # started by this test
        assert sample["shm"] == {"entries": 1, "mib": 1.0} and sample["object_store"] is None
        assert sample["run_dir"]["checkpoints"] == 2 and sample["env_steps"] == 4096
        assert sample["run_dir"]["checkpoint_mib"] == pytest.approx(600_000 / 2**20, abs=1e-3)
        assert json.loads((tmp_path / "samples.jsonl").read_text()) == sample and sample["training_s"] is None
    finally:
        children = psutil.Process(holder.pid).children()
        holder.kill()
        holder.wait()
        for child in children:
            child.kill()
        segment.close()
        with contextlib.suppress(FileNotFoundError):  # the holder's resource tracker may have removed it
            segment.unlink()
    assert dir_sizes([tmp_path / "missing"])["mib"] == 0.0


def test_no_faults_refuses_kinds_in_one_line() -> None:
    done = subprocess.run([sys.executable, "-m", "dppo", "bench", "chaos", "--no-faults", "--kinds", "actor",
                           "--env", "CartPole-v1"], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    assert "--no-faults kills nothing: leave out --kinds, --rate and --every-kind" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_curves_of_a_short_run_name_their_empty_panels_instead_of_an_empty_legend(tmp_path: Path) -> None:
    """Half a minute of readings every 2 s leaves few processes with the 3 readings a curve needs (the chaos half
    minute's report): matplotlib's "No artists with labels" warning twice, before."""
    import warnings

    from dppo.bench.chaos_curves import plot_long_run

    short = [reading(t, 0.0, [("actor", "worker-1", 12 + int(t), 200.0, 40)]) for t in (0.0, 2.0)]
    with warnings.catch_warnings():
        # matplotlib's warnings only: "error" for all would also turn a ResourceWarning of an earlier test's
        # unclosed file, collected in here, into an exception pytest reports as unraisable
        warnings.simplefilter("error", UserWarning)
        png = plot_long_run(short, 0.0, "short", tmp_path / "short.png")
        assert png.read_bytes().startswith(b"\x89PNG")
        plot_long_run(hour_of_readings(2.0), 300.0, "hour", tmp_path / "hour.png")  # curves and legends, as before
