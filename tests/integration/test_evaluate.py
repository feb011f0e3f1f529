"""`dppo eval --video DIR`: real episodes rendered and written as mp4 (the `video` extra)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
