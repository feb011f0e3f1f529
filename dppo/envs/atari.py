"""Atari with the standard preprocessing of the PPO/DQN literature, as ale-py and gymnasium provide it.

The preprocessing (Mnih et al. 2015; Machado et al. 2018; CleanRL's ``ppo_atari.py``): up to 30 no-op
actions after reset, frame skip 4 with max-pooling of the last two frames, 84x84 grayscale, 4 stacked
frames, FIRE after reset where the game needs it, no sticky actions (as CleanRL's ``NoFrameskip-v4``
envs, so scores compare with its published curves), 108,000 frames at most per game. Episodes stay full
games with raw scores; the learning signals (terminal on life loss, rewards clipped to their sign) are
the sampler's ``env.terminal_on_life_loss`` and ``env.clip_reward``, so reported returns are game scores.

Two implementations, measured (``dppo bench sampling --env ALE/Breakout-v5``, docs/benchmarks.md):
ale-py's C++ ``AtariVectorEnv`` (``env.vectorization: ale``, preprocessing in threads; the faster one,
used by the presets) and gymnasium's ``AtariPreprocessing`` + ``FrameStackObservation`` wrappers around
single envs (``sync``/``async``, and the single env of ``dppo eval``). EnvPool's C++ Atari, the other engine
of the kind, steps fewer env steps per CPU-second than ale-py's with the same settings (``python -m benchmarks envs``),
so it is measured, not offered. One difference between them: a reset observation's 3 older frames are zeros
in ale-py's vector env, copies of the reset frame in EnvPool and in gymnasium's ``FrameStackObservation``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import gymnasium as gym
from gymnasium.vector import AutoresetMode, VectorEnv

from dppo.errors import UsageError

if TYPE_CHECKING:
    from dppo.config import Config, EnvConfig

NOOP_MAX = 30
FRAME_SKIP = 4
SCREEN = 84
STACK = 4
MAX_FRAMES = 108_000


def require_ale() -> Any:
    """Import ale_py (it registers the ALE/ ids with gymnasium) or say how to install it."""
    try:
        import ale_py
    except ImportError:
        raise UsageError("Atari envs need ale-py: pip install 'dppo[atari]' (its wheel ships the ROMs)") from None
    gym.register_envs(ale_py)
    return ale_py


def game(env_id: str) -> str:
    """``ALE/Breakout-v5`` -> ``breakout``, ``ALE/MontezumaRevenge-v5`` -> ``montezuma_revenge``."""
    name = env_id.split("/")[-1].split("-")[0]
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class FireOnReset(gym.Wrapper):
    """Press FIRE after reset in games that wait for it (Breakout): ale-py's vector env does the same with
    ``use_fire_reset``; neither gymnasium nor ale-py ship this as a wrapper for single envs."""

    def reset(self, **kwargs: Any) -> tuple[Any, dict]:
        obs, info = self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(1)
        if terminated or truncated:
            obs, info = self.env.reset(**kwargs)
        return obs, info


def make_atari_env(cfg: EnvConfig, render_mode: str | None = None) -> gym.Env:
    """One preprocessed env from gymnasium's wrappers (observation (4, 84, 84) uint8, raw rewards)."""
    require_ale()
    env = gym.make(cfg.id or "", frameskip=1, repeat_action_probability=0.0, full_action_space=False,
                   max_num_frames_per_episode=MAX_FRAMES, render_mode=render_mode, **cfg.kwargs)
    env = gym.wrappers.AtariPreprocessing(env, noop_max=NOOP_MAX, frame_skip=FRAME_SKIP, screen_size=SCREEN,
                                          terminal_on_life_loss=False, grayscale_obs=True)
    if "FIRE" in env.unwrapped.get_action_meanings():
        env = FireOnReset(env)
    return gym.wrappers.FrameStackObservation(env, STACK)


def ale_vector_env(env_id: str, num_envs: int, threads: int, **kwargs: Any) -> VectorEnv:
    """ale-py's C++ vector env with the preprocessing above, SAME_STEP autoreset, raw rewards, full games."""
    require_ale()
    from ale_py.vector_env import AtariVectorEnv

    return AtariVectorEnv(
        game(env_id), num_envs, num_threads=threads, autoreset_mode=AutoresetMode.SAME_STEP, noop_max=NOOP_MAX,
        frameskip=FRAME_SKIP, maxpool=True, img_height=SCREEN, img_width=SCREEN, grayscale=True, stack_num=STACK,
        repeat_action_probability=0.0, full_action_space=False, max_num_frames_per_episode=MAX_FRAMES,
        use_fire_reset=True, episodic_life=False, life_loss_info=False, reward_clipping=False, **kwargs,
    )


def envpool_vector_env(env_id: str, num_envs: int, threads: int, seed: int) -> Any:
    """EnvPool's Atari with the same preprocessing (its gymnasium API: NEXT_STEP autoreset, seeded when made).

    Measured against ale-py's by ``python -m benchmarks envs`` (docs/benchmarks.md), not one of dppo's
    vectorizations: it steps fewer env steps per core."""
    try:
        import envpool
    except ImportError:
        raise UsageError("EnvPool is not installed: pip install 'dppo[envpool]'") from None
    return envpool.make_gymnasium(
        env_id.split("/")[-1], num_envs=num_envs, batch_size=num_envs, num_threads=threads, seed=seed,
        noop_max=NOOP_MAX, frame_skip=FRAME_SKIP, img_height=SCREEN, img_width=SCREEN, gray_scale=True,
        stack_num=STACK, repeat_action_probability=0.0, full_action_space=False,
        max_episode_steps=MAX_FRAMES // FRAME_SKIP, use_fire_reset=True, episodic_life=False, reward_clip=False,
    )


def make_ale_vector_env(config: Config) -> VectorEnv:
    """E preprocessed envs in ale-py's C++ vector env, stepped in ``run.actor_cpus`` threads. With
    ``run.actor_halves: 2`` the Sampler makes one per half (E/2 envs each, each with those threads): the halves
    step in turn, ale-py releasing the GIL while its threads step, so the other half's forward pass runs meanwhile."""
    cfg = config.env
    return ale_vector_env(cfg.id or "", cfg.num_envs, max(1, round(config.run.actor_cpus)), **cfg.kwargs)
