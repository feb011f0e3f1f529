"""`dppo plot` on the progress of real training runs (the session's Ray cluster)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import PNG_SIGNATURE, run_curves

from dppo.commands.plot import plot_runs


@pytest.mark.slow
def test_cli_plots_two_real_training_runs(tmp_path: Path, dppo_cmd: list[str], ray_address: str) -> None:
    """Two short real CartPole runs (1 and 2 actors) -> `dppo plot` -> a PNG with both curves."""
    runs = []
    for actors in (1, 2):
        run_dir = tmp_path / f"cartpole-{actors}"
        train = subprocess.run(
            [*dppo_cmd, "train", "--env", "CartPole-v1", "--actors", str(actors), "--total-steps", "3072",
             "--seed", "1", "--run-dir", str(run_dir), "--address", ray_address,
             "--set", "env.num_envs=4", "--set", "ppo.segment_length=128", "--set", "ppo.minibatch_size=256"],
            capture_output=True, text=True, timeout=180,
        )
        assert train.returncode == 0, train.stderr[-3000:]
        runs.append(run_dir)
    output = tmp_path / "scaling.png"
    result = subprocess.run([*dppo_cmd, "plot", *map(str, runs), "-o", str(output)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert output.read_bytes().startswith(PNG_SIGNATURE) and output.stat().st_size > 20_000
    figure = plot_runs(runs, None)
    for axes in run_curves(figure):
        assert sorted(axes) == ["cartpole-1 (1 actor)", "cartpole-2 (2 actors)"]
        assert all(len(x) >= 2 for x in axes.values())
