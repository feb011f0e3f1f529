"""The peer of `python -m benchmarks peer`: RLlib's multi-agent PPO (its new API stack) on a PettingZoo Parallel env,
one policy shared by every agent, configured to mirror a dppo run (the spec below, which the benchmark derives from
dppo's config).

Runs in the peer's own venv (``python benchmarks/peer_rllib.py --spec JSON``), as a user of RLlib would run it, so
it imports nothing of dppo. Each iteration prints one machine-readable line, ``dppo-peer {json}``, with the
agent steps, the epoch time, the mean per-agent episode return and the PPO diagnostics; ``--check`` prints the
versions and exits.

What makes the comparison fair (dppo's side in brackets):
- steps: RLlib counts env steps (one step of every agent); each agent's step is one agent step [a column of
  dppo's vector env]. The batch is ``runners x copies x segment_length`` env steps, i.e. the same agent steps
  as dppo's ``actors x num_envs x segment_length``;
- return: per agent, the mean over the last ``window`` finished agent episodes [the last 100], counted here from
  the episodes each env runner returns (RLlib's own episode_return_mean sums the agents and averages only the
  episodes of the latest iteration);
- the agent's index one-hot in its observation [env.agent_id_in_obs];
- PPO: the same batch, epochs, minibatch, learning rate (annealed linearly to 0 over the budget), gamma, lambda,
  clip, value and entropy coefficients (RLlib's value loss is the squared error, dppo's half of it, so
  vf_loss_coeff is half of dppo's ppo.value_coef), global grad-norm clip, separate policy and value MLPs of the
  same widths and activation; RLlib's KL penalty off and its value-loss clip off [dppo has neither];
- CPUs: one env runner per dppo actor (one CPU each), the learner in the driver with one torch thread.
Not matched: RLlib's weight init, Adam eps, advantages normalized per batch, and its time-limit handling in
multi-agent episodes (see bootstrap_truncation; ``patch_truncation`` turns it into dppo's).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math
import os
import sys
import time
from collections import deque
from typing import Any

PREFIX = "dppo-peer "  # every machine-readable line starts with it; RLlib's own output is left as it is


@dataclasses.dataclass
class Spec:
    """One run of the peer; the defaults are examples/simple-spread.yaml's."""

    env: str = "mpe2.simple_spread_v3"  # a PettingZoo env module with parallel_env(**kwargs)
    env_kwargs: dict[str, Any] = dataclasses.field(
        default_factory=lambda: {"N": 3, "max_cycles": 25, "continuous_actions": False})
    agent_id_in_obs: bool = True
    seed: int = 1
    agent_steps: int = 300_000  # the budget, in agent steps
    runners: int = 2  # env runners (dppo's actors), one CPU each
    columns_per_runner: int = 24  # agent columns per runner (dppo's env.num_envs): env copies x agents
    segment_length: int = 50
    epochs: int = 10
    minibatch_size: int = 600  # agent steps
    learning_rate: float = 7e-4
    anneal_lr: bool = True
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_coef: float = 0.2
    value_coef: float = 0.5
    entropy_coef: float = 0.01
    max_grad_norm: float = 0.5
    hidden_sizes: list[int] = dataclasses.field(default_factory=lambda: [64, 64])
    activation: str = "relu"
    window: int = 100  # agent episodes in the reported mean return
    patch_truncation: bool = False  # bootstrap a time limit, as dppo does (see bootstrap_truncation)


def emit(event: str, **fields: Any) -> None:
    print(PREFIX + json.dumps({"event": event, **fields}), flush=True)


def bootstrap_truncation() -> None:
    """Patch RLlib's MultiAgentEpisode so that an episode every agent of which hit the time limit stays truncated.

    RLlib (2.60) declares a multi-agent episode terminated once every agent is done, however it ended, and marks each
    agent terminated with it: at MPE's max_cycles (truncated, not terminated) GAE then takes V(final obs) as 0, the
    critic must guess the time left from observations that do not hold it, and PPO learns from biased advantages
    (explained variance about 0.6 where dppo reaches 0.99). Opt-in (Spec.patch_truncation): the peer runs as
    shipped unless asked. Runs in every process that makes the env (the env runners)."""
    from ray.rllib.env.multi_agent_episode import MultiAgentEpisode

    original = MultiAgentEpisode.add_env_step
    if getattr(original, "dppo_patched", False):
        return

    def add_env_step(self: Any, *args: Any, terminateds: dict | None = None, truncateds: dict | None = None,
                     **kwargs: Any) -> None:
        original(self, *args, terminateds=terminateds, truncateds=truncateds, **kwargs)
        if (truncateds or {}).get("__all__") and not any((terminateds or {}).values()):
            self.is_terminated = False
            for single in self.agent_episodes.values():
                single.is_terminated = False

    add_env_step.dppo_patched = True  # type: ignore[attr-defined]
    MultiAgentEpisode.add_env_step = add_env_step


def make_env(spec: Spec) -> Any:
    """The PettingZoo Parallel env, with each agent's one-hot index appended to its observation when asked."""
    import gymnasium
    import numpy as np
    from pettingzoo.utils.wrappers import BaseParallelWrapper

    if spec.patch_truncation:
        bootstrap_truncation()
    env = importlib.import_module(spec.env).parallel_env(**spec.env_kwargs)
    if not spec.agent_id_in_obs:
        return env

    class AgentIdInObs(BaseParallelWrapper):
        """dppo's env.agent_id_in_obs: lets one shared policy tell the agents apart."""

        def __init__(self, env: Any) -> None:
            super().__init__(env)
            self.index = {agent: i for i, agent in enumerate(env.possible_agents)}
            self.spaces = {agent: self._space(env.observation_space(agent)) for agent in env.possible_agents}

        def _space(self, space: gymnasium.spaces.Box) -> gymnasium.spaces.Box:
            n = len(self.index)
            low = np.concatenate([space.low.astype(np.float32), np.zeros(n, np.float32)])
            high = np.concatenate([space.high.astype(np.float32), np.ones(n, np.float32)])
            return gymnasium.spaces.Box(low, high, dtype=np.float32)

        def observation_space(self, agent: str) -> gymnasium.spaces.Box:
            return self.spaces[agent]

        def _with_id(self, obs: dict[str, Any]) -> dict[str, Any]:
            out = {}
            for agent, o in obs.items():
                one_hot = np.zeros(len(self.index), np.float32)
                one_hot[self.index[agent]] = 1.0
                out[agent] = np.concatenate([np.asarray(o, np.float32), one_hot])
            return out

        def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
            obs, infos = self.env.reset(seed=seed, options=options)
            return self._with_id(obs), infos

        def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
            obs, rewards, terminated, truncated, infos = self.env.step(actions)
            return self._with_id(obs), rewards, terminated, truncated, infos

    return AgentIdInObs(env)


RETURNS_KEY = "dppo_agent_episode_returns"  # the callback's metric: one item per finished agent episode


def agent_returns_callback() -> type:
    """An RLlib callback that logs each finished episode's per-agent returns; an episode cut at a rollout's end
    comes back in chunks, summed by episode id here (as RLlib's own metrics do)."""
    from collections import defaultdict

    from ray.rllib.callbacks.callbacks import RLlibCallback

    class AgentReturns(RLlibCallback):
        def __init__(self) -> None:
            super().__init__()
            self.partial: dict[str, defaultdict[str, float]] = {}

        def on_sample_end(self, *, metrics_logger: Any = None, samples: Any = None, **kwargs: Any) -> None:
            for episode in samples:
                returns = self.partial.setdefault(episode.id_, defaultdict(float))
                for single in episode.agent_episodes.values():
                    returns[str(single.agent_id)] += float(single.get_return())
                if episode.is_done:
                    for value in self.partial.pop(episode.id_).values():
                        metrics_logger.log_value(RETURNS_KEY, value, reduce="item_series")

    return AgentReturns


def versions() -> dict[str, str]:
    from importlib.metadata import version

    return {name: version(name) for name in ("ray", "torch", "pettingzoo", "gymnasium", "numpy")}


def algo_config(spec: Spec, agents: int) -> Any:
    """RLlib's PPOConfig mirroring the spec (see the module docstring)."""
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec
    from ray.rllib.env.wrappers.pettingzoo_env import ParallelPettingZooEnv
    from ray.tune.registry import register_env

    copies = spec.columns_per_runner // agents
    batch_env_steps = spec.runners * copies * spec.segment_length
    total_env_steps = spec.agent_steps // agents
    lr: Any = [[0, spec.learning_rate], [total_env_steps, 0.0]] if spec.anneal_lr else spec.learning_rate
    register_env("peer-env", lambda _: ParallelPettingZooEnv(make_env(spec)))
    return (
        PPOConfig()
        .environment("peer-env")
        .framework("torch")
        .env_runners(num_env_runners=spec.runners, num_envs_per_env_runner=copies, num_cpus_per_env_runner=1,
                     rollout_fragment_length=spec.segment_length)
        .learners(num_learners=0)
        .multi_agent(policies={"shared"}, policy_mapping_fn=lambda agent_id, *args, **kwargs: "shared")
        .rl_module(rl_module_spec=MultiRLModuleSpec(rl_module_specs={"shared": RLModuleSpec(
            model_config=DefaultModelConfig(fcnet_hiddens=list(spec.hidden_sizes),
                                            fcnet_activation=spec.activation, vf_share_layers=False))}))
        .training(train_batch_size_per_learner=batch_env_steps, minibatch_size=spec.minibatch_size,
                  num_epochs=spec.epochs, lr=lr, gamma=spec.gamma, lambda_=spec.gae_lambda,
                  clip_param=spec.clip_coef, vf_loss_coeff=spec.value_coef / 2, entropy_coeff=spec.entropy_coef,
                  grad_clip=spec.max_grad_norm, grad_clip_by="global_norm", use_kl_loss=False,
                  vf_clip_param=float("inf"))
        .callbacks(agent_returns_callback())
        .debugging(seed=spec.seed)
    )


def diagnostics(learner: dict[str, Any]) -> dict[str, float | None]:
    """The shared module's PPO health numbers, to compare with dppo's progress records."""
    def number(key: str) -> float | None:
        value = learner.get(key)
        return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None

    return {"entropy": number("entropy"), "explained_variance": number("vf_explained_var"),
            "learning_rate": number("default_optimizer_learning_rate"), "policy_loss": number("policy_loss"),
            "value_loss": number("vf_loss"), "grad_norm": number("gradients_default_optimizer_global_norm")}


def train(spec: Spec) -> None:
    import ray
    import torch

    torch.set_num_threads(1)  # the learner's threads, as dppo's run.learner_threads
    probe = make_env(spec)
    agents = len(probe.possible_agents)
    probe.close()
    if spec.columns_per_runner % agents:
        raise SystemExit(f"columns_per_runner {spec.columns_per_runner} is not a multiple of the {agents} agents")
    # A Ray of its own, as dppo's side starts (a bare ray.init() would join any `ray start` cluster on the machine)
    ray.init(address="local", num_cpus=max(os.cpu_count() or 1, spec.runners), include_dashboard=False,
             log_to_driver=False, logging_level="ERROR")
    algo = algo_config(spec, agents).build_algo()
    emit("start", agents=agents, t=time.time(), **versions())
    agent_steps, iteration, episodes = 0, 0, 0
    recent: deque[float] = deque(maxlen=spec.window)
    while agent_steps < spec.agent_steps:
        result = algo.train()
        iteration += 1
        runners = result["env_runners"]
        finished = runners.get(RETURNS_KEY) or []
        recent.extend(float(r) for r in finished)
        episodes += len(finished)
        env_steps = int(runners["num_env_steps_sampled_lifetime"])
        agent_steps = int(sum(runners["num_agent_steps_sampled_lifetime"].values()))
        emit("iteration", iteration=iteration, env_steps=env_steps, agent_steps=agent_steps, t=time.time(),
             agent_episodes=episodes, episode_return_mean=sum(recent) / len(recent) if recent else None,
             **diagnostics(result.get("learners", {}).get("shared", {})))
    algo.stop()
    ray.shutdown()
    emit("done", iteration=iteration, agent_steps=agent_steps, t=time.time())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="RLlib's multi-agent PPO, the peer of `python -m benchmarks peer`")
    parser.add_argument("--spec", default="{}", help="JSON object of Spec fields to override (default: the example)")
    parser.add_argument("--check", action="store_true",
                        help="import RLlib's PPO, make the spec's env, print the versions and exit")
    args = parser.parse_args(argv)
    spec = Spec(**json.loads(args.spec))
    if args.check:
        import ray.rllib.algorithms.ppo  # noqa: F401 - what --check checks

        make_env(spec).close()
        emit("versions", **versions())
        return 0
    train(spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
