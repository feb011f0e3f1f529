"""Sweeps on a real Ray with Ray Tune: population-based training continues exploited trials with the perturbed
hyperparameters in effect (and the sweep serves every trial's metrics), a failing trial is reported while the
others finish, a stopped sweep resumes keeping its finished trials, and a bad sweep file is one line with nothing
written."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from runs import progress_records
from session_ray import CPU_TOKENS

from dppo.distributed.ports import free_ports

SMALL = {"run.total_steps": 8192, "run.actors": 1, "run.actor_cpus": 0.5, "run.tensorboard": False}
PBT_ITERATIONS = 5  # of 1 actor x 8 envs x 64 steps (CartPole preset)


def sweep_file(tmp_path: Path, **spec: object) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"base": {"env": "CartPole-v1"}, "set": SMALL, "trials": 2, "concurrent": 2,
                                    "driver_cpus": 0.25, **spec}))
    return path


def dppo_sweep(path: Path, out: Path, *extra: str, address: str | None = None) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "dppo", "sweep", "--config", str(path), "--out-dir", str(out), *extra]
    return subprocess.run(argv + (["--address", address] if address else []), capture_output=True, text=True,
                          timeout=600)


def scrape_until_exit(proc: subprocess.Popen, port: int, timeout: float = 600) -> list[dict[tuple, float]]:
    """Every scrape of the sweep's metrics endpoint while the process runs (bounded in time and count)."""
    samples, deadline = [], time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline and len(samples) < 2000:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
                text = resp.read().decode()
            samples.append({(s.name, tuple(sorted(s.labels.items()))): s.value
                            for family in text_string_to_metric_families(text) for s in family.samples})
        except OSError:
            pass
        time.sleep(0.3)
    return samples


def assert_quiet_and_rounded(done: subprocess.CompletedProcess, out: Path) -> None:
    """No Tune banner or Tune TensorBoard hint; the summary names the sweep once; returns and searched values
    rounded in the log and in trials.md (returns like the iteration lines, floats to 4 significant digits)."""
    output = done.stdout + done.stderr
    for tune_says in ("Configuration for experiment", "View detailed results", "To visualize your results",
                      "driver_artifacts", "Traceback (most recent call last)", "Trials did not complete",
                      "Consider boosting PBT performance"):
        assert tune_says not in output, output[-3000:]
    assert "sweep 'sweep': 2 trials, " in done.stdout
    values = re.findall(r"return (-?[\d.]+)", done.stderr) + re.findall(r"=(-?\d+\.\d+)", output)
    table = (out / "trials.md").read_text()
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        values += [c for c in cells[2:4] if c != "-"] + re.findall(r"=(-?\d+\.\d+)", cells[6])
    assert values, done.stderr[-3000:]
    for value in values:  # 25.82 or 0.002157, never 25.82191780821918 or 0.002157135141933016
        assert len(value.lstrip("-0.").replace(".", "")) <= 4, (value, table)


def test_pbt_continues_exploited_trials_with_the_perturbed_hyperparameters(ray_address: str, tmp_path: Path) -> None:
    """Also the sweep's metrics: every trial's learner metrics on the sweep driver's port, labelled trial.
    Synchronous PBT: the two trials meet at iterations 2 and 4 whatever the machine's load, so the worse one
    exploits the better at least once (async PBT exploits by when trials report: beside another test, a run of 16
    iterations once had none); 5 iterations, so the last is not a perturbation (each one restarts both trials)."""
    (port,) = free_ports(1)
    path = sweep_file(tmp_path, space={"ppo.learning_rate": "loguniform(1e-4, 1e-2)"},
                      scheduler={"name": "pbt", "perturbation_interval": 2, "quantile": 0.5, "synch": True},
                      metrics={"port": port, "host": "127.0.0.1", "linger_s": 5},
                      set={**SMALL, "run.total_steps": PBT_ITERATIONS * 512})
    argv = [sys.executable, "-m", "dppo", "sweep", "--config", str(path), "--out-dir", str(tmp_path / "out"),
            "--address", ray_address]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    scrapes = scrape_until_exit(proc, port)
    stdout, stderr = proc.communicate(timeout=60)
    done = subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "iter=" not in done.stdout + done.stderr  # the trials' iteration lines are in their train.log only
    assert_quiet_and_rounded(done, tmp_path / "out")
    assert "at a time" not in done.stderr  # the cluster holds both trials (0.75 CPUs each): nothing to say
    trials = {p.name for p in (tmp_path / "out" / "trials").iterdir()}
    assert scrapes, "the sweep served no metrics"
    final = scrapes[-1]  # during the linger, after both trials finished
    for trial in trials:
        assert final[("dppo_iteration", (("trial", trial),))] == PBT_ITERATIONS
        # the steps the trial sampled itself (not the total when an exploit moved it to another point of training)
        assert final[("dppo_env_steps_total", (("trial", trial),))] > 0
        assert ("dppo_learning_rate", (("trial", trial),)) in final
    assert final[("dppo_sweep_trials", (("state", "TERMINATED"),))] == 2
    assert max(s.get(("dppo_sweep_trials", (("state", "RUNNING"),)), 0) for s in scrapes) >= 1
    assert {dict(labels).get("trial") for s in scrapes for (name, labels) in s if name == "dppo_iteration"} == trials
    iterations = PBT_ITERATIONS
    changed = False
    for run_dir in (tmp_path / "out" / "trials").iterdir():
        own = [r for r in progress_records(run_dir) if r["trial"] == run_dir.name]  # (a restored line is its source's)
        assert own and own[-1]["env_steps"] == PBT_ITERATIONS * 512
        for r in own:  # the rate in effect is the trial's current value, annealed: never the source's
            expected = r["hp/ppo.learning_rate"] * (1 - (r["iteration"] - 1) / iterations)
            assert r["learning_rate"] == pytest.approx(expected, rel=1e-9), (run_dir.name, r["iteration"])
        changed |= len({r["hp/ppo.learning_rate"] for r in own}) > 1
    assert changed, "no trial exploited another and continued with perturbed values"
    table = (tmp_path / "out" / "trials.md").read_text()
    assert (table.count("TERMINATED") == 2 and "restored from a checkpoint" in done.stderr) or "started" in done.stderr
    best = yaml.safe_load((tmp_path / "out" / "best-config.yaml").read_text())
    assert best["env"]["id"] == "CartPole-v1" and best["run"]["run_dir"] is None
    assert (tmp_path / "out" / "trials.png").stat().st_size > 10_000


def test_a_failing_trial_is_reported_and_a_resumed_sweep_keeps_finished_trials(ray_address: str,
                                                                                tmp_path: Path) -> None:
    """Also: a trial of more than half the session cluster's CPUs runs one at a time, and the sweep says so at the
    start;
    dppo's TensorBoard hint points at the trials' own curves."""
    path = sweep_file(tmp_path, base={"env": "dppo/Faulty-v0"},
                      set={**SMALL, "run.actor_cpus": CPU_TOKENS / 2, "run.tensorboard": True, "faults.env_retries": 0,
                           "env.kwargs.persistent": True},
                      space={"env.kwargs.fail_at": "grid([null, 300])"}, trials=1)
    out = tmp_path / "out"
    done = dppo_sweep(path, out, address=ray_address)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "1 failed" in done.stdout
    (failed,) = [line for line in done.stderr.splitlines() if "failed; the other trials go on" in line]
    assert "injected env failure at step 300" in failed  # the error in one line, its traceback in Tune's file
    assert "injected env failure" in Path(failed.rsplit("(traceback in ", 1)[1].rstrip(")")).read_text()
    assert done.stderr.splitlines()[0] == (
        f"sweep 'sweep': 1 trial at a time, not 2 (concurrent: 2): one trial needs {CPU_TOKENS / 2 + 0.25:g} Ray CPUs "
        f"(driver_cpus 0.25 + 1 actor x run.actor_cpus {CPU_TOKENS / 2:g}) and the cluster has {CPU_TOKENS} (more "
        "start if it autoscales); for more at once lower "
        "run.actors, run.actor_cpus or driver_cpus, or add nodes")
    assert f"tensorboard --logdir {out / 'trials'}\n" in done.stderr
    assert_quiet_and_rounded(done, out)
    rows = {r["state"]: r for r in __import__("csv").DictReader((out / "trials.csv").open())}
    assert set(rows) == {"ERROR", "TERMINATED"} and int(rows["TERMINATED"]["env_steps"]) == 8192
    assert any((out / "trials" / rows["TERMINATED"]["trial"] / "tensorboard").glob("events.out.tfevents.*"))
    finished = Path(out / "trials" / rows["TERMINATED"]["trial"] / "progress.jsonl")
    before = finished.read_text()
    resumed = dppo_sweep(path, out, "--resume", address=ray_address)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert finished.read_text() == before  # the finished trial was kept, not run again
    assert "TERMINATED" in (out / "trials.md").read_text()


@pytest.mark.parametrize("spec, words", [
    ({"space": {"ppo.learnin_rate": "loguniform(1e-4, 1e-3)"}}, "sweep space ppo.learnin_rate: 0.0001 does not fit"),
    ({"space": {"ppo.epochs": "loguniform(1e-4, 1e-3)"}}, "sweep space ppo.epochs: 0.0001 does not fit the config"),
    ({"space": {"ppo.learning_rate": "lognormal(1, 2)"}}, "is not one of loguniform(a, b)"),
    ({"space": {"ppo.learning_rate": "loguniform(1e-3, 1e-4)"}}, "has the wrong arguments"),
    ({"space": {"ppo.gamma": "choice([0.9])"}, "scheduler": {"name": "hyperband"}}, "scheduler.name"),
    ({"space": {"ppo.gamma": "choice([0.9])"}, "scheduler": {"name": "pbt", "quantile": 0.9}}, "scheduler.quantile"),
    ({"space": {"run.seed": "grid([1, 2])"}, "scheduler": {"name": "pbt"}}, "scheduler pbt needs a space key"),
])
def test_a_bad_sweep_file_is_one_line_and_nothing_is_written(spec: dict, words: str, tmp_path: Path) -> None:
    done = dppo_sweep(sweep_file(tmp_path, **spec), tmp_path / "out")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and words in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


def test_a_bad_metrics_port_is_one_line_and_nothing_is_written(tmp_path: Path) -> None:
    path = sweep_file(tmp_path, space={"ppo.gamma": "choice([0.9])"})
    done = dppo_sweep(path, tmp_path / "out", "--metrics-port", "70000")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "metrics.port" in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()
