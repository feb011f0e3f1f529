"""`dppo tune` keeps the config's batch (actors x envs x T) and its updates per sample by default, so its answer
trains the same policy from the same samples, only sooner (dppo/tune/grid.py); settings of another batch only with
--change-batch; its config file goes to the user's cache dir, not the working directory (dppo/commands/tune.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dppo.commands.tune import default_out
from dppo.config import load_config
from dppo.config.load import PRESETS_DIR
from dppo.tune.grid import grid, minibatches_per_epoch


@pytest.mark.parametrize("preset", ["cartpole", "breakout", "lunarlander"])
def test_every_default_setting_keeps_the_batch_and_the_updates_per_sample(preset: str) -> None:
    path = PRESETS_DIR / f"{preset}.yaml"
    config = load_config(path)
    minibatches = minibatches_per_epoch(config)
    candidates = grid(config, cpus=8, gpus=1)
    splits = {(c.actors, c.envs_per_actor) for c in candidates}
    assert len(splits) >= 3 and (config.run.actors, config.env.num_envs) in splits  # the actors split the envs
    for candidate in candidates:
        tuned = load_config(path, sets=candidate.sets(minibatches))
        assert tuned.batch_size == config.batch_size and tuned.ppo.segment_length == config.ppo.segment_length
        assert (tuned.minibatch_size, tuned.ppo.epochs) == (config.minibatch_size, config.ppo.epochs)


def test_options_that_change_the_batch_need_the_flag() -> None:
    config = load_config(overrides={"env.id": "CartPole-v1"})  # 2 actors x 8 envs x T 64
    kept = grid(config, cpus=4, gpus=0, actors=[1, 2, 4], envs=[4, 8, 16], places=["actor"])
    assert {c.name for c in kept} == {"1x16 T64 actor", "2x8 T64 actor", "4x4 T64 actor"}
    changed = grid(config, cpus=4, gpus=0, actors=[1, 2, 4], envs=[4, 8, 16], places=["actor"], change_batch=True)
    assert len(changed) == 9 and len({c.batch for c in changed}) == 5


def test_the_config_file_goes_to_the_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DPPO_TUNE_DIR", str(tmp_path / "cache"))
    assert default_out("ALE/Breakout-v5") == tmp_path / "cache" / "tune-ALE_Breakout-v5.yaml"
