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

import numpy as np
from gymnasium.vector import VectorEnv

from dppo.config import Config
from dppo.envs.make import LatencyWrapper, env_factory, make_vector_env  # noqa: F401 - re-exported
from dppo.errors import UsageError
from dppo.rl.agent import Agent, Weights
from dppo.rl.normalizer import RunningStats
from dppo.rl.segment import Segment
from dppo.rl.spaces import Obs


class EnvFailure(RuntimeError):
    """An env kept raising after every retry; carries the env id and the original traceback."""


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
        self.obs_spec, self.action_spec = self.agent.obs_spec, self.agent.action_spec
        num_envs = config.env.num_envs
        # global statistics of the encoded vector part, as last broadcast (images are never normalized)
        self.obs_stats = RunningStats.empty((self.obs_spec.vector_dim,))
        self.return_stats = RunningStats.empty()
        self.discounted_return = np.zeros(num_envs, np.float64)
        self.episode_return = np.zeros(num_envs, np.float64)
        self.episode_length = np.zeros(num_envs, np.int64)

    def _start_envs(self) -> VectorEnv:
        envs = make_vector_env(self.config)
        seed = self.seed + 1_000 * self.env_resets
        self.obs, info = envs.reset(seed=seed)
        self.lives = None
        if self.config.env.terminal_on_life_loss:
            if "lives" not in info:
                raise UsageError(f"env.terminal_on_life_loss needs an env that reports info['lives'] (Atari); "
                                 f"{self.config.env.name} does not: set it to false")
            self.lives = np.asarray(info["lives"])
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

    def _normalize(self, obs: Obs) -> Obs:
        """Normalize the vector part in place (it is this sampler's own encoded copy)."""
        if self.config.env.normalize_obs and obs.vector is not None:
            obs.vector[:] = self.obs_stats.normalize(obs.vector, self.config.env.obs_clip)
        return obs

    def _encode(self, obs: object, out: Obs) -> bool:
        """Encode raw env observations into ``out``; NaN/Inf become 0 and are reported (True)."""
        self.obs_spec.encode(obs, out=out)
        if out.vector is None or np.isfinite(out.vector).all():
            return False
        np.nan_to_num(out.vector, copy=False, nan=0.0, posinf=0.0, neginf=0.0)
        return True

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
                        f"env {self.config.env.name} in actor {self.actor_id} failed {failures} times in a row: "
                        f"{type(err).__name__}: {err}\n{traceback.format_exc()}"
                    ) from err
                self._restart_envs()

    def _sample_once(self) -> Segment:
        cfg = self.config
        steps, num_envs = cfg.ppo.segment_length, cfg.env.num_envs
        spec, action_spec = self.obs_spec, self.action_spec
        obs_buf = spec.empty((steps, num_envs))
        act_buf = np.empty((steps, num_envs, *action_spec.stored_shape), action_spec.stored_dtype)
        logp_buf = np.empty((steps, num_envs), np.float32)
        value_buf = np.empty((steps, num_envs), np.float32)
        reward_buf = np.empty((steps, num_envs), np.float32)
        term_buf = np.empty((steps, num_envs), bool)
        trunc_buf = np.empty((steps, num_envs), bool)
        final_value_buf = np.zeros((steps, num_envs), np.float32)
        track_obs = cfg.env.normalize_obs and spec.has_vector
        scale_reward = cfg.env.normalize_reward
        # raw encoded vectors and discounted returns, summarized once at the end for the learner's merge
        raw_obs_buf = np.empty((steps, num_envs, spec.vector_dim), np.float64) if track_obs else None
        return_buf = np.empty((steps, num_envs), np.float64) if scale_reward else None
        returns: list[float] = []
        lengths: list[int] = []
        start = time.perf_counter()
        last = spec.empty((num_envs,))  # the observation after the segment: the bootstrap's input
        nonfinite = self._encode(self.obs, obs_buf[0])
        obs = self.obs
        for t in range(steps):
            step_obs = self._normalize(obs_buf[t])
            action, log_prob, value = self.agent.act(step_obs)
            act_buf[t], logp_buf[t], value_buf[t] = action, log_prob, value
            next_obs, reward, terminated, truncated, info = self.envs.step(action_spec.to_env(action))
            encoded = obs_buf[t + 1] if t + 1 < steps else last
            nonfinite |= self._encode(next_obs, encoded)
            if track_obs:
                raw_obs_buf[t] = encoded.vector
            reward = np.asarray(reward, np.float64)
            if not np.isfinite(reward).all():
                nonfinite = True
                reward = np.nan_to_num(reward, nan=0.0, posinf=0.0, neginf=0.0)
            done = terminated | truncated
            self.episode_return += reward
            if self.lives is not None:  # a lost life ends the episode for learning only (Atari)
                lives = np.asarray(info["lives"])
                terminated = terminated | ((lives < self.lives) & ~done)
                self.lives = lives
            if cfg.env.clip_reward:
                reward = np.sign(reward)
            self.episode_length += 1
            if scale_reward:
                self.discounted_return = self.discounted_return * cfg.ppo.gamma + reward
                return_buf[t] = self.discounted_return
                std = np.sqrt(self.return_stats.var + 1e-8)
                reward = np.clip(reward / std, -cfg.env.reward_clip, cfg.env.reward_clip)
            reward_buf[t], term_buf[t], trunc_buf[t] = reward, terminated, truncated
            cut = truncated & ~terminated
            if cut.any():
                final = spec.encode_rows(info["final_obs"], np.flatnonzero(cut))
                if final.vector is not None:
                    np.nan_to_num(final.vector, copy=False, nan=0.0, posinf=0.0, neginf=0.0)
                final_value_buf[t, cut] = self.agent.value(self._normalize(final))
            if done.any():
                for i in np.flatnonzero(done):
                    returns.append(float(self.episode_return[i]))
                    lengths.append(int(self.episode_length[i]))
                self.episode_return[done] = 0
                self.episode_length[done] = 0
                self.discounted_return[done] = 0
            obs = next_obs
        self.obs = obs
        last_values = self.agent.value(self._normalize(last))
        return Segment(
            obs=obs_buf, actions=act_buf, log_probs=logp_buf, values=value_buf, rewards=reward_buf,
            terminated=term_buf, truncated=trunc_buf, final_values=final_value_buf,
            last_values=last_values.astype(np.float32),
            episode_returns=np.asarray(returns, np.float64), episode_lengths=np.asarray(lengths, np.int64),
            policy_version=self.agent.version, actor_id=self.actor_id,
            sample_seconds=time.perf_counter() - start,
            obs_stats=RunningStats.of(raw_obs_buf.reshape(-1, spec.vector_dim)) if track_obs else None,
            return_stats=RunningStats.of(return_buf.reshape(-1)) if scale_reward else None,
            nonfinite=nonfinite,
        )

    def close(self) -> None:
        self.envs.close()
