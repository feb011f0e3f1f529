"""metrics.info_keys: the env's info figures of the episodes that ended, from a vector env's masked infos through the
sampler's segment to the progress record, the Prometheus gauge and the TensorBoard tag."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import generate_latest

from dppo.config import load_config
from dppo.errors import UsageError
from dppo.rl.env_info import EndedInfo, ended_values, iteration_means
from dppo.rl.ppo import TrainStats
from dppo.rl.sampler import Sampler
from dppo.run.metrics import Metrics
from dppo.run.reporting import progress_record
from dppo.run.state import RunState
from dppo.run.tensorboard import tag


def test_the_final_info_of_ended_copies_counts_where_its_mask_is_set() -> None:
    """SAME_STEP autoreset: an ended copy's top-level entries are its new episode's reset info, not its end."""
    info = {"success": np.array([9.0, 9.0, 9.0, 9.0]), "_success": np.ones(4, bool),  # reset infos: never read
            "final_info": {"success": np.array([True, False, True, False]), "_success": np.array([1, 1, 0, 1], bool),
                           "distance": np.array([0.5, 1.5, 0.0, 0.0]), "_distance": np.array([1, 1, 0, 0], bool)},
            "_final_info": np.array([1, 1, 0, 1], bool)}
    ended = np.array([True, True, False, True])
    assert ended_values(info, ended, "success", "env") == [1.0, 0.0, 0.0]
    assert ended_values(info, ended, "distance", "env") == [0.5, 1.5]  # copy 3 ended without setting it
    assert ended_values(info, ended, "cost", "env") == []


def test_a_vector_env_without_final_info_is_read_at_the_top_level() -> None:
    info = {"score": np.array([3, 4, 5]), "_score": np.array([1, 0, 1], bool)}
    assert ended_values(info, np.array([True, True, False]), "score", "env") == [3.0]


def test_a_value_that_is_not_a_number_is_one_line_naming_the_key() -> None:
    info = {"final_info": {"label": np.array(["cart", "pole"], object), "_label": np.ones(2, bool)}}
    with pytest.raises(UsageError, match=r"^env 'mine' info\['label'\] is str 'cart', and metrics.info_keys "
                                         "averages numbers and booleans"):
        ended_values(info, np.array([True, False]), "label", "mine")


def test_a_segment_carries_the_figures_of_the_episodes_that_ended_in_it() -> None:
    """InfoCartPole sets success (pole stood 30 steps) only where the pole falls: one value per ended episode, in the
    order of the segment's episode lengths, and distance on every step."""
    config = load_config(overrides={"env.id": "dppo/InfoCartPole-v0", "env.num_envs": 4, "ppo.segment_length": 64,
                                    "ppo.minibatch_size": 64, "metrics.info_keys": ["success", "distance", "absent"]})
    sampler = Sampler(config)
    segment = sampler.sample()
    lengths = segment.episode_lengths
    assert len(lengths) > 4  # an untrained CartPole ends an episode every 20 steps or so
    assert np.array_equal(segment.env_info["success"], (lengths >= 30).astype(float))
    assert len(segment.env_info["distance"]) == len(lengths) and (segment.env_info["distance"] >= 0).all()
    assert "absent" not in segment.env_info  # no episode set it: no value, not 0
    assert segment.summary().env_info is segment.env_info  # the driver reads it when learners fetch the segment
    assert set(sampler.sample().env_info) == {"success", "distance"}  # each segment its own episodes


def test_the_progress_record_averages_over_every_segment_and_leaves_absent_keys_empty() -> None:
    config = load_config(overrides={"metrics.info_keys": ["success", "cost"]})
    state = RunState(config, 4)
    segments = [Sampler(load_config(overrides={"env.num_envs": 2, "ppo.segment_length": 8,
                                               "ppo.minibatch_size": 16})).sample() for _ in range(2)]
    segments[0].env_info = {"success": np.array([1.0, 0.0, 1.0])}
    segments[1].env_info = {"success": np.array([1.0])}
    stats = {"default": TrainStats(0.1, 2.0, 1.0, 0.01, 0.1, 0.5, 3e-4, 0.2, 4, 0)}
    record = progress_record(state, segments, 32, stats, {"sample": 0.1}, 1.0)
    assert record["info/success"] == 0.75 and record["info/cost"] is None  # episode-weighted mean
    assert iteration_means(["success"], [{}, {}]) == {"info/success": None}


def test_dppo_env_info_is_labelled_by_key_and_gone_while_no_episode_carries_it() -> None:
    metrics = Metrics("CartPole-v1", "run")
    metrics.set_gauges({"info/success": 0.75, "info/entropy": 2.0, "info/cost": None})
    text = generate_latest(metrics.registry).decode()
    assert 'dppo_env_info{key="success"} 0.75' in text and 'dppo_env_info{key="entropy"} 2.0' in text
    assert 'key="cost"' not in text and 'policy="info"' not in text  # not a policy's diagnostic
    metrics.set_gauges({"info/success": None})
    assert 'key="success"' not in generate_latest(metrics.registry).decode()


def test_tensorboard_puts_the_env_figures_in_a_group_of_their_own() -> None:
    assert tag("info/success") == "info/success" and tag("info/entropy") == "info/entropy"


def test_ended_info_collects_per_segment() -> None:
    collected = EndedInfo(["x"], "env")
    collected.add({"x": np.array([1.0, 2.0]), "_x": np.ones(2, bool)}, np.array([True, False]))
    assert list(collected.take()["x"]) == [1.0]
    collected.start()
    assert collected.take() == {}


def test_a_key_that_is_not_a_number_stops_the_check_at_start_and_the_sampler() -> None:
    """InfoCartPole's label is a string: named by the env check before anything is written, and by an actor's
    sampler where it first shows at an episode's end."""
    from dppo.envs.checks import check_env

    config = load_config(overrides={"env.id": "dppo/InfoCartPole-v0", "env.num_envs": 2, "ppo.segment_length": 64,
                                    "ppo.minibatch_size": 64, "metrics.info_keys": ["success", "label"]})
    with pytest.raises(UsageError, match=r"info\['label'\] is str 'cart'"):
        check_env(config)
    with pytest.raises(UsageError, match=r"info\['label'\] is str 'cart'"):
        Sampler(config).sample()
