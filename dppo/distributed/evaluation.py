"""Evaluation while training (``run.eval_every``): whole episodes with the current weights on an actor of its own.

Every ``run.eval_every`` iterations the driver hands the evaluation actor that iteration's broadcast (the weights
and the frozen observation statistics the actors sample with) and goes on training: it looks for the result with
``ray.wait(timeout=0)`` after each later iteration and never waits for it, and while one evaluation runs the next
due one is skipped. Episodes are the same loop as ``dppo eval`` (:func:`dppo.rl.episodes.run_episodes`), on the
training env with its wrappers, raw returns; every evaluation plays the same env seeds (run.seed + 1,000,003 on),
so evaluations compare with each other and with ``dppo eval --seed`` of the same seed. The run's end is the one
wait: it waits for the evaluation in flight, then evaluates the final weights (:meth:`Evaluation.finish`), so
summary.json holds the evaluation of what the final checkpoint saved. An env that raises is
reported once and evaluation stops; training goes on. The actor is a group of one on the shared lifecycle
(:class:`~dppo.distributed.lifecycle.ActorGroup`): a lost one is counted by cause and a new one started when the
next evaluation is due, never waited for and never spending the run's crash budget. An evaluation that has not
answered within its deadline (:mod:`dppo.distributed.deadlines`; a fresh actor's first is given
faults.actor_start_timeout_s more, for its start) is a hang: said, counted, the actor killed, a new one next time.
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray

from dppo.config import Config
from dppo.distributed.broadcast import Broadcast, PolicyBroadcasts
from dppo.distributed.deadlines import Hangs, Hung, SayHangs
from dppo.distributed.lifecycle import LOSS_WORDS, ActorGroup
from dppo.distributed.ray_calls import RayCalls, per_round
from dppo.envs.user_code import add_import_paths, driver_import_paths
from dppo.errors import first_line

EVAL_SEED_OFFSET = 1_000_003  # evaluation episodes' seeds: apart from every training actor's (dppo.rl.sampler)
FINISH_WAIT_S = 600.0  # at the run's end, the most an evaluation is waited for (a stop signal cuts it short)
WAIT_STEP_S = 0.2  # how often that wait looks for a stop signal


class EvaluationStopped(RuntimeError):
    """The evaluation actor's env raised: evaluation is off for the rest of the run (the message says why)."""


class Evaluator:
    """What runs in the evaluation actor's process: one env, one agent, the episode loop."""

    def __init__(self, config: Config, import_paths: list[str]) -> None:
        from dppo.envs.make import fixed_opponents, make_env
        from dppo.envs.selfplay import SelfPlayEnv
        from dppo.rl.agent import Agent
        from dppo.rl.transforms import ObsNormalizer

        warnings.filterwarnings("ignore", module="gymnasium")
        add_import_paths(import_paths)
        self.config = config
        seed = config.run.seed + EVAL_SEED_OFFSET
        if len(config.policy_names) > 1:  # a policy map: every policy plays its agents in one env copy
            from dppo.envs.make import make_parallel_envs
            from dppo.rl.episodes import JointPlayers

            self.players = JointPlayers(make_parallel_envs(config, copies=1), config, seed)
            return
        self.env = make_env(config.env)
        if isinstance(self.env.unwrapped, SelfPlayEnv) and config.selfplay.eval_opponent != "random":
            self.env.unwrapped.opponents = fixed_opponents(config.selfplay.eval_opponent, config.env,
                                                           self.env.action_space, seed)
        self.agent = Agent(self.env.observation_space, self.env.action_space, config.model, seed=seed)
        self.normalize = ObsNormalizer(False, config.env.obs_clip, self.agent.obs_spec.vector_dim)

    @per_round
    def evaluate(self, broadcast: Broadcast, episodes: int, seed: int) -> list[float]:
        from dppo.rl.episodes import run_episodes

        self.agent.load(broadcast.weights, broadcast.version)
        if broadcast.obs_stats is not None:  # the frozen statistics of this broadcast, as the actors use them
            self.normalize.enabled, self.normalize.stats = self.agent.obs_spec.vector_dim > 0, broadcast.obs_stats
        return run_episodes(self.agent, self.env, self.normalize, episodes, seed,
                            greedy=self.config.run.eval_mode == "greedy")

    @per_round
    def evaluate_policies(self, broadcasts: PolicyBroadcasts, episodes: int, seed: int
                          ) -> tuple[list[float], dict[str, list[float]]]:
        """A run of several policies: each episode's mean return over every agent, and each policy's agents'."""
        for name, broadcast in broadcasts.items():
            self.players.load(name, broadcast.weights, broadcast.version, broadcast.obs_stats)
        return self.players.episodes(episodes, seed, greedy=self.config.run.eval_mode == "greedy")


@dataclass
class EvalResult:
    """The returns of one evaluation and what was evaluated: the weights after ``iteration`` iterations."""

    iteration: int
    env_steps: int
    returns: list[float]
    broadcast: Broadcast | PolicyBroadcasts
    policy_returns: dict[str, list[float]] = field(default_factory=dict)  # several policies: each one's agents'

    @property
    def mean(self) -> float:
        return statistics.fmean(self.returns)

    def record(self) -> dict[str, Any]:
        """The progress.jsonl keys of this evaluation."""
        std = statistics.pstdev(self.returns) if len(self.returns) > 1 else 0.0
        return {"eval_return_mean": self.mean, "eval_return_std": std, "eval_episodes": len(self.returns),
                "eval_env_steps": self.env_steps,
                **{f"{name}/eval_return_mean": statistics.fmean(part) for name, part in self.policy_returns.items()}}


class Evaluation:
    """The driver's side: submit when due, collect when done, never block a training round."""

    def __init__(self, config: Config, calls: RayCalls | None = None, hangs: Hangs | None = None,
                 say: Callable[[str], None] = print) -> None:
        """``hangs``: the run's (default: printed, with a budget of their own); ``say``: the run's one-line messages
        (a lost evaluation actor)."""
        self.config = config
        self.say = say
        self.every = config.run.eval_every
        self.calls = calls or RayCalls(lambda index, seed: start_evaluator(config))
        self.group = ActorGroup(self.calls, lambda index, spawn: self.seed, ready_call=False)
        self.in_flight: tuple[ray.ObjectRef, int, int, Broadcast | PolicyBroadcasts] | None = None
        self.seed = config.run.seed + EVAL_SEED_OFFSET  # every evaluation plays the same episodes: comparable
        self.problem: str | None = None  # set when evaluation stopped: the one line that says why
        self.hangs = hangs or Hangs(config.faults, SayHangs(print), self.calls.now)
        self.deadline = self.hangs.deadline()  # an evaluation's, from the evaluations' durations so far
        self.sent_at, self.grace_s = 0.0, 0.0  # when the one in flight was sent; its extra time (a fresh actor's)

    @property
    def actor(self) -> ray.actor.ActorHandle | None:
        return self.group.slots[0].handle if self.group.slots else None

    @property
    def on(self) -> bool:
        return self.every > 0 and self.problem is None

    def submit(self, broadcast: Broadcast | PolicyBroadcasts | ray.ObjectRef, iteration: int, env_steps: int) -> None:
        """Start an evaluation of ``broadcast`` (the weights after ``iteration`` iterations) if one is due and none
        is running."""
        if not self.on or iteration == 0 or iteration % self.every or self.in_flight is not None:
            return
        self._start(broadcast, iteration, env_steps)

    def _start(self, broadcast: Broadcast | PolicyBroadcasts | ray.ObjectRef, iteration: int, env_steps: int) -> None:
        self.grace_s = 0.0
        if not self.group.slots:
            self.group.start(1)
            self.grace_s = self.config.faults.actor_start_timeout_s  # its first call waits for its start
        if isinstance(broadcast, ray.ObjectRef):
            broadcast = self.calls.get(broadcast)
        method = self.actor.evaluate_policies if isinstance(broadcast, dict) else self.actor.evaluate
        ref = method.remote(broadcast, self.config.run.eval_episodes, self.seed)
        self.in_flight = (ref, iteration, env_steps, broadcast)
        self.sent_at = self.calls.now()

    def collect(self, timeout_s: float = 0.0) -> EvalResult | None:
        """The running evaluation's result if it is done (waiting at most ``timeout_s``), else None; raises
        EvaluationStopped once if it failed."""
        if self.in_flight is None:
            return None
        ref, iteration, env_steps, broadcast = self.in_flight
        if not self.calls.wait([ref], 1, timeout_s):
            waited = self.calls.now() - self.sent_at
            if waited > self.deadline.seconds + self.grace_s:
                self.hangs.declare("evaluation", "the evaluation actor",
                                   f"evaluating the weights at {env_steps:,} env steps", waited, self.deadline)
                self.in_flight = None
                self.group.lose(0, Hung(f"no answer in {waited:.1f} s"), hung=True)
                self.group.slots = []  # a new one when the next evaluation is due
            return None
        self.in_flight = None
        if not self.grace_s:  # a fresh actor's first evaluation includes its start
            self.deadline.observe(self.calls.now() - self.sent_at)
        try:
            returns = self.calls.get(ref)
            if isinstance(broadcast, dict):  # several policies: (every agent's, each policy's)
                return EvalResult(iteration, env_steps, returns[0], broadcast, returns[1])
            return EvalResult(iteration, env_steps, returns, broadcast)
        except ray.exceptions.RayActorError as err:  # the actor's process or node went away: a new one next time
            loss = self.group.lose(0, err)
            self.group.slots = []
            self.say(f"the evaluation actor {LOSS_WORDS[loss.cause]} while evaluating the weights at {env_steps:,} "
                     f"env steps ({type(err).__name__}: {first_line(err)}); a new one when the next evaluation is due")
            return None
        except ray.exceptions.RayError as err:
            cause = getattr(err, "cause", None) or err
            self.problem = (f"evaluation stopped: env {self.config.env.name} raised in the evaluation actor: "
                            f"{type(cause).__name__}: {first_line(cause)}; training goes on")
            raise EvaluationStopped(self.problem) from None

    def wait(self, stopped: Callable[[], bool], timeout_s: float = FINISH_WAIT_S) -> EvalResult | None:
        """The running evaluation's result, waited for up to ``timeout_s`` unless ``stopped()`` (a stop signal);
        None when none runs, or it did not finish, or its actor was lost."""
        deadline = time.monotonic() + timeout_s
        for _ in range(int(timeout_s / WAIT_STEP_S) + 1):
            left = deadline - time.monotonic()
            if self.in_flight is None or stopped() or left <= 0:
                return None
            result = self.collect(min(WAIT_STEP_S, left))
            if result is not None:
                return result
        return None

    def finish(self, broadcast: Broadcast | PolicyBroadcasts, iteration: int, env_steps: int,
               stopped: Callable[[], bool]) -> list[EvalResult]:
        """The run's end: the evaluation in flight (of earlier weights) waited for, then one of the final weights
        ``broadcast`` (after ``iteration`` iterations), whatever eval_every says; their results, in order. A stop
        signal or FINISH_WAIT_S ends the waiting (``in_flight`` then holds what did not finish); an env that raises,
        EvaluationStopped."""
        if self.every == 0 or iteration == 0:
            return []
        results = [result for result in [self.wait(stopped)] if result is not None]
        if self.in_flight is None and self.on and not stopped():
            self._start(broadcast, iteration, env_steps)
            results += [result for result in [self.wait(stopped)] if result is not None]
        return results

    def shutdown(self) -> None:
        self.group.shutdown()


def start_evaluator(config: Config) -> ray.actor.ActorHandle:
    """The evaluation actor, with its CPUs; Ray never restarts it (a lost one is replaced when the next is due)."""
    remote = ray.remote(Evaluator).options(num_cpus=config.run.eval_cpus, max_restarts=0)
    return remote.remote(config, driver_import_paths())
