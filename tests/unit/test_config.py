"""The config's own rules: renamed keys keep working with a warning, cross-section limits, derived values."""

from __future__ import annotations

import warnings

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
