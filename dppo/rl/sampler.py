"""Sampler: steps a gymnasium vector env exactly T steps per call and returns a Segment.

The env state persists across calls (no reset per iteration). The vector env runs in gymnasium's
``SAME_STEP`` autoreset mode: when an episode ends, ``step`` returns the first observation of the next
episode and puts the last one in ``info["final_obs"]``, so every stored transition belongs to one
episode and a time-limit cut can be bootstrapped from V(final obs). The step loop is the only thing here:
what is done to observations and rewards on the way lives in :mod:`dppo.rl.transforms`.
"""

from __future__ import annotations

import contextlib
import time
import traceback

import numpy as np
from gymnasium.vector import VectorEnv

from dppo.config import Config
from dppo.envs.checks import old_api_error, old_step_error
from dppo.envs.make import make_vector_env
from dppo.errors import UsageError, first_line
from dppo.rl.actions import NoLegalAction
from dppo.rl.agent import Agent, Weights
from dppo.rl.normalizer import RunningStats
from dppo.rl.segment import Segment
from dppo.rl.spaces import Obs
from dppo.rl.transforms import EpisodeStats, LearningReward, LifeLoss, ObsNormalizer, scrub_nonfinite


class EnvFailure(RuntimeError):
    """An env kept raising after every retry: one line naming the env, the actor, the error and where it was
    raised; ``details`` holds the whole traceback (it reaches train.log, not the terminal)."""

    def __init__(self, message: str, details: str = "") -> None:
        super().__init__(message)
        self.details = details


def last_frame(err: BaseException) -> str:
    """Where an exception was raised, as file:line (the one line of its traceback a user needs)."""
    frames = traceback.extract_tb(err.__traceback__)
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "unknown place"


def actor_seed(run_seed: int, actor: int, spawn: int = 0) -> int:
    """The seed of an actor's envs and action sampling: distinct per actor slot and per spawn of the run (a
    replacement does not replay its predecessor's episodes)."""
    return run_seed + 10_000 * actor + 7_919 * spawn


class Sampler:
    """Env + agent + transforms of one actor. Plain Python, so tests and benchmarks use it without Ray."""

    def __init__(self, config: Config, actor_id: int = 0, seed: int | None = None) -> None:
        self.config = config
        self.actor_id = actor_id
        self.seed = actor_seed(config.run.seed, actor_id) if seed is None else seed
        self.env_resets = 0
        self.envs = self._start_envs()
        self.agent = Agent(self.envs.single_observation_space, self.envs.single_action_space, config.model,
                           seed=self.seed)
        self.obs_spec, self.action_spec = self.agent.obs_spec, self.agent.action_spec
        env, num_envs = config.env, config.env.num_envs
        self.normalize_obs = ObsNormalizer(env.normalize_obs, env.obs_clip, self.obs_spec.vector_dim)
        self.learning_reward = LearningReward(env.clip_reward, env.normalize_reward, num_envs, config.ppo.gamma,
                                              env.reward_clip)
        self.episodes = EpisodeStats(num_envs)

    def _start_envs(self) -> VectorEnv:
        envs = make_vector_env(self.config)
        seed = self.seed + 1_000 * self.env_resets
        try:
            self.obs, info = envs.reset(seed=seed)
        except Exception:
            old = old_api_error(self.config.env, seed)  # gymnasium's unpack error does not say why
            if old is None:
                raise
            with contextlib.suppress(Exception):
                envs.close(terminate=True)  # an async vector env's half-done reset cannot be waited for
            raise old from None
        self.life_loss = None
        if self.config.env.terminal_on_life_loss:
            if "lives" not in info:
                raise UsageError(f"env.terminal_on_life_loss needs an env that reports info['lives'] (Atari); "
                                 f"{self.config.env.name} does not: set it to false")
            self.life_loss = LifeLoss(info["lives"])
        envs.action_space.seed(seed)
        return envs

    def _restart_envs(self) -> None:
        """Replace a vector env that raised: a fresh one, differently seeded, episodes restart."""
        with contextlib.suppress(Exception):
            self.envs.close()
        self.env_resets += 1
        self.envs = self._start_envs()
        self.learning_reward.end_episodes(np.ones(self.config.env.num_envs, bool))
        self.agent.end_episodes(np.ones(self.config.env.num_envs, bool))
        self.episodes.reset()

    def set_weights(self, weights: Weights, version: int, obs_stats: RunningStats | None = None,
                    return_stats: RunningStats | None = None) -> None:
        """Load broadcast weights and the merged normalizer statistics every actor shares."""
        self.agent.load(weights, version)
        if obs_stats is not None:
            self.normalize_obs.stats = obs_stats
        if return_stats is not None:
            self.learning_reward.stats = return_stats

    def _encode(self, obs: object, out: Obs) -> bool:
        """Encode raw env observations into ``out``; True when NaN/Inf had to be scrubbed."""
        self.obs_spec.encode(obs, out=out)
        return scrub_nonfinite(out.vector)

    def sample(self) -> Segment:
        """Exactly T steps of every env; an env that raises is recreated and the segment resampled."""
        failures = 0
        while True:
            try:
                return self._sample_once()
            except NoLegalAction as err:  # the env's mask, not a passing fault: no retry helps
                raise EnvFailure(f"env {self.config.env.name} in actor {self.actor_id} returned an action mask that "
                                 f"allows no action ({err}); every observation must allow at least one",
                                 traceback.format_exc()) from err
            except Exception as err:
                old = old_step_error(err, self.config.env.name)
                if old is not None:  # the env's API, not a passing fault: no retry helps
                    raise EnvFailure(str(old), traceback.format_exc()) from err
                failures += 1
                if failures > self.config.faults.env_retries:
                    raise EnvFailure(f"env {self.config.env.name} in actor {self.actor_id} failed {failures} times "
                                     f"in a row: {type(err).__name__}: {first_line(err)} (at {last_frame(err)})",
                                     traceback.format_exc()) from err
                self._restart_envs()

    def _sample_once(self) -> Segment:
        steps, num_envs = self.config.ppo.segment_length, self.config.env.num_envs
        spec, action_spec = self.obs_spec, self.action_spec
        obs_buf = spec.empty((steps, num_envs))
        act_buf = np.empty((steps, num_envs, *action_spec.stored_shape), action_spec.stored_dtype)
        logp_buf, value_buf, reward_buf = (np.empty((steps, num_envs), np.float32) for _ in range(3))
        term_buf, trunc_buf = np.empty((steps, num_envs), bool), np.empty((steps, num_envs), bool)
        final_value_buf = np.zeros((steps, num_envs), np.float32)
        for transform in (self.normalize_obs, self.learning_reward):
            transform.start(steps, num_envs)
        self.episodes.start()
        memory = self._memory_at_start(steps, num_envs)
        start = time.perf_counter()
        last = spec.empty((num_envs,))  # the observation after the segment: the bootstrap's input
        nonfinite = self._encode(self.obs, obs_buf[0])
        obs = self.obs
        for t in range(steps):
            if memory is not None:
                memory["starts"][t] = self.agent.starts
            action, log_prob, value = self.agent.act(self.normalize_obs(obs_buf[t]))
            act_buf[t], logp_buf[t], value_buf[t] = action, log_prob, value
            next_obs, reward, terminated, truncated, info = self.envs.step(action_spec.to_env(action))
            encoded = obs_buf[t + 1] if t + 1 < steps else last
            nonfinite |= self._encode(next_obs, encoded)
            self.normalize_obs.record(t, encoded)
            reward = np.array(reward, np.float64)
            nonfinite |= scrub_nonfinite(reward)
            done = terminated | truncated
            self.episodes.step(reward)
            if self.life_loss is not None:
                terminated = self.life_loss(terminated, done, info)
            reward_buf[t], term_buf[t], trunc_buf[t] = self.learning_reward(t, reward), terminated, truncated
            cut = truncated & ~terminated
            if cut.any():  # a time limit, not a terminal state: bootstrap from V(final obs)
                final = spec.encode_rows(info["final_obs"], np.flatnonzero(cut))
                scrub_nonfinite(final.vector)
                final_value_buf[t, cut] = self.agent.value(self.normalize_obs(final), rows=np.flatnonzero(cut))
            if done.any():
                self.episodes.end_episodes(done)
                self.learning_reward.end_episodes(done)
                self.agent.end_episodes(done)
            obs = next_obs
        self.obs = obs
        last_values = self.agent.value(self.normalize_obs(last))
        return Segment(
            obs=obs_buf, actions=act_buf, log_probs=logp_buf, values=value_buf, rewards=reward_buf,
            terminated=term_buf, truncated=trunc_buf, final_values=final_value_buf,
            last_values=last_values.astype(np.float32),
            episode_returns=np.asarray(self.episodes.returns, np.float64),
            episode_lengths=np.asarray(self.episodes.lengths, np.int64),
            policy_version=self.agent.version, actor_id=self.actor_id,
            sample_seconds=time.perf_counter() - start,
            obs_stats=self.normalize_obs.summary(), return_stats=self.learning_reward.summary(),
            nonfinite=nonfinite, **(memory or {}),
        )

    def _memory_at_start(self, steps: int, num_envs: int) -> dict[str, np.ndarray] | None:
        """A recurrent policy's segment carries the memory it started from and where episodes start."""
        if not self.agent.recurrent:
            return None
        (h, c), _ = self.agent.memory_state(num_envs)
        return {"initial_memory": np.stack([h[0].numpy(), c[0].numpy()]), "starts": np.empty((steps, num_envs), bool)}

    def close(self) -> None:
        self.envs.close()
