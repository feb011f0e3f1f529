"""The config's own rules: renamed keys keep working with a warning, cross-section limits, derived values."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from dppo.config import ConfigError, DeprecatedKey, load_config, validate


@pytest.mark.parametrize(("old", "new"), [("torch_threads", "actor_threads"), ("actor_num_cpus", "actor_cpus")])
def test_a_renamed_key_still_works_and_the_warning_names_the_new_one(old: str, new: str) -> None:
    with pytest.warns(DeprecatedKey, match=f"config key run.{old} is deprecated; use run.{new}"):
        config = load_config(sets=[f"run.{old}=3"])
    assert getattr(config.run, new) == 3
    assert old not in config.to_yaml()  # a run writes the new name


def test_a_checkpoint_with_old_keys_loads_without_a_warning() -> None:
    """A checkpoint's stored config is not the user's to fix: validated quietly."""
    data = load_config().model_dump(mode="json")
    data["run"]["torch_threads"] = data["run"].pop("actor_threads")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert validate(data, warn=False).run.actor_threads == 1


def test_both_names_of_a_key_are_an_error() -> None:
    with pytest.raises(ConfigError, match=r"run\.actor_num_cpus and run\.actor_cpus are both set; keep only"):
        load_config(sets=["run.actor_num_cpus=1", "run.actor_cpus=2"])


def test_the_value_clip_has_its_own_coefficient_defaulting_to_the_ratio_clip() -> None:
    assert load_config(sets=["ppo.clip_coef=0.3"]).ppo.value_clip_range == 0.3
    assert load_config(sets=["ppo.clip_coef=0.3", "ppo.value_clip_coef=10"]).ppo.value_clip_range == 10


def test_the_elastic_floor_cannot_exceed_the_actors() -> None:
    assert load_config(sets=["run.actors=4", "faults.min_actors=4"]).faults.min_actors == 4
    with pytest.raises(ConfigError, match=r"faults\.min_actors 5 exceeds run\.actors 4"):
        load_config(sets=["run.actors=4", "faults.min_actors=5"])


def config_error(sets: list[str] | None = None, path: Path | None = None) -> str:
    with pytest.raises(ConfigError) as error:
        load_config(path, sets=sets)
    return str(error.value)


def test_every_unknown_key_is_named_with_the_key_meant() -> None:
    """A section's typo, another library's name (lr), an unknown section: all in the one line."""
    message = config_error(["ppo.lr=1e-3", "rn.actors=2", "ppo.gama=0.9"])
    assert message.startswith("unknown keys 'ppo.lr' (did you mean ppo.learning_rate?), 'ppo.gama' (did you mean "
                              "ppo.gamma?) and 'rn.actors' (did you mean run.actors?); check the spelling"), message
    assert "\n" not in message


@pytest.mark.parametrize(("key", "meant"), [
    ("ppo.learningrate", "ppo.learning_rate"),  # a near spelling
    ("ppo.mgn", "ppo.max_grad_norm"),  # initials
    ("ppo.n_steps", "ppo.segment_length"),  # Stable-Baselines3's name
    ("run.num_envs", "env.num_envs"),  # the key of another section
    ("seed", "run.seed"),  # a section's key at the top
    ("run.torch_thread", "run.actor_threads"),  # a misspelt deprecated name: the new name
    ("ppo.clip", "ppo.clip_coef or ppo.clip_value_loss"),  # the keys it begins
    ("env.wrappers=[{nme: X}]", "env.wrappers.0.name"),  # a list item's key
])
def test_the_key_meant_is_suggested(key: str, meant: str) -> None:
    item = key if "=" in key else f"{key}=1"
    assert f"(did you mean {meant}?)" in config_error([item])


def test_an_unknown_section_with_several_keys_is_named_with_the_section_meant() -> None:
    assert config_error(["rn.actors=2", "rn.seed=3"]).startswith("unknown key 'rn' (did you mean run?)")


def test_a_key_nothing_resembles_gets_no_guess() -> None:
    assert config_error(["ppo.zzz=1"]) == "unknown key 'ppo.zzz'; check the spelling (dppo train --help lists the keys)"


def test_every_bad_value_is_named_with_what_it_got() -> None:
    message = config_error(["run.actors=0", "ppo.gamma=3", "run.target_return=high"])
    assert message == ("ppo.gamma: Input should be less than or equal to 1 (got 3); run.actors: Input should be "
                       "greater than or equal to 1 (got 0); run.target_return: Input should be a valid number, unable "
                       "to parse string as a number (got 'high')")


def test_a_config_file_s_typos_are_named_like_the_command_line_s(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("ppo:\n  lr: 0.001\n  epoch: 3\nrun:\n  actors: 0\n")
    assert config_error(path=path) == (
        "unknown keys 'ppo.lr' (did you mean ppo.learning_rate?) and 'ppo.epoch' (did you mean ppo.epochs?); check "
        "the spelling (dppo train --help lists the keys); run.actors: Input should be greater than or equal to 1 "
        "(got 0)")


def test_an_env_named_on_the_command_line_replaces_the_files_other_name(tmp_path: Path) -> None:
    """--set env.entry_point over a preset's env.id (or env.id over a file's entry point) names one env, not two."""
    config = load_config(Path(__file__).parents[2] / "configs" / "cartpole.yaml",
                         sets=["env.entry_point=dppo.envs.flaky:flaky_gym"])
    assert (config.env.id, config.env.entry_point) == (None, "dppo.envs.flaky:flaky_gym")
    path = tmp_path / "mine.yaml"
    path.write_text("env:\n  entry_point: mysim:make\n")
    assert load_config(path, sets=["env.id=CartPole-v1"]).env.entry_point is None
    with pytest.raises(ConfigError, match=r"set exactly one of env\.id and env\.entry_point"):
        load_config(sets=["env.id=CartPole-v1", "env.entry_point=mysim:make"])
