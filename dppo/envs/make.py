"""Making envs from the ``env`` config section, the same way in the driver and in every actor.

Three ways to name an env, as gymnasium users already write them:
- a registered id (``CartPole-v1``);
- ``module.path:EnvId-v0``: import ``module.path`` (which registers the env), then make ``EnvId-v0``;
- ``env.entry_point: module.path:callable`` (an Env subclass or a factory) with ``env.kwargs``.
Then the configured wrappers, in order. Every way a user's code can fail to load becomes an
:class:`EnvLoadError` (exit 2, one line) that names what failed and how to fix it.

A PettingZoo env (``env.multiagent``) is loaded by :mod:`dppo.envs.pettingzoo_env` (its module's
``parallel_env``, a turn-based game's ``env``, or an entry point, with SuperSuit-style wrappers);
:mod:`dppo.envs.multiagent` turns a Parallel env into the vector env (agents as columns) and the one env that
``dppo eval`` plays (agents in turns); :mod:`dppo.envs.selfplay` turns a two-player game into the learner's seat
against an opponent.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

import gymnasium as gym
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv, VectorEnv

from dppo.config.selfplay import fixed_player
from dppo.envs.atari import make_ale_vector_env, make_atari_env, require_ale
from dppo.envs.columns import ParallelEnvs, PolicyView
from dppo.envs.failures import RecreateOnFailure
from dppo.envs.latency import LatencyWrapper
from dppo.envs.minimax import MinimaxOpponents
from dppo.envs.multiagent import AgentTurns
from dppo.envs.pettingzoo_env import make_pettingzoo_env, names_pettingzoo_module
from dppo.envs.policy_map import policy_groups
from dppo.envs.selfplay import Opponents, RandomOpponents, SelfPlayEnv, SelfPlayVectorEnv
from dppo.envs.user_code import EnvLoadError, call_factory, import_module, kwargs_error, load_callable
from dppo.errors import UsageError

if TYPE_CHECKING:
    from dppo.config import Config, EnvConfig
    from dppo.config.env import EnvKind


def _wrapper_class(name: str) -> Callable[..., Any]:
    """``module:Class``, or the bare name of one of gymnasium's own wrappers (``FlattenObservation``)."""
    if ":" not in name:
        if hasattr(gym.wrappers, name):
            return getattr(gym.wrappers, name)
        raise EnvLoadError(f"wrapper {name!r} is not one of gymnasium.wrappers; write module.path:Class")
    return load_callable(name, "wrapper")


def unknown_id_hint(env_id: str, module_name: str) -> str:
    """What to write instead of an id gymnasium does not know. Ids that a package registers on import (MiniGrid,
    a user's package) need the package named first, and a package by the id's own prefix is often there."""
    if module_name:
        return f"did importing {module_name!r} register it?"
    if "-" not in env_id and "/" not in env_id and importlib.util.find_spec(env_id.split(".")[0]) is not None:
        return (f"{env_id!r} is a module that registers no gymnasium env under that name and has neither "
                "parallel_env() nor env() (a PettingZoo env module): name an id it registers, --env "
                f"{env_id}:EnvId-v0, or give it a parallel_env(**kwargs) that returns a PettingZoo ParallelEnv")
    prefix = env_id.split("/")[0].split("-")[0]
    package = next((name for name in (prefix.lower(), prefix) if importlib.util.find_spec(name) is not None), None)
    if package is not None:
        return (f"if the package {package!r} registers it, name the package first: --env {package}:{env_id} "
                f"(env.id: {package}:{env_id})")
    return ("use a registered id such as CartPole-v1, or name the package that registers it, module.path:EnvId-v0 "
            "(e.g. minigrid:MiniGrid-Empty-5x5-v0), or env.entry_point")


def _make_registered(cfg: EnvConfig, render_mode: str | None) -> gym.Env:
    env_id = cfg.id or ""
    if env_id.startswith("ALE/"):
        require_ale()
    module_name, sep, name = env_id.rpartition(":")
    if sep:
        import_module(module_name, f"env {env_id!r}")
        env_id = name
    kwargs = dict(cfg.kwargs)
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    if cfg.max_episode_steps is not None:
        kwargs["max_episode_steps"] = cfg.max_episode_steps
    try:
        return gym.make(env_id, **kwargs)
    except gym.error.DependencyNotInstalled as err:
        raise EnvLoadError(f"env {cfg.id!r} needs a package that is not installed ({err}); install its extra, "
                           "e.g. pip install 'dppo[box2d]' or 'dppo[mujoco]'") from None
    except gym.error.Error as err:
        raise EnvLoadError(f"unknown environment {cfg.id!r} ({err}); {unknown_id_hint(env_id, module_name)}") from None
    except TypeError as err:
        raise kwargs_error(f"env {cfg.id!r}", cfg.kwargs, render_mode, err) from None


def _make_entry_point(cfg: EnvConfig, render_mode: str | None) -> gym.Env:
    factory = load_callable(cfg.entry_point or "", "env entry point")
    env = call_factory(factory, f"env entry point {cfg.entry_point!r}", cfg.kwargs, render_mode)
    if not isinstance(env, gym.Env):
        raise EnvLoadError(f"env entry point {cfg.entry_point!r} returned a {type(env).__name__}, not a "
                           "gymnasium.Env; return an Env instance")
    env = gym.wrappers.PassiveEnvChecker(env)  # what gymnasium.make adds to registered envs
    if cfg.max_episode_steps is not None:
        env = gym.wrappers.TimeLimit(env, cfg.max_episode_steps)
    return env


@contextmanager
def _user_code(cfg: EnvConfig) -> Iterator[None]:
    """The user's constructor raised: their input, not our bug (one line, exit 2)."""
    try:
        yield
    except UsageError:
        raise
    except Exception as err:
        raise EnvLoadError(f"making env {cfg.name!r} raised {type(err).__name__}: {err}; "
                           "check the env's code and env.kwargs") from None


def _gymnasium_env(cfg: EnvConfig, render_mode: str | None) -> gym.Env:
    with _user_code(cfg):
        if cfg.atari:
            env = make_atari_env(cfg, render_mode)
        elif cfg.entry_point:
            env = _make_entry_point(cfg, render_mode)
        else:
            env = _make_registered(cfg, render_mode)
    for wrapper in cfg.wrappers:
        try:
            env = _wrapper_class(wrapper.name)(env, **wrapper.kwargs)
        except TypeError as err:
            raise EnvLoadError(f"wrapper {wrapper.name!r} rejected kwargs {wrapper.kwargs} ({err}); fix its kwargs"
                               ) from None
        if not isinstance(env, gym.Env):
            raise EnvLoadError(f"wrapper {wrapper.name!r} returned a {type(env).__name__}, not a gymnasium.Env")
    return env


def _agent_turns(cfg: EnvConfig, render_mode: str | None) -> gym.Env:
    with _user_code(cfg):
        return AgentTurns(make_pettingzoo_env(cfg, render_mode), cfg.name, cfg.agent_id_in_obs, cfg.global_state)


def _self_play_env(cfg: EnvConfig, render_mode: str | None) -> gym.Env:
    with _user_code(cfg):
        return SelfPlayEnv(make_pettingzoo_env(cfg, render_mode), cfg.name)


def env_factory(config: Config) -> Callable[[], gym.Env]:
    """The function the vector env calls for each of its E envs (and again when the sampler restarts it): each copy
    is recreated alone when it raises (:class:`RecreateOnFailure`), so one failure costs one episode, not the
    segment."""
    env_cfg, latency = config.env, config.env.latency_ms

    def make_copy() -> gym.Env:
        env = make_env(env_cfg)
        return LatencyWrapper(env, latency) if latency > 0 else env

    def make() -> gym.Env:
        return RecreateOnFailure(make_copy, env_cfg.name, config.faults.env_retries)

    return make


def _gymnasium_vector_env(config: Config) -> VectorEnv:
    fns = [env_factory(config)] * config.env.num_envs
    if config.env.vectorization == "async":
        return AsyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    return SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)


def make_parallel_envs(config: Config, copies: int | None = None, render_mode: str | None = None) -> ParallelEnvs:
    """env.num_envs copies of the Parallel env (or ``copies``), each agent a column of its policy's vector env."""
    env_cfg = config.env
    copies = env_cfg.num_envs if copies is None else copies
    envs = [make_pettingzoo_env(env_cfg, render_mode) for _ in range(copies)]
    groups = policy_groups(envs[0], config.policies, env_cfg.name)
    return ParallelEnvs(envs, groups, env_cfg.name, env_cfg.agent_id_in_obs, config.model.action_mask_key,
                        env_cfg.global_state, partial(make_pettingzoo_env, env_cfg, render_mode),
                        config.faults.env_retries)


def _parallel_vector_env(config: Config) -> PolicyView:
    """Agents as columns of one policy's vector env (several policies' are stepped together by the joint sampler:
    :func:`make_parallel_envs`)."""
    joint = make_parallel_envs(config)
    if len(joint.views) > 1:
        joint.close()
        raise RuntimeError("several policies' columns are stepped together: see dppo.rl.joint")
    return joint.views[0]


def _self_play_vector_env(config: Config) -> SelfPlayVectorEnv:
    """env.num_envs games, the learner's seat in each."""
    env_cfg = config.env
    games = [make_pettingzoo_env(env_cfg) for _ in range(env_cfg.num_envs)]
    return SelfPlayVectorEnv(games, env_cfg.name, make=partial(make_pettingzoo_env, env_cfg),
                             reset_tries=config.faults.env_retries)


class Makers(NamedTuple):
    """How one kind of env is made: one env (dppo eval, a policy's spaces) and an actor's vector env."""

    env: Callable[[EnvConfig, str | None], gym.Env]
    vector: Callable[[Config], VectorEnv]


MAKERS: dict[EnvKind, Makers] = {
    "gymnasium": Makers(_gymnasium_env, _gymnasium_vector_env),
    "ale": Makers(_gymnasium_env, make_ale_vector_env),
    "parallel": Makers(_agent_turns, _parallel_vector_env),
    "turn_based": Makers(_self_play_env, _self_play_vector_env),
}


def make_env(cfg: EnvConfig, render_mode: str | None = None) -> gym.Env:
    """One env as the config names it, with its wrappers (no latency wrapper: that is for benchmarks). A
    multi-agent env is one copy with its agents in turns (:class:`AgentTurns`); a turn-based game, one game against
    a random player (:class:`SelfPlayEnv`)."""
    return MAKERS[env_kind(cfg)].env(cfg, render_mode)


def make_vector_env(config: Config) -> VectorEnv:
    """E copies of the env in one vector env, autoreset mode set explicitly to SAME_STEP."""
    return MAKERS[env_kind(config.env)].vector(config)


def fixed_opponents(spec: str, cfg: EnvConfig, action_space: gym.Space, seed: int) -> Opponents:
    """``random`` or ``minimax[:DEPTH]`` for the game ``cfg`` names (dppo eval --opponent, selfplay.eval_opponent).
    Full-depth minimax solves the game once (tic-tac-toe: 5 s here); a larger game (Connect Four) needs a depth."""
    try:
        kind, depth = fixed_player(spec)
    except ValueError as err:
        raise UsageError(f"opponent {err}") from None
    if kind == "random":
        return RandomOpponents(action_space, seed)
    return MinimaxOpponents(lambda: make_pettingzoo_env(cfg), depth, seed)


def check_self_play(config: Config) -> None:
    """What self-play's frozen opponents cannot do: normalized observations (a snapshot has no statistics of its
    own) and recurrent policies (no memory per game); one line each."""
    if config.env.normalize_obs:
        raise UsageError(f"env {config.env.name!r} is trained by self-play, whose snapshots act on raw observations: "
                         "set env.normalize_obs to false")
    if config.model.recurrent != "none":
        raise UsageError(f"env {config.env.name!r} is trained by self-play, whose snapshots keep no memory per "
                         "game: set model.recurrent to none")


def _pettingzoo_kind(env: Any) -> EnvKind:
    """An AEC env is a turn-based game (trained by self-play), any other a Parallel env."""
    from pettingzoo import AECEnv

    return "turn_based" if isinstance(env, AECEnv) else "parallel"


def env_kind(cfg: EnvConfig) -> EnvKind:
    """env.kind as the driver resolved it (:func:`with_agents`); for a config not resolved (a test's), told now."""
    if cfg.kind is not None:
        return cfg.kind
    if not cfg.multiagent:
        return "ale" if cfg.vectorization == "ale" else "gymnasium"
    first = make_pettingzoo_env(cfg)
    try:
        return _pettingzoo_kind(first)
    finally:
        first.close()


def is_self_play(cfg: EnvConfig) -> bool:
    """A two-player turn-based game, trained against snapshots of its own policy."""
    return env_kind(cfg) == "turn_based"


def with_agents(config: Config) -> Config:
    """``config`` with its env's kind resolved (env.kind), once, by making one env (and closing it) when it is a
    PettingZoo env: env.multiagent for a module of one's own named by env.id (:func:`names_pettingzoo_module`), and
    env.columns_per_copy (a Parallel env's agents; a turn-based game: 1). Validated again, now that the env's kind
    is known: a policy map needs a multi-agent env, and the batch these size is checked against the minibatches. A
    config whose env.kind is set is returned as it is (what every actor gets)."""
    env = config.env
    if env.kind is not None:
        return config
    multiagent = env.multiagent or names_pettingzoo_module(env)
    if not multiagent:
        columns, kind = None, env_kind(env)
    else:
        first = make_pettingzoo_env(env.model_copy(update={"multiagent": True}))
        try:
            kind = _pettingzoo_kind(first)
            columns = 1 if kind == "turn_based" else len(first.possible_agents)
        finally:
            first.close()
    if kind == "turn_based" and config.policies:
        raise UsageError(f"env {env.name!r} is a turn-based game, trained by self-play with one policy against its "
                         "own snapshots; drop policies")
    from dppo.config.load import validate

    data = config.model_dump(mode="json")
    data["env"].update(multiagent=multiagent, columns_per_copy=columns, kind=kind)
    return validate(data, warn=False)


def env_spaces(config: Config) -> tuple[gym.Space, gym.Space]:
    """Observation and action space of one env (made and closed): what the model is built for (of one agent, for
    a multi-agent env with one policy)."""
    env = make_env(config.env)
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


def policy_spaces(config: Config) -> dict[str, tuple[gym.Space, gym.Space]]:
    """Each policy's observation and action space (one env made and closed): what each policy's model is built
    for. Without a policy map, the one policy's are :func:`env_spaces`."""
    if len(config.policy_names) == 1 and not config.policies:
        return {config.policy_names[0]: env_spaces(config)}
    joint = make_parallel_envs(config, copies=1)
    try:
        return {view.group.name: (view.single_observation_space, view.single_action_space) for view in joint.views}
    finally:
        joint.close()


@dataclass(frozen=True)
class EnvSpec:
    """The env as the driver resolved it once, shipped to every actor, which builds its policy from it unmade."""

    kind: EnvKind
    spaces: dict[str, tuple[gym.Space, gym.Space]]  # each policy's observation and action space, in map order
    columns: int  # of one actor's vector env: env.num_envs copies x env.columns_per_copy


def env_spec(config: Config) -> EnvSpec:
    """``config``'s env resolved (:func:`with_agents`) into the spec that the driver ships to its actors."""
    config = with_agents(config)
    return EnvSpec(env_kind(config.env), policy_spaces(config), config.columns)
