"""Sampler: steps a gymnasium vector env exactly T steps per call and returns a Segment.

The env state persists across calls. The vector env runs in gymnasium's ``SAME_STEP`` autoreset mode (the last
observation of an episode in ``info["final_obs"]``), so every stored transition belongs to one episode and a
time-limit cut is bootstrapped from V(final obs). What is done to observations and rewards lives in
:mod:`dppo.rl.transforms`.
"""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Callable, Generator, Iterator
from typing import Any

import numpy as np
from gymnasium.vector import VectorEnv

from dppo.config import Config
from dppo.config.policies import DEFAULT_POLICY
from dppo.envs.api import old_step_error
from dppo.envs.checks import old_api_error
from dppo.envs.failures import EnvFailure, describe, failed_envs, failure_info, fresh_copy
from dppo.envs.make import make_vector_env
from dppo.errors import UsageError
from dppo.rl.actions import NoLegalAction
from dppo.rl.agent import Agent, Weights
from dppo.rl.env_info import EndedInfo
from dppo.rl.normalizer import RunningStats
from dppo.rl.policy import BackendPolicy, InferenceLost
from dppo.rl.segment import Segment
from dppo.rl.spaces import Obs
from dppo.rl.transforms import EpisodeStats, LearningReward, LifeLoss, ObsNormalizer, scrub_nonfinite
from dppo.rl.worker_thread import own_policy


def agent_cut(info: dict[str, Any], width: int) -> np.ndarray:
    """Many agents: the columns whose agent reached its own time limit while its env copy goes on
    (:mod:`dppo.envs.columns`): a time-limit cut for learning; the column's episode goes on with its copy's."""
    cut = info.get("agent_truncated")
    return np.zeros(width, bool) if cut is None else np.asarray(cut, bool)


def actor_seed(run_seed: int, actor: int, spawn: int = 0) -> int:
    """The seed of an actor's envs and action sampling: distinct per actor slot and per spawn of the run (a
    replacement does not replay its predecessor's episodes)."""
    return run_seed + 10_000 * actor + 7_919 * spawn


@contextlib.contextmanager
def env_faults_named(config: Config) -> Iterator[None]:
    """A fault of the env that no retry mends, raised where actions are drawn, as one EnvFailure naming the env: an
    action mask that allows nothing (the old gym API is named where the env steps, :meth:`Sampler._step`)."""
    try:
        yield
    except NoLegalAction as err:
        raise EnvFailure(f"env {config.env.name} returned an action mask that allows no action ({err}); every "
                         "observation must allow at least one", traceback.format_exc()) from err


class Sampler:
    """Env + policy + transforms of one actor, and the one owner of its per-step path (plain Python: no Ray).

    Its env copies are grouped once (``config.placement.groups``): two halves are two vector envs of E/2 copies, seeded
    as one of E would be, stepped in turn so one steps while the policy's backend computes the other's actions. It
    holds the tickets of the requests in flight and cancels them when a segment is abandoned. Its rows are the
    columns its vector envs report (one per agent of a multi-agent copy). Env faults cost a step, not the segment: a
    copy that raises is recreated alone by its vector env, one that raises out of ``step`` is made afresh
    (:meth:`_step`).

    ``policy``: what acts (default: the actor's own networks on its thread, seeded like the actor); ``make_envs``:
    what makes each half's vector env (self-play's opponents come with it: :mod:`dppo.rl.opponents`);
    ``policy_name``: the policy map's policy it acts for. A joint sampler (:mod:`dppo.rl.joint`) steps one env for
    several samplers via :meth:`steps`.
    """

    def __init__(self, config: Config, actor_id: int = 0, seed: int | None = None,
                 policy: BackendPolicy | None = None, make_envs: Callable[[Config], VectorEnv] = make_vector_env,
                 policy_name: str = DEFAULT_POLICY) -> None:
        self.config = config
        self.actor_id = actor_id
        self.make_envs, self.policy_name = make_envs, policy_name
        self.seed = actor_seed(config.run.seed, actor_id) if seed is None else seed
        self.env_resets = 0
        copies, groups = config.env.num_envs, config.placement.groups
        self.copies = [range(h * copies // groups, (h + 1) * copies // groups) for h in range(groups)]
        self.rows: list[slice] = []  # each half's columns, set when its vector env is made
        self.half_envs = self._start_envs()
        self.failures_in_row = [0] * groups  # each half's steps in a row that raised out of its vector env
        self.in_flight: dict[int, Any] = {}  # half -> the policy's ticket for its next actions
        envs, env = self.half_envs[0], config.env
        self.policy: BackendPolicy = policy or own_policy(envs.single_observation_space, envs.single_action_space,
                                                          config.model, self.seed, self.num_columns)
        self.obs_spec, self.action_spec = self.policy.obs_spec, self.policy.action_spec
        self.normalize_obs = ObsNormalizer(env.normalize_obs, env.obs_clip, self.obs_spec.vector_dim)
        self.learning_reward = LearningReward(env.clip_reward, env.normalize_reward, self.num_columns,
                                              config.ppo.gamma, env.reward_clip)
        self.episodes = EpisodeStats(self.num_columns)
        self.env_info = EndedInfo(config.metrics.info_keys, env.name)

    @property
    def num_columns(self) -> int:
        """Columns of this sampler's vector envs: env copies x agents (one per copy of a gymnasium env)."""
        return self.rows[-1].stop

    @property
    def agent(self) -> Agent:
        """The networks of a policy in this process (tests and tools read its model)."""
        agent = getattr(self.policy.backend, "agent", None)
        assert isinstance(agent, Agent), "this sampler's policy is computed elsewhere"
        return agent

    @property
    def envs(self) -> VectorEnv:
        """The vector env of a one-half sampler (the local policy's)."""
        return self.half_envs[0]

    @property
    def obs(self) -> object:
        """The latest raw observations of a one-half sampler."""
        return self.half_obs[0]

    def _start_envs(self) -> list[VectorEnv]:
        half_envs, self.half_obs, self.half_active, lives, self.rows = [], [], [], [], []
        for h in range(len(self.copies)):
            try:
                envs = self._make_half(h)
                obs, info = self._reset_half(h, envs)
            except Exception:
                for made in half_envs:
                    with contextlib.suppress(Exception):
                        made.close(terminate=True)  # an async vector env's half-done reset cannot be waited for
                raise
            start = self.rows[-1].stop if self.rows else 0
            self.rows.append(slice(start, start + envs.num_envs))
            half_envs.append(envs)
            self.half_obs.append(obs)
            self.half_active.append(info.get("active"))
            lives.append(info.get("lives"))
        self.life_loss = self._life_loss(lives)
        return half_envs

    def _life_loss(self, lives: list[Any]) -> LifeLoss | None:
        """The life-loss transform (env.terminal_on_life_loss) over the lives each half's reset reported."""
        if not self.config.env.terminal_on_life_loss:
            return None
        if any(part is None for part in lives):
            raise UsageError(f"env.terminal_on_life_loss needs an env that reports info['lives'] (Atari); "
                             f"{self.config.env.name} does not: set it to false")
        return LifeLoss(np.concatenate([np.asarray(part) for part in lives]))

    def _make_half(self, h: int) -> VectorEnv:
        """Half h's vector env, of its share of the copies."""
        copies, config = self.copies[h], self.config
        if len(self.copies) > 1:
            config = config.model_copy(update={"env": config.env.model_copy(update={"num_envs": len(copies)})})
        return self.make_envs(config)

    def _reset_half(self, h: int, envs: VectorEnv) -> tuple[Any, dict[str, Any]]:
        """Half h's vector env reset, seeded for this start of the sampler's envs (a failed one closed)."""
        seed = self.seed + 1_000 * self.env_resets + self.copies[h].start
        try:
            obs, info = envs.reset(seed=seed)
        except Exception:
            old = old_api_error(self.config.env, seed)  # gymnasium's unpack error does not say why
            with contextlib.suppress(Exception):
                envs.close(terminate=True)
            if old is None:
                raise
            raise old from None
        envs.action_space.seed(seed)
        return obs, info

    def restart_envs(self) -> None:
        """Every vector env afresh, differently seeded, episodes restarted (the segment they were in is lost): each
        half made again by :func:`fresh_copy`, as one that raised mid-segment is (its reset retried)."""
        self.env_resets += 1
        lives = []
        for h in range(len(self.half_envs)):
            self.half_envs[h], (self.half_obs[h], info) = self._afresh(h, retry_only=True)
            self.half_active[h] = info.get("active")
            lives.append(info.get("lives"))
        self.life_loss = self._life_loss(lives)
        self.learning_reward.end_episodes(np.ones(self.num_columns, bool))
        self.policy.end_episodes(np.ones(self.num_columns, bool))
        self.episodes.reset()

    def _afresh(self, h: int, cause: str | None = None, retry_only: bool = False) -> tuple[VectorEnv, tuple]:
        """Half h's vector env closed and made afresh, reset (:func:`fresh_copy`: retried on another, each try with
        its own seed; ``retry_only``: the first try keeps the seed the caller set)."""
        tries = 0

        def make() -> VectorEnv:
            nonlocal tries
            if tries or not retry_only:
                self.env_resets += 1
            tries += 1
            return self._make_half(h)

        return fresh_copy(make, lambda envs: self._reset_half(h, envs), self.config.env.name,
                          self.config.faults.env_retries, self.half_envs[h], cause=cause)

    def _step(self, h: int, actions: Any) -> tuple:
        """Step half h's vector env. One that raises out of ``step`` (ale-py's cannot recreate a copy alone) is made
        afresh, and this step is every copy's episode cut by a failure (truncated, reward 0, the last observation as
        the final one); faults.env_retries such steps in a row are an EnvFailure."""
        try:
            result = self.half_envs[h].step(actions)
        except EnvFailure:  # a copy that never got through a reset: its own retries are spent
            raise
        except Exception as err:
            old = old_step_error(err, self.config.env.name)
            if old is not None:  # the env's API, not a passing fault: no retry helps
                raise EnvFailure(str(old), traceback.format_exc()) from err
            self.failures_in_row[h] += 1
            if self.failures_in_row[h] > self.config.faults.env_retries:
                raise EnvFailure(f"env {self.config.env.name} failed {self.failures_in_row[h]} times in a row: "
                                 f"{describe(err)}", traceback.format_exc()) from err
            return self._recreate_half(h, describe(err), traceback.format_exc())
        self.failures_in_row[h] = 0
        return result

    def _recreate_half(self, h: int, line: str, details: str) -> tuple:
        """Half h's vector env made afresh (:meth:`_afresh`); the step that raised cuts every copy's episode."""
        self.half_envs[h], (obs, info) = self._afresh(h, cause=line)
        cut = np.ones(self.rows[h].stop - self.rows[h].start, bool)  # every copy's episode
        info = {**info, **failure_info(cut, line, details), "final_obs": self.half_obs[h], "_final_obs": cut}
        return obs, np.zeros(len(cut)), np.zeros(len(cut), bool), cut, info

    def set_weights(self, weights: Weights, version: int, obs_stats: RunningStats | None = None,
                    return_stats: RunningStats | None = None) -> None:
        """Load broadcast weights and the merged normalizer statistics every actor shares."""
        self.policy.load(weights, version)
        if obs_stats is not None:
            self.normalize_obs.stats = obs_stats
        if return_stats is not None:
            self.learning_reward.stats = return_stats

    def _encode(self, obs: object, out: Obs) -> bool:
        """Encode raw env observations into ``out``; True when NaN/Inf had to be scrubbed."""
        self.obs_spec.encode(obs, out=out)
        return scrub_nonfinite(out.vector)

    def sample(self) -> Segment:
        """Exactly T steps of every env; env faults cost a step (:meth:`_step`); a segment lost with the inference
        service leaves the envs restarted (they stepped past what the segment kept)."""
        loop = self.steps()
        try:
            with env_faults_named(self.config):
                half, actions = next(loop)
                while True:
                    half, actions = loop.send(self._step(half, actions))
        except StopIteration as end:
            return end.value
        except InferenceLost:
            self.restart_envs()
            raise
        finally:
            loop.close()  # an abandoned segment's requests in flight are cancelled

    def steps(self) -> Generator[tuple[int, Any], tuple, Segment]:
        """The step loop of one segment: it yields (half, that half's env actions) and is sent what that half's
        ``step`` returned, so whoever holds the env steps it (this sampler, or a joint sampler). It returns the
        segment; closed early (the segment abandoned), it cancels the requests in flight."""
        try:
            return (yield from self._step_loop())
        finally:
            for h in list(self.in_flight):
                self.policy.cancel(self.in_flight.pop(h))

    def _step_loop(self) -> Generator[tuple[int, Any], tuple, Segment]:
        steps, num_envs = self.config.ppo.segment_length, self.num_columns
        spec, action_spec, policy = self.obs_spec, self.action_spec, self.policy
        obs_buf = spec.empty((steps, num_envs))
        act_buf = np.empty((steps, num_envs, *action_spec.stored_shape), action_spec.stored_dtype)
        logp_buf, value_buf, reward_buf = (np.empty((steps, num_envs), np.float32) for _ in range(3))
        term_buf, trunc_buf = np.empty((steps, num_envs), bool), np.empty((steps, num_envs), bool)
        final_value_buf = np.zeros((steps, num_envs), np.float32)
        active_buf = np.ones((steps + 1, num_envs), bool)  # obs_t is a live agent's (multi-agent: not padding)
        for rows, active in zip(self.rows, self.half_active, strict=True):
            if active is not None:
                active_buf[0, rows] = active
        for transform in (self.normalize_obs, self.learning_reward):
            transform.start(steps, num_envs)
        self.episodes.start()
        self.env_info.start()
        initial = self.policy.memory_at_start(num_envs)  # a recurrent policy's segment carries where it started
        memory = None if initial is None else {"initial_memory": initial, "starts": np.empty((steps, num_envs), bool)}
        clock = time.perf_counter
        start = clock()
        env_s = policy_s = 0.0  # seconds in the envs' step and in the policy's result/value (never overlapping)
        last = spec.empty((num_envs,))  # the observation after the segment: the bootstrap's input
        nonfinite = False
        for rows, obs in zip(self.rows, self.half_obs, strict=True):
            nonfinite |= self._encode(obs, obs_buf[0][rows])
        self.normalize_obs(obs_buf[0])
        for h, rows in enumerate(self.rows):
            self._submit(h, obs_buf[0][rows], memory, 0)
        for t in range(steps):
            encoded = obs_buf[t + 1] if t + 1 < steps else last
            stepped = []
            for h, rows in enumerate(self.rows):  # with two halves, one steps while the other's actions are made
                asked = clock()
                action, log_prob, value = policy.result(self.in_flight.pop(h))
                act_buf[t, rows], logp_buf[t, rows], value_buf[t, rows] = action, log_prob, value
                acted = clock()
                next_obs, reward, terminated, truncated, info = yield h, action_spec.to_env(action)
                stepped_at = clock()
                policy_s += acted - asked
                env_s += stepped_at - acted
                nonfinite |= self._encode(next_obs, encoded[rows])
                cut = (truncated | agent_cut(info, len(terminated))) & ~terminated
                if cut.any():  # a time limit, not a terminal state: bootstrap from V(final obs)
                    final = spec.encode_rows(info["final_obs"], np.flatnonzero(cut))
                    scrub_nonfinite(final.vector)
                    final = self.normalize_obs(final)
                    asked = clock()
                    final_value_buf[t, rows][cut] = policy.value(final, rows=np.flatnonzero(cut) + rows.start)
                    policy_s += clock() - asked
                done = np.zeros(num_envs, bool)
                done[rows] = terminated | truncated
                if done.any():
                    policy.end_episodes(done)
                self.half_obs[h] = next_obs
                self.half_active[h] = active = info.get("active")
                if active is not None:
                    active_buf[t + 1, rows] = active
                if t + 1 < steps and h + 1 < len(self.rows):  # ask now, while the next half steps
                    self._submit(h, self.normalize_obs(encoded[rows].map(np.copy)), memory, t + 1)
                stepped.append((reward, terminated, truncated, info))
            self.normalize_obs.record(t, encoded)
            if t + 1 < steps:
                self.normalize_obs(encoded)
                self._submit(len(self.rows) - 1, encoded[self.rows[-1]], memory, t + 1)
            nonfinite |= self._account(t, stepped, reward_buf, term_buf, trunc_buf)
        last = self.normalize_obs(last)
        asked = clock()
        last_values = policy.value(last)
        ended = clock()
        padded = None if active_buf.all() else active_buf  # many agents, some of whom left: their steps are padding
        return Segment(
            obs=obs_buf, actions=act_buf, log_probs=logp_buf, values=value_buf, rewards=reward_buf,
            terminated=term_buf, truncated=trunc_buf, final_values=final_value_buf,
            last_values=last_values.astype(np.float32),
            episode_returns=np.asarray(self.episodes.returns, np.float64),
            episode_lengths=np.asarray(self.episodes.lengths, np.int64),
            policy_version=policy.version, actor_id=self.actor_id, policy_name=self.policy_name,
            sample_seconds=ended - start, env_seconds=env_s, policy_seconds=policy_s + ended - asked,
            obs_stats=self.normalize_obs.summary(None if padded is None else padded[1:]),
            return_stats=self.learning_reward.summary(None if padded is None else padded[:-1]),
            nonfinite=nonfinite, **(memory or {}),
            active=padded, env_failures=self.episodes.take_failures(), env_info=self.env_info.take(),
        )

    def _submit(self, h: int, obs: Obs, memory: dict[str, np.ndarray] | None, t: int) -> None:
        """Ask for step t's actions of half h (normalized observations; a recurrent policy's starts recorded)."""
        rows = self.rows[h]
        if memory is not None:
            memory["starts"][t, rows] = self.policy.starts[rows]
        self.in_flight[h] = self.policy.submit(obs, rows)

    def _account(self, t: int, stepped: list[tuple], reward_buf: np.ndarray, term_buf: np.ndarray,
                 trunc_buf: np.ndarray) -> bool:
        """Step t's rewards and ends of every env into the segment and the transforms; True on NaN/Inf rewards."""
        reward = np.concatenate([np.array(part[0], np.float64) for part in stepped])
        terminated = np.concatenate([part[1] for part in stepped])
        truncated = np.concatenate([part[2] for part in stepped])
        own_cut = np.concatenate([agent_cut(part[3], len(part[1])) for part in stepped])
        failed, failures = failed_envs([part[3] for part in stepped], [len(part[1]) for part in stepped])
        nonfinite = scrub_nonfinite(reward)
        done = terminated | truncated
        self.episodes.step(reward)
        if self.life_loss is not None:
            lives = np.concatenate([np.asarray(part[3]["lives"]) for part in stepped])
            terminated = self.life_loss(terminated, done, {"lives": lives})
        reward_buf[t], term_buf[t], trunc_buf[t] = self.learning_reward(t, reward), terminated, truncated | own_cut
        if done.any():
            self.episodes.end_episodes(done, failed, failures)
            self.learning_reward.end_episodes(done)
            start = 0
            for part in stepped:  # each half's info: the ended episodes' own figures (an env failure's cut excluded)
                width = len(part[1])
                self.env_info.add(part[3], (done & ~failed)[start:start + width])
                start += width
        return nonfinite

    def close(self) -> None:
        for envs in self.half_envs:
            envs.close()
