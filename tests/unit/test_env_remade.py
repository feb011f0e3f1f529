"""A vector env that raises out of ``step`` (ale-py's cannot recreate one copy alone) is made afresh mid-segment, and
its reset is retried on another fresh one (issue 62 item 5): past faults.env_retries tries, one EnvFailure naming the
env and the file:line of the last exception. Real gymnasium envs; the vector env is wrapped to raise."""

from __future__ import annotations

import gymnasium as gym
import pytest

from dppo.config import load_config
from dppo.envs.make import make_vector_env
from dppo.rl.sampler import EnvFailure, Sampler


class Breaks(gym.vector.VectorWrapper):
    """The ``plan["made"]``-th vector env made: its step raises once at ``plan["step_at"]`` (the first env's), and
    its reset raises when its number is in ``plan["bad_resets"]``; each reset's (number, seed) in ``plan["seeds"]``."""

    def __init__(self, env: gym.vector.VectorEnv, plan: dict) -> None:
        super().__init__(env)
        plan["made"] += 1
        self.number, self.plan, self.steps = plan["made"], plan, 0

    def reset(self, **kwargs):
        self.plan["seeds"].append((self.number, kwargs.get("seed")))
        if self.number in self.plan["bad_resets"]:
            raise ConnectionError("the simulator did not come back")
        return self.env.reset(**kwargs)

    def step(self, actions):
        self.steps += 1
        if self.number == 1 and self.steps == self.plan["step_at"]:
            raise RuntimeError("the simulator fell over")
        return self.env.step(actions)


def sampler(bad_resets: set[int], **overrides: object) -> tuple[Sampler, dict]:
    config = load_config(overrides={"env.num_envs": 2, "ppo.segment_length": 12, "ppo.minibatch_size": 24,
                                    "faults.env_retries": 2, "run.seed": 3, **overrides})
    plan = {"made": 0, "step_at": 5, "bad_resets": bad_resets, "seeds": []}
    return Sampler(config, make_envs=lambda cfg: Breaks(make_vector_env(cfg), plan)), plan


def test_a_remade_vector_env_whose_reset_fails_is_made_again_and_the_segment_goes_on() -> None:
    remade, _ = sampler({2, 3})  # the first two remade envs cannot reset; the third can
    segment = remade.sample()
    assert remade.env_resets == 3 and segment.truncated[4].all() and segment.env_failures.count == 2
    assert remade.sample().actions.shape == (12, 2)


def test_past_its_retries_a_reset_that_keeps_failing_is_one_env_failure_with_its_file_and_line() -> None:
    broken, _ = sampler({2, 3, 4, 5})
    with pytest.raises(EnvFailure, match=r"could not reset in 3 tries: ConnectionError: the simulator did not come "
                                         r"back \(at .*test_env_remade\.py:\d+\)"):
        broken.sample()


def test_a_half_remade_mid_segment_whose_reset_fails_once_is_retried_with_its_own_seed() -> None:
    remade, plan = sampler({3}, **{"env.num_envs": 4, "run.actor_halves": 2, "ppo.minibatch_size": 48})
    segment = remade.sample()  # vector envs 1 and 2: the halves; 3: half 0 remade, its reset fails; 4: its retry
    seed = remade.seed
    assert plan["seeds"] == [(1, seed), (2, seed + 2), (3, seed + 1_000), (4, seed + 2_000)]
    assert segment.truncated[4, :2].all() and not segment.truncated[4, 2:].any() and segment.env_failures.count == 2
    assert remade.sample().actions.shape == (12, 4)


def test_every_vector_env_restarted_goes_through_the_same_path_its_reset_retried() -> None:
    """``restart_envs`` (the segment lost with the inference service): both halves made afresh with the seeds of one
    restart (one vector env of E, as at the start), a reset that fails retried on another with its own seed, and
    past the retries one EnvFailure."""
    halves = {"env.num_envs": 4, "run.actor_halves": 2, "ppo.minibatch_size": 48}
    restarted, plan = sampler({4}, **halves)  # 1 and 2: the halves; 3 and 4: restarted, 4's reset fails; 5: its retry
    restarted.restart_envs()
    seed = restarted.seed
    assert plan["seeds"] == [(1, seed), (2, seed + 2), (3, seed + 1_000), (4, seed + 1_002), (5, seed + 2_002)]
    assert restarted.env_resets == 2 and restarted.sample().actions.shape == (12, 4)
    broken, _ = sampler({2, 3, 4})
    with pytest.raises(EnvFailure, match=r"never got through a reset \(tried 3 times, recreating it each time\): "
                                         r"ConnectionError: the simulator did not come back \(at .*test_env_remade"):
        broken.restart_envs()
