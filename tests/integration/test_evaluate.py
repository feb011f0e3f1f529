"""`dppo eval --video DIR`: real episodes rendered and written as mp4 (the `video` extra), where they went said;
an env that cannot render is told apart from bad env.kwargs; a checkpoint of another format is one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import new_checkpoint

from dppo.config import load_config
from dppo.run.checkpoint import CheckpointStore


def test_eval_writes_one_video_per_episode(tmp_path: Path) -> None:
    run = tmp_path / "run"
    config = load_config(overrides={"run.run_dir": str(run)})
    CheckpointStore(run / "checkpoints", 3).save(new_checkpoint(config)[0], 1)
    videos = tmp_path / "videos"
    done = subprocess.run([sys.executable, "-m", "dppo", "eval", "--checkpoint", str(run), "--episodes", "2",
                           "--video", str(videos)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    files = sorted(videos.glob("*.mp4"))
    assert len(files) == 2 and all(f.stat().st_size > 1000 for f in files)
    assert files[0].read_bytes()[4:8] == b"ftyp"  # an MP4 container
    assert f"videos: 2 mp4 files in {videos.resolve()}" in done.stdout


NO_RENDER = """
import gymnasium as gym
import numpy as np


class Plain(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, size: int = 2):
        self.size = size

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, True, False, {}
"""


def test_video_of_an_env_without_render_mode_names_render_mode_not_kwargs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "plain_env.py").write_text(NO_RENDER)
    monkeypatch.syspath_prepend(str(tmp_path))
    run = tmp_path / "run"
    config = load_config(sets=["env.entry_point=plain_env:Plain", "env.kwargs.size=3"])
    CheckpointStore(run / "checkpoints", 3).save(new_checkpoint(config)[0], 1)
    done = subprocess.run([sys.executable, "-m", "dppo", "eval", "--checkpoint", str(run), "--video",
                           str(tmp_path / "videos")], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "env entry point 'plain_env:Plain' has no render_mode" in done.stderr
    assert "--video cannot record it" in done.stderr and "env.kwargs" not in done.stderr


def test_a_run_whose_newest_checkpoint_has_another_format_is_one_line_not_an_older_checkpoint(tmp_path: Path) -> None:
    """A newer dppo's checkpoint is refused by name; dppo eval does not quietly play the older one beside it."""
    run = tmp_path / "run"
    checkpoint = new_checkpoint(load_config(overrides={"run.run_dir": str(run)}))[0]
    store = CheckpointStore(run / "checkpoints", 3)
    store.save(checkpoint, 1)
    store.save({**checkpoint, "format": 2}, 2)
    done = subprocess.run([sys.executable, "-m", "dppo", "eval", "--checkpoint", str(run), "--episodes", "1"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert "ckpt-00000002.pt" in done.stderr and "format 2 and this dppo reads format 1" in done.stderr
