"""The policy map resolved against a multi-agent env: which of its agents each policy acts for, and their spaces.

``policies`` (the config's map) names each policy's agent-name patterns (:mod:`fnmatch`, as shells match file
names); every agent of ``possible_agents`` must match exactly one policy, and a policy's agents must share one
observation and one action space (one network serves them all). Without a map, one policy
(:data:`~dppo.config.policies.DEFAULT_POLICY`) serves every agent. Each policy's agents keep the env's order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

import gymnasium as gym

from dppo.config.policies import DEFAULT_POLICY, POLICIES_EXAMPLE
from dppo.errors import UsageError

if TYPE_CHECKING:
    from pettingzoo import ParallelEnv


@dataclass(frozen=True)
class PolicyGroup:
    """One policy and the agents it acts for, with the (raw) spaces they share."""

    name: str
    agents: tuple[str, ...]
    observation_space: gym.Space
    action_space: gym.Space


def agents_of(policies: dict[str, list[str]], agents: Sequence[str], env_name: str) -> dict[str, list[str]]:
    """Policy -> its agents in env order; UsageError for an agent mapped to no policy or to two, or a policy that
    maps no agent (a pattern with a typo)."""
    found: dict[str, list[str]] = {name: [] for name in policies}
    for agent in agents:
        owners = [name for name, patterns in policies.items() if any(fnmatchcase(agent, p) for p in patterns)]
        if not owners:
            raise UsageError(f"agent {agent!r} of env {env_name!r} is mapped to no policy; add a pattern that matches "
                             f"it to policies (the env's agents: {', '.join(agents)}), e.g. {POLICIES_EXAMPLE}")
        if len(owners) > 1:
            raise UsageError(f"agent {agent!r} of env {env_name!r} matches the patterns of policies {owners[0]!r} "
                             f"and {owners[1]!r}; make the patterns match each agent once")
        found[owners[0]].append(agent)
    for name, mapped in found.items():
        if not mapped:
            raise UsageError(f"policies.{name} {policies[name]} matches no agent of env {env_name!r} (its agents: "
                             f"{', '.join(agents)}); fix the patterns or drop the policy")
    return found


def policy_groups(env: ParallelEnv, policies: dict[str, list[str]], env_name: str) -> list[PolicyGroup]:
    """The policies of ``env`` in map order (one shared policy without a map), each with its agents' spaces;
    UsageError when a policy's agents differ in spaces."""
    agents = list(env.possible_agents)
    if not agents:
        raise UsageError(f"env {env_name!r} has no possible_agents; a PettingZoo Parallel env lists its agents there")
    mapped = agents_of(policies, agents, env_name) if policies else {DEFAULT_POLICY: agents}
    return [_group(env, name, members, env_name, bool(policies)) for name, members in mapped.items()]


def _group(env: ParallelEnv, name: str, agents: list[str], env_name: str, mapped: bool) -> PolicyGroup:
    first = agents[0]
    spaces = env.observation_space(first), env.action_space(first)
    for agent in agents[1:]:
        other = env.observation_space(agent), env.action_space(agent)
        if other != spaces:
            fix = ("map them to different policies, or pad them to one space (env.wrappers: "
                   "[supersuit:pad_observations_v0, supersuit:pad_action_space_v0])" if mapped else
                   f"give them separate policies ({POLICIES_EXAMPLE}), or pad them to one space (env.wrappers: "
                   "[supersuit:pad_observations_v0, supersuit:pad_action_space_v0])")
            whose = f"policy {name!r}: agents" if mapped else "agents"
            raise UsageError(f"env {env_name!r}: {whose} {first!r} ({spaces[0]}, {spaces[1]}) and {agent!r} "
                             f"({other[0]}, {other[1]}) have different spaces, and one policy acts for both; {fix}")
    return PolicyGroup(name, tuple(agents), *spaces)
