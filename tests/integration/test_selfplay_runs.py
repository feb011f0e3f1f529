"""Two-player games by self-play through the real CLI on a real Ray cluster: tic-tac-toe trains against its
snapshot pool, the pool and the ratings go into the checkpoint and a resume continues them, a seeded run
reproduces itself, and `dppo eval` plays a chosen opponent. Short runs: the pipeline, not learning (the
self-play benchmark is `python -m benchmarks selfplay`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from runs import progress_records as progress
from runs import run_dppo as dppo
from runs import without_timings

GAME = ["--env", "pettingzoo.classic.tictactoe_v3", "--envs-per-actor", "8", "--segment-length", "16",
        "--no-tensorboard", "--set", "selfplay.snapshot_every=2", "--set", "selfplay.pool_size=2"]


def league_of(run: Path) -> dict:
    from dppo.run.checkpoint import load

    return load(run)["league"]


def test_a_seeded_selfplay_run_reproduces_itself(ray_address: str, tmp_path: Path) -> None:
    runs = []
    for name in ("a", "b"):
        done = dppo("train", *GAME, "--address", ray_address, "--run-dir", str(tmp_path / name), "--actors", "2",
                    "--seed", "3", "--total-steps", "768")
        assert done.returncode == 0, done.stderr
        runs.append(without_timings(progress(tmp_path / name)))
    assert runs[0] == runs[1] and len(runs[0]) == 3
    first = runs[0][0]
    # every game of the first round ends with a score the league counted; the run line shows the ratings
    assert first["selfplay_games"] == first["episodes"] > 0
    assert first["selfplay_win_rate"] + first["selfplay_draw_rate"] + first["selfplay_loss_rate"] == pytest.approx(1)
    assert [r["selfplay_pool_size"] for r in runs[0]] == [1, 1, 2]  # snapshots at iterations 0 and 2


def test_the_pool_is_in_the_checkpoint_and_a_resume_continues_it(ray_address: str, tmp_path: Path) -> None:
    run = tmp_path / "run"
    done = dppo("train", *GAME, "--address", ray_address, "--run-dir", str(run), "--actors", "1", "--total-steps",
                "384")
    assert done.returncode == 0, done.stderr
    assert "elo=" in done.stdout and "win/draw/loss=" in done.stdout
    saved = league_of(run)
    assert [s["iteration"] for s in saved["snapshots"]] == [0, 2] and saved["next_id"] == 2
    resumed = dppo("train", "--resume", "--address", ray_address, "--run-dir", str(run), "--total-steps", "768")
    assert resumed.returncode == 0, resumed.stderr
    records = progress(run)
    assert [r["env_steps"] for r in records] == [128 * i for i in range(1, 7)]
    assert records[2]["selfplay_elo"] == pytest.approx(saved["elo"], abs=0.01)
    after = league_of(run)
    # pool_size 2: the snapshot of iteration 4 (taken after the resume) pushed out iteration 0's; ids continue
    assert [s["iteration"] for s in after["snapshots"]] == [2, 4] and after["next_id"] == 3
    assert after["snapshots"][0]["games"] > saved["snapshots"][1]["games"]  # its record continued after the resume

    for opponent, games in (("random", 4), ("minimax", 2), ("snapshot:latest", 2), (str(run), 2)):
        evaluated = dppo("eval", "--checkpoint", str(run), "--opponent", opponent, "--episodes", str(games))
        assert evaluated.returncode == 0, evaluated.stderr
        assert f"against {opponent}, win/draw/loss: first seat" in evaluated.stdout
        assert f"of {games} games" in evaluated.stdout
    bad = dppo("eval", "--checkpoint", str(run), "--opponent", "snapshot:7")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "the pool holds snapshots [1, 2]" in bad.stderr


def test_opponent_is_refused_for_a_single_agent_env(ray_address: str, tmp_path: Path) -> None:
    run = tmp_path / "run"
    done = dppo("train", "--address", ray_address, "--run-dir", str(run), "--actors", "1", "--total-steps", "512",
                "--no-tensorboard")
    assert done.returncode == 0, done.stderr
    bad = dppo("eval", "--checkpoint", str(run), "--opponent", "random")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--opponent is for two-player" in bad.stderr
