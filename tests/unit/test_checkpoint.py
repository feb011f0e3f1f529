"""Checkpoints: the newest intact one past corrupt ones, only the last k kept, the files' mode under the umask,
the old layout still loading, and another format refused."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import new_checkpoint

from dppo.config import load_config
from dppo.envs.make import env_spaces
from dppo.rl.model import ActorCritic
from dppo.rl.normalizer import RunningStats
from dppo.rl.ppo import Trainer
from dppo.run.checkpoint import (
    CheckpointFormatError,
    CheckpointStore,
    check_resumable,
    compose,
    decode,
    encode,
    load,
)
from dppo.run.run_dir import RunDir
from dppo.run.state import RunState
from dppo.run.trained import trained_model


def test_corrupt_newest_checkpoints_fall_back_to_the_newest_intact(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = load_config()
    checkpoint = new_checkpoint(config)[0]
    store = CheckpointStore(tmp_path / "checkpoints", keep=3)
    paths = []
    for iteration in (1, 2, 3):
        checkpoint["counters"]["iteration"] = iteration
        paths.append(store.save(checkpoint, iteration))
    paths[2].write_bytes(paths[2].read_bytes()[:1000])  # truncated
    data = bytearray(paths[1].read_bytes())
    data[-50] ^= 0xFF  # one flipped bit
    paths[1].write_bytes(bytes(data))
    found = store.newest_intact()
    assert found is not None and found[0] == paths[0]
    assert found[1]["counters"]["iteration"] == 1
    assert sum("skipping checkpoint" in r.message for r in caplog.records) == 2


def test_store_keeps_the_last_k_checkpoints_and_latest_names_the_newest(tmp_path: Path) -> None:
    checkpoint = new_checkpoint(load_config())[0]
    store = CheckpointStore(tmp_path / "checkpoints", keep=2)
    for iteration in range(1, 6):
        store.save(checkpoint, iteration)
    assert [p.name for p in store.list()] == ["ckpt-00000004.pt", "ckpt-00000005.pt"]
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "ckpt-00000005.pt"
    assert not list((tmp_path / "checkpoints").glob("*.tmp"))


@contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.parametrize(("mask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_files_a_run_ships_get_the_mode_open_gives_under_the_umask(tmp_path: Path, mask: int, mode: int) -> None:
    """Checkpoints, config.yaml and summary.json are copied into images and shared: 0o666 less the umask, as
    open() would create them (tempfile.mkstemp's 0o600 made them unreadable to the image's non-root user)."""
    checkpoint = new_checkpoint(load_config())[0]
    run_dir = RunDir(tmp_path / "run")
    store = CheckpointStore(run_dir.checkpoints, keep=2)
    with umask(mask):
        written = [store.save(checkpoint, 1), store.save_best(checkpoint), run_dir.checkpoints / "latest"]
        run_dir.write_config("env: {}\n")
        run_dir.write_summary({"solved": True})
        with open(tmp_path / "plain", "w"):
            pass
    assert stat.S_IMODE((tmp_path / "plain").stat().st_mode) == mode  # what open() gives, for reference
    for path in (*written, run_dir.config, run_dir.summary):
        assert stat.S_IMODE(path.stat().st_mode) == mode, path.name
    assert not list(run_dir.checkpoints.glob(".*.tmp"))


def old_layout(config: Any) -> dict[str, Any]:
    """A checkpoint exactly as dppo wrote it before the format moved into dppo.run.checkpoint (format 1)."""
    model = ActorCritic(*env_spaces(config), config.model)
    trainer = Trainer(model, config.ppo, config.num_iterations, config.run.seed, torch.device("cpu"))
    counters = {"iteration": 7, "env_steps": 7168, "episodes": 300, "wall_s": 12.5, "policy_version": 7,
                "bad_updates_in_row": 0, "eval_return_last": 180.0, "eval_return_best": 190.0}
    return {
        "format": 1, "env_id": config.env.name, "config": config.model_dump(mode="json"),
        "model": model.state_dict(), "trainer": trainer.state_dict(),
        "obs_stats": RunningStats(np.array([0.5, -1.0, 0.0, 2.0]), np.array([1.0, 4.0, 0.5, 2.0]), 99.0).to_state(),
        "return_stats": None, "counters": counters, "recent_returns": [150.0, 200.0], "recent_lengths": [150, 200],
        "progress": {"iteration": 7, "env_steps": 7168},
    }


def test_a_checkpoint_of_the_old_layout_loads_and_resumes(tmp_path: Path) -> None:
    config = load_config(overrides={"env.normalize_obs": True})
    saved = old_layout(config)
    (tmp_path / "ckpt-00000007.pt").write_bytes(encode(saved))
    loaded = load(tmp_path / "ckpt-00000007.pt")
    check_resumable(loaded, config)
    state = RunState(config, 4)
    state.restore(loaded)
    counters = vars(state.counters)
    assert {key: counters[key] for key in saved["counters"]} == saved["counters"]
    assert counters["env_failures"] == 0 and counters["env_failures_by_actor"] == {}  # counters added since: defaults
    assert list(state.recent_returns) == [150.0, 200.0] and list(state.recent_lengths) == [150, 200]
    np.testing.assert_array_equal(state.obs_stats.mean, [0.5, -1.0, 0.0, 2.0])
    trained = trained_model(loaded)
    for key, value in trained.model.state_dict().items():
        torch.testing.assert_close(value, saved["model"][key])
    # and what a run writes now has the same keys, in the same places, and the self-play league (None here)
    written = compose(state, {"default": {}}, {"default": {}}, None)
    assert set(written) == set(saved) | {"league"} and written["league"] is None
    assert written["counters"] == {**saved["counters"], "env_failures": 0, "env_failures_by_actor": {},
                                   "eval_env_steps": None}  # counters added since: their defaults


def test_a_checkpoint_of_another_format_is_refused_in_one_line(tmp_path: Path) -> None:
    checkpoint = new_checkpoint(load_config())[0]
    store = CheckpointStore(tmp_path / "checkpoints", keep=3)
    store.save(checkpoint, 1)
    newer = store.save({**checkpoint, "format": 2}, 2)  # written by a later dppo
    with pytest.raises(CheckpointFormatError, match=r"format 2 and this dppo reads format 1") as raised:
        load(newer)
    assert "\n" not in str(raised.value)
    with pytest.raises(CheckpointFormatError):  # not skipped for the older one: that would resume from lost work
        store.newest_intact()
    no_format = {k: v for k, v in checkpoint.items() if k != "format"}
    with pytest.raises(CheckpointFormatError, match="format None"):
        decode(encode(no_format), "x.pt")


@pytest.mark.parametrize("command", [["eval"], ["export", "-o", "policy.onnx"]])
def test_a_checkpoint_that_is_not_there_is_one_line_before_torch_is_imported(tmp_path: Path,
                                                                             command: list[str]) -> None:
    """Bad input is answered at once: importing torch alone takes seconds of a busy machine."""
    import subprocess
    import sys

    code = ("import sys\nfrom dppo.commands.parser import main\ntry:\n    main(sys.argv[1:])\n"
            "except SystemExit as end:\n    print(end.code, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, *command, "--checkpoint", "missing.pt"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["2", "False"], done.stdout + done.stderr
    assert done.stderr == "dppo: error: checkpoint 'missing.pt' not found; pass an existing ckpt-*.pt file or run " \
                          "dir\n" and not list(tmp_path.iterdir())
