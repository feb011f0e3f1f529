"""Sampler: steps a gymnasium vector env exactly T steps per call and returns a Segment.

The env state persists across calls (no reset per iteration). The vector env runs in gymnasium's
``SAME_STEP`` autoreset mode: when an episode ends, ``step`` returns the first observation of the next
episode and puts the last one in ``info["final_obs"]``, so every stored transition belongs to one
episode and a time-limit cut can be bootstrapped from V(final obs).
"""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Callable

import gymnasium as gym
import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv, VectorEnv

import dppo.envs  # noqa: F401 - registers the dppo/ test envs in every actor process
from dppo.config import Config
from dppo.rl.agent import Agent, Weights
from dppo.rl.normalizer import RunningStats
from dppo.rl.segment import Segment


class EnvFailure(RuntimeError):
    """An env kept raising after every retry; carries the env id and the original traceback."""


class LatencyWrapper(gym.Wrapper):
    """Sleeps a fixed time per step, releasing the CPU like a remote simulator or a robot would."""

    def __init__(self, env: gym.Env, latency_ms: float) -> None:
        super().__init__(env)
        self.delay = latency_ms / 1000.0
        self.debt = 0.0  # how much the last sleep overshot: taken off the next, so the mean latency is exact

    def step(self, action):
        wait = self.delay - self.debt
        start = time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        self.debt = time.perf_counter() - start - wait
        return self.env.step(action)


def env_factory(config: Config) -> Callable[[], gym.Env]:
    env_id, kwargs, latency = config.env.id, dict(config.env.kwargs), config.env.latency_ms

    def make() -> gym.Env:
        env = gym.make(env_id, **kwargs)
        return LatencyWrapper(env, latency) if latency > 0 else env

    return make


def make_vector_env(config: Config) -> VectorEnv:
    """E copies of the env in one vector env, autoreset mode set explicitly to SAME_STEP."""
    fns = [env_factory(config)] * config.env.num_envs
    if config.env.vectorization == "async":
        return AsyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    return SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)


class Sampler:
    """Env + agent + normalizers of one actor. Plain Python, so tests and benchmarks use it without Ray."""

    def __init__(self, config: Config, actor_id: int = 0, seed: int | None = None) -> None:
        self.config = config
        self.actor_id = actor_id
        self.seed = config.run.seed + 10_000 * actor_id if seed is None else seed
        self.env_resets = 0
        self.envs = self._start_envs()
        self.agent = Agent(self.envs.single_observation_space, self.envs.single_action_space, config.model,
                           seed=self.seed)
        space = self.envs.single_action_space
        self.box_actions = isinstance(space, gym.spaces.Box)
        self.action_low = getattr(space, "low", None)
        self.action_high = getattr(space, "high", None)
        num_envs = config.env.num_envs
        obs_shape = self.envs.single_observation_space.shape
        self.obs_stats = RunningStats.empty(obs_shape)  # global statistics, as last broadcast
        self.return_stats = RunningStats.empty()
        self.discounted_return = np.zeros(num_envs, np.float64)
        self.episode_return = np.zeros(num_envs, np.float64)
        self.episode_length = np.zeros(num_envs, np.int64)

    def _start_envs(self) -> VectorEnv:
        envs = make_vector_env(self.config)
        seed = self.seed + 1_000 * self.env_resets
        self.obs, _ = envs.reset(seed=seed)
        envs.action_space.seed(seed)
        return envs

    def _restart_envs(self) -> None:
        """Replace a vector env that raised: a fresh one, differently seeded, episodes restart."""
        with contextlib.suppress(Exception):
            self.envs.close()
        self.env_resets += 1
        self.envs = self._start_envs()
        self.discounted_return[:] = 0
        self.episode_return[:] = 0
        self.episode_length[:] = 0

    def set_weights(self, weights: Weights, version: int, obs_stats: RunningStats | None = None,
                    return_stats: RunningStats | None = None) -> None:
        """Load broadcast weights and the merged normalizer statistics every actor shares."""
        self.agent.load(weights, version)
        if obs_stats is not None:
            self.obs_stats = obs_stats
        if return_stats is not None:
            self.return_stats = return_stats

    def _normalize(self, obs: np.ndarray) -> np.ndarray:
        if self.config.env.normalize_obs:
            return self.obs_stats.normalize(obs, self.config.env.obs_clip)
        return obs

    def sample(self) -> Segment:
        """Exactly T steps of every env; an env that raises is recreated and the segment resampled."""
        failures = 0
        while True:
            try:
                return self._sample_once()
            except Exception as err:
                failures += 1
                if failures > self.config.faults.env_retries:
                    raise EnvFailure(
                        f"env {self.config.env.id} in actor {self.actor_id} failed {failures} times in a row: "
                        f"{type(err).__name__}: {err}\n{traceback.format_exc()}"
                    ) from err
                self._restart_envs()

    def _sample_once(self) -> Segment:
        cfg = self.config
        steps, num_envs = cfg.ppo.segment_length, cfg.env.num_envs
        obs_space = self.envs.single_observation_space
        obs_buf = np.empty((steps, num_envs, *obs_space.shape), obs_space.dtype if obs_space.dtype == np.uint8
                           else np.float32)
        action_shape = () if not self.box_actions else self.envs.single_action_space.shape
        act_buf = np.empty((steps, num_envs, *action_shape), np.float32 if self.box_actions else np.int64)
        logp_buf = np.empty((steps, num_envs), np.float32)
        value_buf = np.empty((steps, num_envs), np.float32)
        reward_buf = np.empty((steps, num_envs), np.float32)
        term_buf = np.empty((steps, num_envs), bool)
        trunc_buf = np.empty((steps, num_envs), bool)
        final_value_buf = np.zeros((steps, num_envs), np.float32)
        track_obs, scale_reward = cfg.env.normalize_obs, cfg.env.normalize_reward
        # raw observations and discounted returns, summarized once at the end for the learner's merge
        raw_obs_buf = np.empty((steps, num_envs, *obs_space.shape), np.float64) if track_obs else None
        return_buf = np.empty((steps, num_envs), np.float64) if scale_reward else None
        returns: list[float] = []
        lengths: list[int] = []
        nonfinite = False
        start = time.perf_counter()
        obs = self.obs
        for t in range(steps):
            policy_obs = self._normalize(obs)
            obs_buf[t] = policy_obs
            action, log_prob, value = self.agent.act(policy_obs)
            act_buf[t], logp_buf[t], value_buf[t] = action, log_prob, value
            env_action = np.clip(action, self.action_low, self.action_high) if self.box_actions else action
            next_obs, reward, terminated, truncated, info = self.envs.step(env_action)
            reward = np.asarray(reward, np.float64)
            if not (np.isfinite(reward).all() and np.isfinite(next_obs).all()):
                nonfinite = True
                reward = np.nan_to_num(reward, nan=0.0, posinf=0.0, neginf=0.0)
                next_obs = np.nan_to_num(next_obs, nan=0.0, posinf=0.0, neginf=0.0)
            done = terminated | truncated
            self.episode_return += reward
            self.episode_length += 1
            if track_obs:
                raw_obs_buf[t] = next_obs
            if scale_reward:
                self.discounted_return = self.discounted_return * cfg.ppo.gamma + reward
                return_buf[t] = self.discounted_return
                std = np.sqrt(self.return_stats.var + 1e-8)
                reward = np.clip(reward / std, -cfg.env.reward_clip, cfg.env.reward_clip)
            reward_buf[t], term_buf[t], trunc_buf[t] = reward, terminated, truncated
            cut = truncated & ~terminated
            if cut.any():
                final_obs = np.stack([info["final_obs"][i] for i in np.flatnonzero(cut)])
                final_obs = np.nan_to_num(np.asarray(final_obs, np.float64)) if nonfinite else final_obs
                final_value_buf[t, cut] = self.agent.value(self._normalize(final_obs))
            if done.any():
                for i in np.flatnonzero(done):
                    returns.append(float(self.episode_return[i]))
                    lengths.append(int(self.episode_length[i]))
                self.episode_return[done] = 0
                self.episode_length[done] = 0
                self.discounted_return[done] = 0
            obs = next_obs
        self.obs = obs
        last_values = self.agent.value(self._normalize(obs))
        return Segment(
            obs=obs_buf, actions=act_buf, log_probs=logp_buf, values=value_buf, rewards=reward_buf,
            terminated=term_buf, truncated=trunc_buf, final_values=final_value_buf,
            last_values=last_values.astype(np.float32),
            episode_returns=np.asarray(returns, np.float64), episode_lengths=np.asarray(lengths, np.int64),
            policy_version=self.agent.version, actor_id=self.actor_id,
            sample_seconds=time.perf_counter() - start,
            obs_stats=RunningStats.of(raw_obs_buf.reshape(-1, *obs_space.shape)) if track_obs else None,
            return_stats=RunningStats.of(return_buf.reshape(-1)) if scale_reward else None,
            nonfinite=nonfinite,
        )

    def close(self) -> None:
        self.envs.close()
