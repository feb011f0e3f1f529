"""The ``env`` section: which env, made how, and what is done to its observations and rewards."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from dppo.config.base import Section

DEFAULT_ENV_ID = "CartPole-v1"
GLOBAL_STATE_KEY = "global_state"  # env.global_state: the observation key of the env's global state (MAPPO)
# How PettingZoo names an env: the module that holds it, e.g. mpe2.simple_spread_v3 (gymnasium ids end in -v<N>)
PETTINGZOO_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\.[A-Za-z_]\w*_v\d+")
MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")  # an env.id that may name a PettingZoo module of one's own
EnvKind = Literal["gymnasium", "ale", "parallel", "turn_based"]


class WrapperConfig(Section):
    name: str
    """``module.path:Class`` or the name of one of gymnasium's wrappers, e.g. FlattenObservation."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the wrapper (the env is the first positional argument)."""

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        return {"name": data} if isinstance(data, str) else data


def _module_ref(value: str | None, example: str) -> str | None:
    if value is not None and (not value.strip() or value.startswith(":") or value.endswith(":")):
        raise ValueError(f"{value!r} is not valid; write e.g. {example}")
    return value


class EnvConfig(Section):
    id: str | None = DEFAULT_ENV_ID
    """Gymnasium env id (CartPole-v1, LunarLander-v3, ...) or module.path:EnvId-v0, which imports
    module.path (registering the env) first, as gymnasium.make does. Null when entry_point is set."""
    entry_point: str | None = None
    """module.path:callable: an Env subclass or a function returning an Env, called with env.kwargs,
    for envs that are not registered. The module must be importable on every Ray worker."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the env (passed to gymnasium.make, to the entry point, or to a PettingZoo env's
    parallel_env)."""
    multiagent: bool = False
    """A PettingZoo env: a Parallel env, each agent a column of its policy's vector env (one policy shared by all
    agents unless ``policies`` maps them), or a turn-based (AEC) game of two players trained by self-play.
    env.id names its module, whose parallel_env(**env.kwargs) makes it (mpe2.simple_spread_v3,
    pettingzoo.butterfly.pistonball_v6, your own mysim.agents), or env.entry_point a function returning one.
    Left out, it is true when env.id is named as PettingZoo names env modules: a dotted module path ending in
    _v<N> (gymnasium ids end in -v<N>). env.num_envs still counts env copies (games for self-play); env steps
    count agent steps; env.wrappers are functions of the Parallel env (supersuit:color_reduction_v0)."""
    agent_id_in_obs: bool = False
    """Add each agent's index, one-hot, to its observation (key agent_id of a Dict observation), so the shared
    policy can act differently per agent (env.multiagent)."""
    global_state: bool = False
    """MAPPO's centralized critic: add the env's global state (a PettingZoo env's state()) to each agent's
    observation under the key global_state, which only the value network sees (model.value_only_key); the policy
    acts on the agent's own observation (env.multiagent; the default, false, is IPPO)."""
    max_episode_steps: int | None = Field(None, ge=1)
    """Time limit (episodes are truncated there and bootstrapped); null keeps the env's own."""
    wrappers: list[WrapperConfig] = Field(default_factory=list)
    """Wrappers applied in order after the env is made: a name, or {name: module:Class, kwargs: {...}}."""
    num_envs: int = Field(8, ge=1, le=4096)
    """E: env copies stepped in one vector env inside each actor (of a multi-agent env too: each copy gives one
    column per agent, env.columns_per_copy)."""
    columns_per_copy: int | None = Field(None, ge=1)
    """Columns of the actor's vector env per env copy: the agents of a multi-agent Parallel env (a self-play game
    has one learner seat). dppo sets it from the env when a run starts (:func:`dppo.envs.make.with_agents`; a value
    given by hand is replaced); null until then (the batch checks wait for it), and for a gymnasium env (1)."""
    kind: EnvKind | None = None
    """What the env is: gymnasium (a gymnasium env), ale (ale-py's vector env), parallel (a PettingZoo Parallel env)
    or turn_based (a two-player AEC game, trained by self-play). dppo finds it once, when a run starts, by making
    one env (:func:`dppo.envs.make.with_agents`), and every part of the run reads it from here; the config.yaml of a
    run holds it. Null until then: a module of one's own named by env.id (``--env mysim``) is then not yet known to
    be multi-agent, and the checks that need to know wait for it."""
    vectorization: Literal["sync", "async", "ale"] = "sync"
    """sync: the E envs are stepped one after another in the actor's process; async: each env in its
    own subprocess (helps when env steps wait on I/O or are expensive); ale: ale-py's C++ vector env
    (ALE/ ids with env.atari; preprocessing in threads, the fastest for Atari)."""
    atari: bool = False
    """The standard Atari preprocessing (30 no-ops, frame skip 4 with max-pool, 84x84 gray, 4 stacked
    frames, FIRE on reset, no sticky actions) for ALE/ ids; needs the atari extra."""
    terminal_on_life_loss: bool = False
    """Learn as if a lost life ended the episode (no bootstrap) while episodes and returns stay full games;
    reads info["lives"] (Atari)."""
    clip_reward: bool = False
    """Learn from the sign of each reward; reported returns stay raw (Atari)."""
    normalize_obs: bool = False
    """Running mean/std observation normalization (clip to +-obs_clip). Use for continuous control."""
    normalize_reward: bool = False
    """Scale rewards by the running std of the discounted return. Use for continuous control."""
    obs_clip: float = Field(10.0, gt=0)
    """Normalized observations are clipped to [-obs_clip, obs_clip]."""
    reward_clip: float = Field(10.0, gt=0)
    """Scaled rewards are clipped to [-reward_clip, reward_clip]."""
    latency_ms: float = Field(0.0, ge=0)
    """Artificial per-step latency that releases the CPU (a stand-in for a remote simulator): each step takes
    this long in all, the env's own work included, the rest slept. Benchmarks."""

    @model_validator(mode="before")
    @classmethod
    def _entry_point_replaces_id(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("entry_point") and "id" not in data:
            return {**data, "id": None}
        return data

    @model_validator(mode="before")
    @classmethod
    def _multiagent_by_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("multiagent") is None:
            env_id = data.get("id", DEFAULT_ENV_ID)
            return {**data, "multiagent": isinstance(env_id, str) and bool(PETTINGZOO_MODULE.fullmatch(env_id))}
        return data

    @field_validator("id")
    @classmethod
    def _id_format(cls, value: str | None) -> str | None:
        return _module_ref(value, "CartPole-v1 or mypackage.envs:MyEnv-v0")

    @field_validator("entry_point")
    @classmethod
    def _entry_point_format(cls, value: str | None) -> str | None:
        if value is not None and value.count(":") != 1:
            raise ValueError(f"{value!r} is not module.path:callable; write e.g. mypackage.envs:MyEnv")
        return _module_ref(value, "mypackage.envs:MyEnv")

    @model_validator(mode="after")
    def _one_name(self) -> EnvConfig:
        if (self.id is None) == (self.entry_point is None):
            raise ValueError("set exactly one of env.id and env.entry_point")
        if (self.atari or self.vectorization == "ale") and not (self.id or "").startswith("ALE/"):
            raise ValueError("env.atari and env.vectorization=ale need an ALE/ id such as ALE/Breakout-v5")
        if self.vectorization == "ale" and (not self.atari or self.wrappers or self.max_episode_steps):
            raise ValueError("env.vectorization=ale applies the standard Atari preprocessing itself: set "
                             "env.atari=true and no env.wrappers or env.max_episode_steps, or use sync")
        return self

    @property
    def may_be_multiagent(self) -> bool:
        """Not known yet to be single-agent: env.multiagent, or an env.id that may name a PettingZoo module of one's
        own while env.kind is not resolved."""
        return self.multiagent or (self.kind is None and bool(MODULE_NAME.fullmatch(self.id or "")))

    @model_validator(mode="after")
    def _multiagent_fits(self) -> EnvConfig:
        if not self.multiagent:
            if (self.agent_id_in_obs or self.global_state) and not self.may_be_multiagent:
                flag = "agent_id_in_obs" if self.agent_id_in_obs else "global_state"
                raise ValueError(f"env.{flag} applies to multi-agent envs (env.multiagent); set it to false")
            return self
        if self.id is not None and ":" in self.id:
            raise ValueError(f"env.id {self.id!r} with env.multiagent names a module whose parallel_env() makes the "
                             "env (mpe2.simple_spread_v3); for a function write env.entry_point: module.path:function")
        if self.atari or self.vectorization != "sync" or self.max_episode_steps is not None:
            raise ValueError("a PettingZoo env (env.multiagent) is stepped with env.vectorization=sync, no env.atari "
                             "and no env.max_episode_steps (set the env's own limit in env.kwargs, e.g. max_cycles)")
        return self

    @property
    def name(self) -> str:
        """How the env is named in logs, metrics, checkpoints and the run directory."""
        return self.id or self.entry_point or ""
