"""`dppo bench chaos` says one verdict, true, first (dppo/bench/chaos_report.py, chaos_readout.py, chaos_growth.py):
checkpoints and statuses counted per run, not summed or joined over the runs; a recovery timed inside the run the
kill hit, not to the next run's start-up; the return compared in its own units, so it reads right for negative
returns and zero-sum games; the readings' findings among the chaos's problems, not a second verdict after it."""

from __future__ import annotations

from pathlib import Path

from dppo.bench.chaos_growth import problems, readings, tables_text
from dppo.bench.chaos_monitor import dir_sizes
from dppo.bench.chaos_readout import kill_rows, report_text, verdict
from dppo.bench.chaos_report import RunLog, recovery_rows, run_row

E_T = 8 * 64  # env steps per segment
VERDICT_STARTS = ("nothing lost", "PROBLEMS", "within the targets")


def record(iteration: int, segments: int = 2) -> dict[str, object]:
    return {"iteration": iteration, "segments": segments, "env_steps_delta": segments * E_T,
            "env_steps": iteration * 2 * E_T}


def finished_run(index: int, start: float, final_return: float = 470.0) -> RunLog:
    """A run of three full rounds seen from ``start`` on, ended SUCCEEDED."""
    seen = [(start + i, 0, record(i)) for i in (1, 2, 3)]
    return RunLog(index, seen=seen, final=[r for _, _, r in seen], statuses=["SUCCEEDED"],
                  summary={"env_steps": 6 * E_T, "segments_dropped": 0, "episode_return_mean": final_return})


def reading(t_s: float, run_root: Path) -> dict[str, object]:
    """A monitor's reading of the recorded shape, its run dirs read off real directories."""
    return {"t_s": t_s, "training_s": t_s, "load": 1.0, "processes": [], "shm": {"entries": 0, "mib": 0.0},
            "run_dir": dir_sizes(sorted(run_root.glob("run-*"))), "object_store": None, "ray_logs_mib": None}


def test_five_runs_at_their_checkpoint_bound_are_no_problem_and_one_over_it_is(tmp_path: Path) -> None:
    for run in range(1, 6):
        checkpoints = tmp_path / f"run-{run}" / "checkpoints"
        checkpoints.mkdir(parents=True)
        for i in range(4):  # keep_checkpoints 3 + 1: the newest written before the oldest goes
            (checkpoints / f"ckpt-{i:08d}.pt").write_bytes(b"x")
    statuses = ["SUCCEEDED"] * 5
    _, total, found = readings([reading(0.0, tmp_path)], 0.0, 3, 0, statuses)
    assert total["checkpoints max"] == 4 and found == []  # 20 at once over five runs: each within its bound
    (tmp_path / "run-2" / "checkpoints" / "ckpt-00000009.pt").write_bytes(b"x")
    _, total, found = readings([reading(0.0, tmp_path)], 0.0, 3, 0, statuses)
    assert found == ["5 checkpoints at once in one run dir, more than keep_checkpoints 3 + 1"]


def test_each_run_is_held_to_its_own_status() -> None:
    total = {"checkpoints max": 1, "keep_checkpoints": 3}
    assert problems([], total, 0, ["SUCCEEDED"] * 5) == []  # not "the run ended SUCCEEDED,SUCCEEDED,..."
    assert problems([], total, 0, ["SUCCEEDED", "FAILED", "SUCCEEDED"]) == ["run 2 ended FAILED"]


def test_a_kill_in_one_run_is_not_recovered_by_the_next_runs_start_up() -> None:
    """Run 4's actor killed at t=10 as it ended; run 5's first full round at t=23.4 is its start-up, no
    recovery; a kill in run 5 is timed to run 5's next full round (the first more than SETTLE_S after it)."""
    run4 = RunLog(4, seen=[(8.0, 0, record(1))], final=[record(1)], statuses=["SUCCEEDED"])
    run5 = finished_run(5, 22.4)  # full rounds at 23.4, 24.4, 25.4
    kills = [{"kind": "actor", "at": 10.0, "victim": 7, "run": 4}, {"kind": "actor", "at": 21.0, "victim": 8,
                                                                    "run": 5}]
    (row,) = recovery_rows(kills, [run4, run5], 2, ["actor"])
    assert row == {"kind": "actor", "kills": 2, "recovered": 1, "recover_median_s": 2.4, "recover_worst_s": 2.4,
                   "finished": 1}  # run 4 finished (SUCCEEDED) with no round after its kill: nothing to recover


def test_a_kill_as_its_run_finished_is_no_problem_and_one_in_a_run_that_failed_is() -> None:
    """An actor killed in the last seconds of a run that then SUCCEEDED has no full round after it: the report says
    its run ended first, and the verdict stays "nothing lost"; the same kill in a run whose last job FAILED is a
    kill never recovered from."""
    kills = [{"kind": "actor", "at": 10.0, "victim": 7, "run": 1}]
    for status, first in (("SUCCEEDED", "nothing lost"), ("FAILED", "PROBLEMS")):
        run = RunLog(1, seen=[(8.0, 0, record(1))], final=[record(1)], statuses=[status],
                     summary={"env_steps": 2 * E_T, "segments_dropped": 0, "episode_return_mean": 470.0})
        row, accounts = run_row([run], kills, E_T, 2, 470.0, {"shm": [], "processes": []})
        words = kill_rows(recovery_rows(kills, [run], 2, ["actor"]), [])
        assert words[0]["run ended first"] == (status == "SUCCEEDED") and words[0]["recovered"] == 0
        said = verdict(row, accounts, words, [])[0]
        assert said.startswith(first) and ("1 kills never recovered from" in said) == (status == "FAILED"), said


def test_the_return_is_compared_in_its_own_units() -> None:
    """simple_spread (negative returns): -20.9 against -20.1 is worse; tic-tac-toe (zero-sum): a draw (0) against a
    baseline of -0.06 is better. A ratio said 1.04 and nothing."""
    for final, baseline, said in ((-20.9, -20.1, "return -0.8 against the run without chaos (-20.9 vs -20.1)"),
                                  (0.0, -0.06, "return +0.06 against the run without chaos (0 vs -0.06)")):
        run = finished_run(1, 0.0, final)
        row, accounts = run_row([run], [], E_T, 2, baseline, {"shm": [], "processes": []})
        assert row["return_change"] == round(final - baseline, 3)
        assert verdict(row, accounts, [], [])[0].endswith(said)


def test_the_report_has_one_verdict_first_with_the_readings_findings_in_it() -> None:
    runs = [finished_run(i, 10.0 * i) for i in range(1, 6)]
    row, accounts = run_row(runs, [], E_T, 2, 470.0, {"shm": [], "processes": []})
    grown = {"process": "raylet", "node": "head", "pid": 11, "readings": 9, "RSS at warm-up end (MiB)": 40.0,
             "RSS at end (MiB)": 50.0, "growth (%/h)": 30.0, "± (%/h)": 2.0, "private growth (%/h)": None,
             "open files max": 40}
    total = {"checkpoints max": 4, "keep_checkpoints": 3}
    found = problems([grown], total, 0, [str(a["status"]) for a in accounts])
    words = kill_rows(recovery_rows([], runs, 2, ["actor"]), [])
    text = report_text(row, accounts, words, [], found) + "\n\n" + tables_text([grown], total)
    first, *rest = text.splitlines()
    assert first.startswith("PROBLEMS: RSS grows more than 5 %/h: raylet on head (pid 11) +30.0 ± 2.0 %/h"), first
    assert "ended" not in first  # five runs SUCCEEDED
    assert not any(line.startswith(VERDICT_STARTS) for line in rest), text  # one verdict
