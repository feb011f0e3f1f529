"""The user docs' examples run as written: the command is read from the page itself (docs/environments.md,
docs/sweeps.md, moved there from the README), so the two cannot drift."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys

from runs import REPO

README = "\n".join((REPO / path).read_text() for path in ("README.md", "docs/environments.md", "docs/sweeps.md"))


def readme_command(marker: str) -> list[str]:
    """The `dppo ...` line of the README's shell block that mentions ``marker``, as argv."""
    for block in re.findall(r"```sh\n(.*?)```", README, re.S):
        for line in block.splitlines():
            if line.startswith("dppo ") and marker in line:
                return shlex.split(line.split("#")[0])
    raise AssertionError(f"no `dppo` command mentioning {marker!r} in README.md or its docs pages")


def test_the_minigrid_example_trains_as_written(tmp_path, ray_address: str) -> None:
    """The docs' command as written, one iteration (of one actor's 16 envs: the default 2 actors' 2048 steps, an
    actor's start-up less; the example leaves the actors to the defaults); that it reaches the optimum at its budget
    is a benchmark (`python -m benchmarks learning-checks --only minigrid-example`)."""
    argv = readme_command("examples/minigrid.yaml")
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", *argv, "--address", ray_address, "--run-dir", str(run_dir),
                           "--no-tensorboard", "--total-steps", "2048", "--actors", "1", "--envs-per-actor", "16"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] == 2048 and summary["target_return"] == 0.95, summary


def test_the_raw_minigrid_env_is_answered_with_the_key_to_drop(tmp_path) -> None:
    done = subprocess.run([sys.executable, "-m", "dppo", "train", "--env", "minigrid:MiniGrid-Empty-5x5-v0",
                           "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "obs['mission']: MissionSpace cannot be encoded; drop that key with" in done.stderr
    assert "FilterObservation" in done.stderr and not (tmp_path / "run").exists()


def test_the_fix_the_message_names_works(tmp_path, ray_address: str) -> None:
    """FilterObservation, as the message writes it, makes MiniGrid's Dict trainable (image and direction)."""
    done = subprocess.run([sys.executable, "-m", "dppo", "train", "--env", "minigrid:MiniGrid-Empty-5x5-v0",
                           "--set", "env.wrappers=[{name: FilterObservation, kwargs: {filter_keys: [image, "
                           "direction]}}]", "--total-steps", "2048", "--actors", "1", "--envs-per-actor", "16",
                           "--address", ray_address, "--run-dir", str(tmp_path / "run"), "--no-tensorboard"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def test_the_lstm_example_is_the_file_and_trains_as_written(tmp_path, ray_address: str) -> None:
    """The page shows the file, and its command trains an LSTM (two iterations); that it solves its memory task is a
    benchmark (`python -m benchmarks learning-checks --only lstm-example`)."""
    import yaml

    shown = re.search(r"```yaml\n# examples/cue-corridor-lstm.yaml[^\n]*\n(.*?)```", README, re.S)
    assert shown and yaml.safe_load(shown.group(1)) == yaml.safe_load((REPO / "examples/cue-corridor-lstm.yaml")
                                                                       .read_text())
    argv = readme_command("examples/cue-corridor-lstm.yaml")
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", *argv, "--address", ray_address, "--run-dir", str(run_dir),
                           "--no-tensorboard", "--total-steps", "1024"], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] == 1024 and summary["target_return"] == 0.95, summary
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["model"]["recurrent"] == "lstm"


def test_the_sweep_example_is_the_file_and_checks_out() -> None:
    import yaml

    from dppo.sweep.spec import load_sweep

    shown = re.search(r"```yaml\n(base: \{env: Pendulum-v1\}.*?)```", README, re.S)
    assert shown and yaml.safe_load(shown.group(1)) == yaml.safe_load((REPO / "examples/sweep-pendulum.yaml")
                                                                       .read_text())
    sweep = load_sweep(REPO / "examples/sweep-pendulum.yaml")
    assert sweep.spec.scheduler.name == "asha" and set(sweep.space) == {"ppo.learning_rate", "ppo.gae_lambda",
                                                                        "ppo.clip_coef"}
    assert readme_command("examples/sweep-pendulum.yaml")[:2] == ["dppo", "sweep"]
