"""What a log reader sees (`kubectl logs`: stdout not a terminal): a first line, flushed before Ray starts, that
names what is starting (a multi-agent env's copies and agents); a line once the run is up; the last line with the
time from launch beside the training time and what the run survived (env failures, actor restarts, lost nodes);
one-prefix argument errors; counts in the right number; per-agent returns said so; and no SDL chatter when
`dppo eval --video` renders on a machine without a display."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import CROWD, new_checkpoint

from dppo.commands.train import outcome_line, start_line
from dppo.config import load_config, preset_path
from dppo.run.checkpoint import CheckpointStore


def test_the_first_line_comes_before_ray_and_the_last_gives_the_time_from_launch(tmp_path: Path,
                                                                                  ray_address: str) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "dppo", "train", "--address", ray_address, "--run-dir", str(run_dir),
                             "--actors", "1", "--envs-per-actor", "8", "--segment-length", "32", "--total-steps", "256",
                             "--set", "ppo.minibatch_size=64", "--no-tensorboard"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        first = proc.stdout.readline().rstrip("\n")
        running = proc.poll() is None  # the line came flushed, while the run was still starting
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert running, "the first line came only when the process ended: not flushed"
    assert first == (f"training CartPole-v1 from the preset {preset_path('CartPole-v1')}: 1 actor "
                     "x 8 envs, learner device auto (decided at start-up), inference in the actors, "
                     f"run dir {run_dir}; joining Ray at {ray_address}"), first
    lines = out.splitlines()
    assert re.fullmatch(r"started in \d+\.\d s from launch \(Ray \d+\.\d s\): learner on cpu, inference in the actors "
                        r"\(auto: no `dppo tune` result for CartPole-v1 on this machine\)", lines[0]), lines[0]
    assert lines[1].startswith("iter=1 ") and len(lines) == 3, out
    last = re.fullmatch(r"stopped \(total_steps\): return \S+ after 256 env steps, 1 iteration, (\d+\.\d) s training, "
                        r"(\d+\.\d) s from launch -> .*summary\.json", lines[2])
    assert last, lines[2]
    summary = json.loads((run_dir / "summary.json").read_text())
    training_s, launch_s = float(last[1]), float(last[2])
    assert training_s == round(summary["wall_s"], 1)
    assert launch_s >= sum(summary["startup_s"].values()) + summary["wall_s"] - 0.1  # start-up included
    logged = [line.split(" ", 1)[1] for line in (run_dir / "train.log").read_text().splitlines()]
    assert logged == [first, *lines]  # train.log keeps the lines said before the run dir existed


def test_the_first_line_says_settings_as_given_and_where_the_config_came_from(tmp_path: Path) -> None:
    config = load_config(overrides={"run.run_dir": "runs/x", "run.actors": 1, "env.num_envs": 1},
                         sets=["run.device=cpu", "run.inference=actor", "run.address=10.0.0.1:6379",
                               "ppo.minibatch_size=64"])
    line = start_line(config, "my.yaml", resumed=True)
    assert line == ("resuming CartPole-v1 from my.yaml: 1 actor x 1 env, learner on cpu, inference in the actors, "
                    "run dir runs/x; joining Ray at 10.0.0.1:6379")
    config = load_config(sets=["run.learners=2", "run.inference=server", "env.num_envs=4"])
    line = start_line(config, "the defaults", resumed=False)
    assert ("from the defaults: 2 actors x 4 envs, 2 learners device auto (decided at start-up), inference in one "
            "inference service,") in line, line
    assert line.endswith("; starting a local Ray") or "RAY_ADDRESS" in os.environ, line


def test_a_multiagent_start_line_says_copies_and_agents(tmp_path: Path, ray_address: str) -> None:
    """env.num_envs counts copies of a PettingZoo env, each of its agents a column: the line says both."""
    (tmp_path / "crowd.py").write_text(textwrap.dedent(CROWD))
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "dppo", "train", "--env", "crowd", "--actors", "1",
                             "--envs-per-actor", "2", "--address", ray_address, "--run-dir", str(run_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        first = proc.stdout.readline().rstrip("\n")
        proc.send_signal(signal.SIGTERM)  # the line is the subject, not the run
        proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert first.startswith("training crowd from the defaults: 1 actor x 2 copies x 3 agents, learner "), first


def test_the_last_line_counts_env_failures_in_a_run_shorter_than_the_count_line(tmp_path: Path,
                                                                                 ray_address: str) -> None:
    """One env failure warned when it happened, and counted again on the last line: a run shorter than the 30 s
    between count lines would otherwise never say how many there were."""
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "dppo", "train", "--env", "dppo/Faulty-v0", "--set",
                           "env.kwargs={fail_at: 300}", "--actors", "1", "--envs-per-actor", "8", "--segment-length",
                           "64", "--total-steps", "1024", "--set", "ppo.minibatch_size=128", "--no-tensorboard",
                           "--address", ray_address, "--run-dir", str(run_dir)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_failures"] == 1, summary
    assert "env failures:" not in done.stdout  # no count line said it (one failure never makes one)
    last = done.stdout.splitlines()[-1]
    assert re.fullmatch(r"stopped \(total_steps\): return \S+ after 1,024 env steps, 2 iterations, \d+\.\d s training, "
                        r"\d+\.\d s from launch; 1 env failure -> .*summary\.json", last), last
    assert (run_dir / "train.log").read_text().splitlines()[-1].endswith(last)


def test_the_last_line_names_what_the_run_survived_only_when_it_happened() -> None:
    summary = {"solved": False, "reason": "time_limit", "episode_return_mean": 21.5, "env_steps": 4096,
               "iterations": 2, "wall_s": 61.04, "env_failures": 40, "actor_restarts": 3, "actor_crashes": 1,
               "node_losses": 1, "learner_restarts": 0, "segments_dropped": 0, "updates_skipped": 1,
               "eval_return_mean": 30.0, "eval_env_steps": 4096}
    line = outcome_line(summary, None, Path("runs/x"))
    assert re.fullmatch(r"stopped \(time_limit\): return 21.50 \(eval 30.00 of the final weights\) after 4,096 env "
                        r"steps, 2 iterations, 61.0 s training, \d+\.\d s from launch; 40 env failures, 3 actor "
                        r"restarts, 1 lost node, 1 NaN/Inf update -> runs/x/summary.json", line), line
    quiet = {**summary, "env_failures": 0, "actor_restarts": 0, "node_losses": 0, "updates_skipped": 0,
             "eval_env_steps": 2048}
    line = outcome_line(quiet, None, Path("runs/x"))
    assert "(eval 30.00 of the weights at 2,048 env steps)" in line and "; " not in line, line


@pytest.mark.parametrize(("argv", "expected"), [
    (["train", "--actors", "abc"],
     "dppo: error: argument --actors: invalid int value: 'abc' (see dppo train --help)\n"),
    (["eval"], "dppo: error: the following arguments are required: --checkpoint (see dppo eval --help)\n"),
    (["train", "--envs", "CartPole-v1"], "dppo: error: unrecognized arguments: --envs CartPole-v1; did you mean --env "
                                         "or --envs-per-actor? (see dppo train --help)\n"),
])
def test_an_argument_error_has_one_prefix(argv: list[str], expected: str, dppo_cmd: list[str],
                                          tmp_path: Path) -> None:
    done = subprocess.run([*dppo_cmd, *argv], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2 and done.stderr == expected, done.stderr


def headless() -> dict[str, str]:
    """This process's environment as on a server without a display or a user session, SDL left to choose."""
    drop = ("DISPLAY", "WAYLAND_DISPLAY", "XDG_RUNTIME_DIR", "SDL_VIDEODRIVER", "SDL_AUDIODRIVER")
    return {k: v for k, v in os.environ.items() if k not in drop}


def test_eval_of_one_episode_with_a_video_on_a_headless_machine(tmp_path: Path) -> None:
    """The counts in the singular, and pygame's rendering (CartPole) prints nothing about the missing display."""
    run = tmp_path / "run"
    config = load_config(overrides={"run.run_dir": str(run)})
    CheckpointStore(run / "checkpoints", 3).save(new_checkpoint(config)[0], 1)
    videos = tmp_path / "videos"
    done = subprocess.run([sys.executable, "-m", "dppo", "eval", "--checkpoint", str(run), "--episodes", "1",
                           "--video", str(videos)], capture_output=True, text=True, timeout=300, env=headless(),
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "XDG_RUNTIME_DIR" not in done.stderr and "ALSA" not in done.stderr, done.stderr
    assert re.match(r"mean return \S+ over 1 episode \(min", done.stdout), done.stdout
    assert f"videos: 1 mp4 file in {videos.resolve()}" in done.stdout
    assert len(list(videos.glob("*.mp4"))) == 1


def test_multiagent_eval_says_its_mean_return_is_per_agent(tmp_path: Path) -> None:
    run = tmp_path / "run"
    config = load_config(overrides={"env.id": "mpe2.simple_spread_v3", "run.run_dir": str(run)},
                         sets=["env.num_envs=3", "env.kwargs.max_cycles=5"])
    CheckpointStore(run / "checkpoints", 3).save(new_checkpoint(config)[0], 1)
    videos = tmp_path / "videos"
    done = subprocess.run([sys.executable, "-m", "dppo", "eval", "--checkpoint", str(run), "--episodes", "2",
                           "--video", str(videos)], capture_output=True, text=True, timeout=300, env=headless(),
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "XDG_RUNTIME_DIR" not in done.stderr, done.stderr
    assert re.match(r"mean return \S+ per agent over 2 episodes \(min", done.stdout), done.stdout
