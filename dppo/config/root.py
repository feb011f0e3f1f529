"""Config: the whole run, its sections, the rules that span sections, and the values derived from them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import yaml
from pydantic import Field, model_validator

from dppo.config.base import Section
from dppo.config.env import GLOBAL_STATE_KEY, EnvConfig
from dppo.config.policies import DEFAULT_POLICY, POLICIES_EXAMPLE, check_policies
from dppo.config.ppo import ModelConfig, PPOConfig
from dppo.config.run import FaultConfig, MetricsConfig, RunConfig
from dppo.config.selfplay import SelfPlayConfig


@dataclass(frozen=True)
class Placement:
    """Where an actor's policy computes its forward passes, and how the actor steps its env copies for it: one value,
    derived once from the resolved config (:attr:`Config.placement`), that the actor builds its Sampler with.
    ``where``: on the actor's thread, on a worker thread of the actor (two halves, or a GPU share: ``device`` cuda),
    or in the inference service; ``groups``: 1, or 2 halves stepped in turn while the other's actions are computed."""

    where: Literal["actor", "worker_thread", "service"]
    device: Literal["cpu", "cuda"] = "cpu"
    groups: int = 1


class Config(Section):
    """A whole run: env, model, PPO hyperparameters, run control, metrics, fault handling and self-play."""

    env: EnvConfig = Field(default_factory=EnvConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    ppo: PPOConfig = Field(default_factory=PPOConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    faults: FaultConfig = Field(default_factory=FaultConfig)
    selfplay: SelfPlayConfig = Field(default_factory=SelfPlayConfig)
    policies: dict[str, list[str]] = Field(default_factory=dict)
    """A multi-agent env's policy map: policy name -> the agent-name patterns it acts for (shell-style, e.g.
    {adversary: ['adversary_*'], agent: ['agent_*']}); every agent matches exactly one policy, and each policy has its
    own network, optimizer, checkpoint entry, export and metrics (its agents may have spaces other policies'
    do not). Empty: one policy, shared by every agent."""

    @model_validator(mode="after")
    def _policy_map(self) -> Config:
        if not self.policies:
            return self
        check_policies(self.policies)
        if not self.env.may_be_multiagent:
            raise ValueError(f"policies maps the agents of a multi-agent env to policies, and env {self.env.name!r} "
                             "is a single-agent gymnasium env; drop policies, or name a PettingZoo env "
                             f"(env.multiagent), e.g. {POLICIES_EXAMPLE}")
        if self.run.inference == "server" and len(self.policies) > 1:
            raise ValueError(f"run.inference=server serves one policy, and policies names {len(self.policies)}; set "
                             "run.inference=actor")
        return self

    @model_validator(mode="after")
    def _centralized_critic(self) -> Config:
        """env.global_state adds the key global_state that only the critic sees (unless another key is named)."""
        if self.env.global_state and self.model.value_only_key is None:
            self.model.value_only_key = GLOBAL_STATE_KEY
        if self.model.value_only_key is not None and self.model.recurrent == "lstm":
            raise ValueError("model.value_only_key (a centralized critic, env.global_state) works with feed-forward "
                             "models; set model.recurrent: none or drop the critic-only key")
        return self

    @model_validator(mode="after")
    def _own_network(self) -> Config:
        """A network of one's own (model.entry_point) is feed-forward and sees the whole observation."""
        if self.model.entry_point is None:
            return self
        if self.model.recurrent == "lstm":
            raise ValueError(f"model.entry_point {self.model.entry_point!r} is a feed-forward network of one's own and "
                             "model.recurrent: lstm adds the built-in LSTM; set model.recurrent: none (a recurrent "
                             "network of one's own is not supported)")
        if self.model.value_only_key is not None:
            raise ValueError(f"model.value_only_key {self.model.value_only_key!r} (a centralized critic) splits the "
                             f"built-in network's input, and model.entry_point {self.model.entry_point!r} gets the "
                             "whole observation; drop one (set env.global_state: false)")
        return self

    @model_validator(mode="after")
    def _one_batch_rule(self) -> Config:
        if self.ppo.minibatch_size is not None and self.ppo.num_minibatches is not None:
            raise ValueError(f"ppo.minibatch_size {self.ppo.minibatch_size} and ppo.num_minibatches "
                             f"{self.ppo.num_minibatches} are both set; keep one (a size, or a count per epoch), "
                             "e.g. --set ppo.minibatch_size=null to use the count")
        return self

    @model_validator(mode="after")
    def _minibatch_splits(self) -> Config:
        if self.ppo.minibatch_size is not None and self.ppo.minibatch_size % self.run.learners:
            raise ValueError(f"ppo.minibatch_size {self.ppo.minibatch_size} does not split evenly over run.learners "
                             f"{self.run.learners}; make it a multiple of run.learners")
        return self

    @model_validator(mode="after")
    def _whole_columns(self) -> Config:
        columns = self.ppo.segment_length * self.run.learners
        if self.model.recurrent == "lstm" and self.ppo.minibatch_size is not None and self.ppo.minibatch_size % columns:
            raise ValueError(
                f"ppo.minibatch_size {self.ppo.minibatch_size} is not a whole number of env columns for "
                f"model.recurrent: lstm (the update replays each env's {self.ppo.segment_length} steps in order); "
                f"make it a multiple of ppo.segment_length x run.learners = {columns}, or set ppo.num_minibatches")
        return self

    @model_validator(mode="after")
    def _minibatches_fill(self) -> Config:
        count = self.ppo.num_minibatches
        if count is not None and self.batch_known and self.minibatch_size == 0:
            unit = (f"one env column ({self.ppo.segment_length} steps) per learner" if self.model.recurrent == "lstm"
                    else "one sample per learner")
            raise ValueError(f"ppo.num_minibatches {count} leaves less than {unit} in a minibatch of the batch of "
                             f"{self.batch_size} samples; lower ppo.num_minibatches or raise run.actors, env.num_envs "
                             "or ppo.segment_length")
        return self

    @model_validator(mode="after")
    def _evaluation_for_target(self) -> Config:
        if self.run.target_on == "evaluation" and not self.run.eval_every:
            raise ValueError("run.target_on: evaluation judges run.target_return on evaluation returns, and "
                             "run.eval_every is 0 (off); set run.eval_every (e.g. 5) or run.target_on: training")
        return self

    @model_validator(mode="after")
    def _floor_fits(self) -> Config:
        if self.faults.min_actors > self.run.actors:
            raise ValueError(f"faults.min_actors {self.faults.min_actors} exceeds run.actors {self.run.actors}; "
                             "lower faults.min_actors or raise run.actors")
        return self

    @model_validator(mode="after")
    def _actor_policy(self) -> Config:
        """run.actor_halves=2 and run.actor_gpus run one policy in the actor (dppo.rl.worker_thread)."""
        run, num_envs = self.run, self.env.num_envs
        if run.actor_gpus > 1 and not run.actor_gpus.is_integer():
            raise ValueError(f"run.actor_gpus above 1 must be a whole number of GPUs (Ray's rule), not "
                             f"{run.actor_gpus:g}; use a share below 1 or {int(run.actor_gpus)}")
        if run.inference == "server" and (run.actor_gpus > 0 or run.actor_halves == 2):
            raise ValueError("run.actor_gpus and run.actor_halves set how the actors run their own policy, and "
                             "run.inference=server computes it in the inference service; set run.inference=actor "
                             "or drop them")
        if run.actor_halves == 2 and num_envs % 2:
            raise ValueError(f"run.actor_halves=2 steps each actor's envs in two halves, so env.num_envs must be "
                             f"even, not {num_envs}; set env.num_envs={num_envs + 1} or run.actor_halves=1")
        if (run.actor_halves == 2 or run.actor_gpus > 0) and len(self.policies) > 1:
            raise ValueError(f"run.actor_halves=2 and run.actor_gpus run one policy in each actor, and policies "
                             f"names {len(self.policies)}; drop them or map every agent to one policy")
        return self

    @model_validator(mode="after")
    def _minibatch_fits(self) -> Config:
        if self.ppo.minibatch_size is not None and self.batch_known and self.ppo.minibatch_size > self.batch_size:
            raise ValueError(
                f"ppo.minibatch_size {self.ppo.minibatch_size} exceeds the batch of {self.batch_size} samples "
                f"(run.actors {self.run.actors} x env.num_envs {self.env.num_envs}"
                + (f" x {self.env.columns_per_copy} agents" if (self.env.columns_per_copy or 1) > 1 else "")
                + f" x ppo.segment_length {self.ppo.segment_length}); lower ppo.minibatch_size or raise one of those"
            )
        return self

    @property
    def placement(self) -> Placement:
        """The actors' :class:`Placement`, from run.inference as the driver resolved it (``auto`` reads as actor
        until then), run.actor_halves and run.actor_gpus; the service steps even copies in two halves."""
        run = self.run
        if run.inference == "server":
            return Placement("service", groups=2 if self.env.num_envs % 2 == 0 else 1)
        if run.actor_halves == 2 or run.actor_gpus > 0:
            return Placement("worker_thread", "cuda" if run.actor_gpus > 0 else "cpu", run.actor_halves)
        return Placement("actor")

    @property
    def policy_names(self) -> list[str]:
        """The run's policies in map order: those of ``policies``, else the one shared policy."""
        return list(self.policies) or [DEFAULT_POLICY]

    @property
    def columns(self) -> int:
        """Columns of each actor's vector env: env.num_envs copies x env.columns_per_copy (agents)."""
        return self.env.num_envs * (self.env.columns_per_copy or 1)

    @property
    def batch_known(self) -> bool:
        """The batch's size is known: a multi-agent env's agents per copy are found when the run starts."""
        return not self.env.multiagent or self.env.columns_per_copy is not None

    @property
    def steps_per_iteration(self) -> int:
        """Env steps (agent steps for many agents) gathered per iteration: N x E x agents x T."""
        return self.run.actors * self.columns * self.ppo.segment_length

    @property
    def batch_size(self) -> int:
        """Samples per update (same as steps per iteration)."""
        return self.steps_per_iteration

    @property
    def sampling_unit(self) -> int:
        """Rows a minibatch is made of whole numbers of: one sample per learner; recurrent, one env column (T steps)
        per learner, so each replays its steps in order."""
        return (self.ppo.segment_length if self.model.recurrent == "lstm" else 1) * self.run.learners

    @property
    def minibatch_size(self) -> int:
        """Samples per SGD step: ppo.minibatch_size, or the batch divided by ppo.num_minibatches rounded down to whole
        sampling units (0 when the count leaves less than one unit: the validator names it)."""
        return self.ppo.minibatch_rows(self.batch_size, self.sampling_unit)

    @property
    def num_iterations(self) -> int:
        """Iterations that total_steps allows (the learning-rate schedule spans these)."""
        return max(1, math.ceil(self.run.total_steps / self.steps_per_iteration))

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)
