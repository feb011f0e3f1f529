"""`dppo eval`: greedy episodes of a checkpoint's policy, normalized exactly as in training; for a two-player game,
games against a chosen opponent, counted as wins, draws and losses for each seat."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from dppo.cli_args import existing_checkpoint, fail, import_from_cwd
from dppo.run.logs import counted


def register(sub: argparse._SubParsersAction) -> None:
    ev = sub.add_parser("eval", help="run greedy episodes from a checkpoint and print the mean return")
    ev.add_argument("--checkpoint", required=True, help="a ckpt-*.pt file or a run directory")
    ev.add_argument("--episodes", type=int, default=10, help="episodes to run (default 10)")
    ev.add_argument("--seed", type=int, default=0, help="seed of the first episode")
    ev.add_argument("--best", action="store_true",
                    help="the run's best evaluated weights (checkpoints/best.pt, run.eval_every) instead of the latest")
    ev.add_argument("--video", help="record videos of the episodes into this directory (needs moviepy)")
    ev.add_argument("--opponent", help="two-player games: who the policy plays, alternating seats: random (default), "
                    "minimax, minimax:DEPTH, snapshot:N or snapshot:latest (of the run's pool), or another checkpoint")
    ev.set_defaults(func=cmd_eval)


def make_eval_env(config: Any, video_dir: str | None) -> Any:
    import gymnasium as gym

    from dppo.envs.make import make_env

    if video_dir is None:
        return make_env(config.env)
    require_moviepy()
    render_off_screen()
    env = make_env(config.env, render_mode="rgb_array")
    return gym.wrappers.RecordVideo(env, video_dir, episode_trigger=lambda _: True, disable_logger=True)


def evaluate_policies(checkpoint: dict[str, Any], episodes: int, seed: int, video_dir: str | None = None
                      ) -> tuple[list[float], dict[str, list[float]]]:
    """A run of several policies (a policy map): greedy episodes of every policy at once in one env copy, seeds
    ``seed``, ``seed + 1``, ...; per episode the mean return over every agent, and each policy's agents' mean."""
    from dppo.config import validate
    from dppo.envs.make import make_parallel_envs
    from dppo.rl.agent import export_weights
    from dppo.rl.episodes import JointPlayers
    from dppo.run.trained import trained_policies

    config = validate(checkpoint["config"], warn=False)
    trained = trained_policies(checkpoint)
    if video_dir is not None:
        require_moviepy()
        render_off_screen()
    joint = make_parallel_envs(config, copies=1, render_mode=None if video_dir is None else "rgb_array")
    try:
        players = JointPlayers(joint, config)
        for name, part in trained.items():
            players.load(name, export_weights(part.model), 0, part.obs_stats)
        watch = None if video_dir is None else EpisodeVideos(joint.envs[0], Path(video_dir))
        return players.episodes(episodes, seed, greedy=True, watch=watch)
    finally:
        joint.close()


class EpisodeVideos:
    """One mp4 per episode of one env copy, named as gymnasium's RecordVideo names them (rl-video-episode-N.mp4):
    the video of a run of several policies, whose episodes are not one gymnasium Env's."""

    def __init__(self, env: Any, directory: Path) -> None:
        self.env, self.directory = env, directory
        self.fps = getattr(env, "metadata", {}).get("render_fps", 30)
        self.frames: list[Any] = []

    def __call__(self, episode: int, done: bool) -> None:
        self.frames.append(self.env.render())
        if done:
            from moviepy.video.io.ImageSequenceClip import ImageSequenceClip

            self.directory.mkdir(parents=True, exist_ok=True)
            ImageSequenceClip(self.frames, fps=self.fps).write_videofile(
                str(self.directory / f"rl-video-episode-{episode}.mp4"), logger=None)
            self.frames = []


def require_moviepy() -> None:
    """--video writes mp4 files with moviepy (gymnasium's RecordVideo does too)."""
    from dppo.errors import UsageError

    try:
        import moviepy  # noqa: F401
    except ImportError:
        raise UsageError("--video needs moviepy: pip install moviepy") from None


def render_off_screen() -> None:
    """Frames for a video need no screen and no sound. Envs drawn with pygame (classic control, Box2D, MPE,
    MiniGrid) start SDL's display, which without one tries X11 and then Wayland, whose library prints
    ``error: XDG_RUNTIME_DIR is invalid or not set`` before SDL falls back to drawing off screen; a full
    ``pygame.init()`` also opens ALSA, which prints its own errors on a machine without a sound card. SDL's dummy
    drivers draw the same frames without trying either. Set for this process only, and only where the user set
    no driver; on a machine with a display (DISPLAY or WAYLAND_DISPLAY), the video driver is left to SDL."""
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")


def evaluate(checkpoint: dict[str, Any], episodes: int, seed: int, video_dir: str | None = None,
             opponent: str | None = None) -> list[float]:
    """Raw returns of ``episodes`` greedy episodes, seeds ``seed``, ``seed + 1``, ...; a two-player game's against
    ``opponent`` (the first seat in games with an even seed, the second in odd ones)."""
    from dppo.config import validate
    from dppo.envs.selfplay import SelfPlayEnv
    from dppo.errors import UsageError
    from dppo.rl.agent import Agent, export_weights
    from dppo.rl.episodes import run_episodes
    from dppo.rl.transforms import ObsNormalizer
    from dppo.run.opponent_choice import make_opponents
    from dppo.run.trained import trained_model

    env = make_eval_env(validate(checkpoint["config"], warn=False), video_dir)
    try:
        trained = trained_model(checkpoint, (env.observation_space, env.action_space))
        config = trained.config
        game = env.unwrapped
        if isinstance(game, SelfPlayEnv):
            game.opponents = make_opponents(opponent or "random", checkpoint, config,
                                            (env.observation_space, env.action_space), seed)
        elif opponent is not None:
            raise UsageError(f"--opponent is for two-player turn-based games; {config.env.name!r} is not one: "
                             "leave --opponent out")
        agent = Agent(env.observation_space, env.action_space, config.model)
        agent.load(export_weights(trained.model), 0)
        normalize = ObsNormalizer(trained.obs_stats is not None, config.env.obs_clip, agent.obs_spec.vector_dim)
        if trained.obs_stats is not None:
            normalize.stats = trained.obs_stats
        returns = run_episodes(agent, env, normalize, episodes, seed, greedy=True)
    finally:
        env.close()
    return returns


def per_agent(checkpoint: dict[str, Any]) -> str:
    """" per agent" where an episode's return is its agents' mean (a multi-agent env, not a two-player game, whose
    return is the policy's seat's), else nothing."""
    multiagent = checkpoint["config"].get("env", {}).get("multiagent", False)
    return " per agent" if multiagent and checkpoint.get("league") is None else ""


def outcomes(returns: list[float], opponent: str, seed: int) -> str:
    """Wins, draws and losses (the sign of each game's return) per seat: the game seeded s plays seat s % 2
    (:class:`dppo.envs.selfplay.SelfPlayEnv`), and game i is seeded ``seed + i``."""
    def count(games: list[float]) -> str:
        return f"{sum(r > 0 for r in games)}/{sum(r == 0 for r in games)}/{sum(r < 0 for r in games)}"

    first, second = (returns[0::2], returns[1::2]) if seed % 2 == 0 else (returns[1::2], returns[0::2])
    return (f"against {opponent}, win/draw/loss: first seat {count(first)}, second seat {count(second)}, all "
            f"{count(returns)} of {counted(len(returns), 'game')}")


def cmd_eval(args: argparse.Namespace) -> int:
    if args.episodes < 1:
        fail("--episodes must be >= 1")
    existing_checkpoint(args.checkpoint)
    from dppo.run.checkpoint import load

    checkpoint = load(args.checkpoint, best=args.best)
    import_from_cwd()
    by_policy: dict[str, list[float]] = {}
    if checkpoint.get("policies") is not None:
        if args.opponent is not None:
            fail("--opponent is for two-player turn-based games; this checkpoint holds several policies of a "
                 "multi-agent env: leave --opponent out")
        returns, by_policy = evaluate_policies(checkpoint, args.episodes, args.seed, args.video)
    else:
        returns = evaluate(checkpoint, args.episodes, args.seed, args.video, args.opponent)
    mean = sum(returns) / len(returns)
    print(f"mean return {mean:.2f}{per_agent(checkpoint)} over {counted(len(returns), 'episode')} "
          f"(min {min(returns):.2f}, max {max(returns):.2f})")
    for name, part in by_policy.items():
        print(f"policy {name}: mean return {sum(part) / len(part):.2f} per agent (min {min(part):.2f}, "
              f"max {max(part):.2f})")
    if checkpoint.get("league") is not None:
        print(outcomes(returns, args.opponent or "random", args.seed))
    if args.video:
        from pathlib import Path

        videos = sorted(Path(args.video).glob("*.mp4"))
        print(f"videos: {counted(len(videos), 'mp4 file')} in {Path(args.video).resolve()}")
    return 0
