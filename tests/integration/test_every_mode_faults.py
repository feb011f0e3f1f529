"""Issue 54 through the real CLI on a real Ray cluster: what reached the main path reaches the side paths. A user's
PettingZoo module (two agents, named by its module alone) whose step raises now and then trains with the policy in
the actors and in the inference service, one copy of it too, and with a policy map; an error inside an actor is
named by its own line, not Ray's wrapper; a module that is no env says what it lacks. The in-process matrix of every
env kind and placement: tests/unit/test_fault_matrix.py."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import ray
from runs import error_line
from runs import progress_records as progress
from runs import run_dppo as dppo

from dppo.distributed.actor_pool import describe_task_error

PAIR = '''
from dppo.envs.flaky import FlakyPair


def parallel_env(every=60, **kwargs):
    return FlakyPair(every=every, **kwargs)
'''


def train_pair(ray_address: str, tmp_path: Path, name: str, *args: str) -> tuple[Path, str]:
    """A short run of the flaky two-agent module (about one step in 60 raises in the actors); its run dir, stderr."""
    (tmp_path / "pairmod.py").write_text(textwrap.dedent(PAIR))
    run = tmp_path / name
    done = dppo("train", "--env", "pairmod", "--actors", "1", "--segment-length", "128", "--total-steps", "1024",
                "--seed", "4", "--no-tensorboard", "--set", "ppo.num_minibatches=2", "--address", ray_address,
                "--run-dir", str(run), *args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return run, done.stderr


@pytest.mark.parametrize(("name", "args", "columns"), [
    ("actors", ["--envs-per-actor", "2"], 4),
    ("service", ["--envs-per-actor", "2", "--set", "run.inference=server"], 4),  # two halves of one copy each
    ("one-copy-served", ["--envs-per-actor", "1", "--set", "run.inference=server"], 2),
    ("policy-map", ["--envs-per-actor", "2", "--set", "policies={speak: [speaker], listen: [listener]}"], 4),
])
def test_a_flaky_users_pettingzoo_module_trains_in_every_mode(ray_address: str, tmp_path: Path, name: str,
                                                              args: list[str], columns: int) -> None:
    run, _ = train_pair(ray_address, tmp_path, name, *args)
    records = progress(run)
    assert [r["env_steps"] for r in records] == [columns * 128 * (i + 1) for i in range(len(records))]
    assert records[-1]["env_failures"] >= 2  # about 2 x 1024 / 60 cut agent-episodes; every one counted
    assert "the simulator lost its state (dppo.envs.flaky)" in (run / "train.log").read_text()
    if name == "policy-map":
        assert "speak/entropy" in records[-1] and "listen/entropy" in records[-1]


@ray.remote(num_cpus=0)
class Broken:
    def sample(self) -> None:
        import numpy as np

        np.zeros(2) + np.zeros(4)  # the line named


def test_an_error_inside_an_actor_is_named_by_its_own_line(ray_address: str) -> None:
    actor = Broken.remote()
    with pytest.raises(ray.exceptions.RayTaskError) as caught:
        ray.get(actor.sample.remote())
    line = describe_task_error(caught.value)
    here = Path(__file__).resolve()
    assert line.startswith("ValueError: operands could not be broadcast together with shapes (2,) (4,)")
    named = next(i for i, text in enumerate(here.read_text().splitlines(), 1) if text.endswith("# the line named"))
    assert line.endswith(f"(at {here}:{named})")
    assert "ray::" not in line and "pid=" not in line
    ray.kill(actor)


def test_a_module_that_is_no_env_says_what_it_lacks(tmp_path: Path) -> None:
    (tmp_path / "emptymod.py").write_text("X = 1\n")
    done = dppo("train", "--env", "emptymod", "--total-steps", "1", "--run-dir", str(tmp_path / "run"), cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "'emptymod' is a module that registers no gymnasium env under that name and has neither parallel_env() " \
           "nor env()" in error_line(done.stderr)
    assert not (tmp_path / "run").exists()
