"""The batch rule: ppo.minibatch_size or ppo.num_minibatches (exactly one), the derived minibatch, the note when
more actors multiply a fixed size's SGD steps, and the GPU presets an Atari run with many actors picks."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
import yaml

from dppo.config import ConfigError, load_config, preset_path
from dppo.config.load import GPU_PRESETS_DIR, MANY_ACTORS, ConfigNote
from dppo.envs.make import env_spaces
from dppo.rl.model import ActorCritic
from dppo.rl.ppo import Batch, Trainer
from dppo.rl.spaces import Obs


def no_gpu_question() -> bool:
    raise AssertionError("the device was asked where the choice does not depend on it")


def test_a_count_sizes_minibatches_from_the_batch() -> None:
    config = load_config(overrides={"run.actors": 16, "env.num_envs": 8, "ppo.segment_length": 128},
                         sets=["ppo.num_minibatches=16"])
    assert config.batch_size == 16_384 and config.minibatch_size == 1_024
    assert config.ppo.minibatch_size is None  # the CLI's count replaced the preset's size


def test_without_either_rule_a_minibatch_holds_256_samples() -> None:
    config = load_config(overrides={"env.id": "dppo/Counter-v0"})  # no preset: the defaults
    assert config.ppo.minibatch_size == 256 and config.ppo.num_minibatches is None
    assert yaml.safe_load(config.to_yaml())["ppo"]["minibatch_size"] == 256  # the resolved config says it


def test_both_rules_in_one_file_are_one_line_naming_both(tmp_path: Path) -> None:
    path = tmp_path / "both.yaml"
    path.write_text("ppo: {minibatch_size: 64, num_minibatches: 4}\n")
    with pytest.raises(ConfigError, match=r"^ppo\.minibatch_size 64 and ppo\.num_minibatches 4 are both set; keep one"):
        load_config(path)


def test_a_count_rounds_down_to_whole_columns_per_learner() -> None:
    """LSTM, 4 actors x 2 envs x 16 steps = 128 samples in 8 columns, 2 learners: 3 minibatches would hold 42
    samples; whole columns for both learners (32 samples) it is."""
    config = load_config(overrides={"env.id": "dppo/Counter-v0", "run.actors": 4, "env.num_envs": 2,
                                    "ppo.segment_length": 16, "model.recurrent": "lstm", "run.learners": 2},
                         sets=["ppo.num_minibatches=3"])
    assert config.minibatch_size == 32
    with pytest.raises(ConfigError, match=r"ppo\.num_minibatches 5 leaves less than one env column \(16 steps\) per "
                                          r"learner in a minibatch"):
        load_config(overrides={"env.id": "dppo/Counter-v0", "run.actors": 4, "env.num_envs": 2,
                               "ppo.segment_length": 16, "model.recurrent": "lstm", "run.learners": 2},
                    sets=["ppo.num_minibatches=5"])


def _trainer(*sets: str) -> tuple[Trainer, Batch]:
    cfg = load_config(sets=list(sets))
    torch.manual_seed(0)
    model = ActorCritic(*env_spaces(cfg), cfg.model)
    obs = torch.randn(256, 4)
    with torch.no_grad():
        dist, values = model(obs)
        actions = dist.sample()
    batch = Batch(Obs(vector=obs), actions, dist.log_prob(actions), values, torch.randn(256), values)
    return Trainer(model, cfg.ppo, num_iterations=10, seed=0, device=torch.device("cpu")), batch


def shorter(batch: Batch, rows: int) -> Batch:
    """The batch of a round that lost a quarter of its actors."""
    return Batch(batch.obs.map(lambda x: x[:rows]), *(t[:rows] for t in batch[1:6]))


def test_the_trainer_takes_the_count_per_epoch_and_keeps_it_in_a_short_round() -> None:
    trainer, batch = _trainer("ppo.num_minibatches=4", "ppo.minibatch_size=null")
    assert [len(idx) for idx in trainer._minibatches(batch)] == [64] * 4
    assert [len(idx) for idx in trainer._minibatches(shorter(batch, 192))] == [48] * 4
    trainer, batch = _trainer("ppo.minibatch_size=64")  # a size: the short round has fewer of the same size
    assert [len(idx) for idx in trainer._minibatches(shorter(batch, 192))] == [64] * 3


def test_more_actors_with_a_fixed_size_say_how_many_minibatches_that_makes() -> None:
    """CartPole's preset plans 2 minibatches of 512 for 2 actors x 8 envs x 64 steps; 16 actors make 16."""
    with pytest.warns(ConfigNote, match=r"ppo\.minibatch_size 512 makes 16 minibatches per epoch of this run's batch "
                                        r"of 8192 samples, where the preset configs/cartpole\.yaml plans 2 of its "
                                        r"1024; --set ppo\.num_minibatches=2 keeps its plan"):
        load_config(overrides={"run.actors": 16})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_config(overrides={"run.actors": 4})  # twice the steps per epoch: near the plan, no note
        config = load_config(overrides={"run.actors": 16}, sets=["ppo.num_minibatches=2"])  # the count keeps it
    assert config.minibatch_size == 4096


def test_many_actors_on_a_gpu_machine_take_the_gpu_preset() -> None:
    with pytest.warns(ConfigNote, match=r"ALE/Breakout-v5 with 16 actors and a GPU learner: using the preset "
                                        r"configs/gpu/breakout\.yaml"):
        config = load_config(overrides={"env.id": "ALE/Breakout-v5", "run.actors": 16}, has_gpu=lambda: True)
    assert config.ppo.num_minibatches == 16 and config.minibatch_size == 1024 and config.ppo.normalize_value
    assert config.run.overlap_sampling


def test_many_actors_without_a_gpu_keep_the_cpu_preset_and_name_the_gpu_one() -> None:
    with pytest.warns(ConfigNote, match=r"ALE/Pong-v5 with 8 actors: the learner is on the CPU, so the preset is "
                                        r"configs/pong\.yaml; on a GPU machine use --config configs/gpu/pong\.yaml"):
        config = load_config(overrides={"env.id": "ALE/Pong-v5", "run.actors": 8}, has_gpu=lambda: False)
    assert config.ppo.minibatch_size == 256 and not config.ppo.normalize_value  # the CPU preset's
    with pytest.warns(ConfigNote, match="the learner is on the CPU"):
        load_config(overrides={"env.id": "ALE/Pong-v5", "run.actors": 8, "run.device": "cpu"},
                    has_gpu=no_gpu_question)


def test_few_actors_keep_the_cpu_preset_without_asking_for_a_gpu() -> None:
    config = load_config(overrides={"env.id": "ALE/Breakout-v5", "run.actors": MANY_ACTORS - 1},
                         has_gpu=no_gpu_question)
    assert config.ppo.minibatch_size == 256
    assert load_config(overrides={"env.id": "ALE/Breakout-v5"}, has_gpu=no_gpu_question).run.actors == 2


def test_every_gpu_preset_validates_and_shadows_a_cpu_preset() -> None:
    presets = sorted(GPU_PRESETS_DIR.glob("*.yaml"))
    assert {p.name for p in presets} >= {"breakout.yaml", "pong.yaml"}
    for path in presets:
        config = load_config(path)
        assert preset_path(config.env.id) not in (None, path)  # `--env` alone still gets the CPU preset
        assert config.run.actors >= MANY_ACTORS and config.ppo.num_minibatches is not None
        assert "NOT YET MEASURED" in path.read_text()


def test_a_file_with_only_a_count_drops_the_default_size(tmp_path: Path) -> None:
    path = tmp_path / "count.yaml"
    path.write_text("run: {actors: 4}\nenv: {num_envs: 8}\nppo: {segment_length: 32, num_minibatches: 4}\n")
    config = load_config(path)
    assert config.ppo.minibatch_size is None and config.minibatch_size == 4 * 8 * 32 // 4
    assert load_config(path, sets=["ppo.minibatch_size=64"]).minibatch_size == 64  # the command line's size wins
