"""PettingZoo envs through the real CLI on a real Ray cluster: MPE's simple_spread (shared policy, each agent a
column) trains, resumes, evaluates and reproduces itself from a seed; a user's own module whose agents leave
early, with an action mask per agent, trains with evaluation while training; bad input is one line, exit 2.
Short runs: they check the pipeline, not learning (no benchmark here)."""

from __future__ import annotations

import importlib.util
import json
import textwrap
from pathlib import Path

import pytest
import yaml
from conftest import CROWD
from runs import progress_records as progress
from runs import run_dppo as dppo
from runs import without_timings

SPREAD = ["--env", "mpe2.simple_spread_v3", "--envs-per-actor", "2", "--segment-length", "25", "--no-tensorboard",
          "--set", "env.kwargs.max_cycles=25", "--set", "ppo.minibatch_size=150"]  # 2 copies x 3 agents


def test_a_seeded_simple_spread_run_reproduces_itself(ray_address: str, tmp_path: Path) -> None:
    runs = []
    for name in ("a", "b"):
        done = dppo("train", *SPREAD, "--address", ray_address, "--run-dir", str(tmp_path / name), "--actors", "2",
                    "--seed", "5", "--total-steps", "900")
        assert done.returncode == 0, done.stderr
        runs.append(without_timings(progress(tmp_path / name)))
    assert runs[0] == runs[1] and len(runs[0]) == 3
    assert runs[0][0]["env_steps"] == 300 and runs[0][0]["episodes"] == 12  # 2 actors x 6 agent columns x 25 steps


def test_simple_spread_trains_resumes_and_evaluates(ray_address: str, tmp_path: Path) -> None:
    run = tmp_path / "run"
    done = dppo("train", *SPREAD, "--address", ray_address, "--run-dir", str(run), "--actors", "1", "--total-steps",
                "300")
    assert done.returncode == 0, done.stderr
    resumed = dppo("train", "--resume", "--address", ray_address, "--run-dir", str(run), "--total-steps", "600")
    assert resumed.returncode == 0, resumed.stderr
    assert [r["env_steps"] for r in progress(run)] == [150, 300, 450, 600]
    evaluated = dppo("eval", "--checkpoint", str(run), "--episodes", "2")
    assert evaluated.returncode == 0 and "mean return" in evaluated.stdout, evaluated.stderr


def test_mappos_centralized_critic_trains_evaluates_and_exports(ray_address: str, tmp_path: Path) -> None:
    run = tmp_path / "run"
    done = dppo("train", *SPREAD, "--address", ray_address, "--run-dir", str(run), "--actors", "1", "--total-steps",
                "300", "--set", "env.global_state=true", "--seed", "2")
    assert done.returncode == 0, done.stderr
    evaluated = dppo("eval", "--checkpoint", str(run), "--episodes", "1")
    assert evaluated.returncode == 0 and "mean return" in evaluated.stdout, evaluated.stderr
    exported = dppo("export", "--checkpoint", str(run), "-o", str(tmp_path / "policy.onnx"))
    assert exported.returncode == 0 and "obs.global_state" in exported.stdout, exported.stderr
    from dppo.run.checkpoint import load

    saved = load(run)
    assert saved["config"]["model"]["value_only_key"] == "global_state"
    assert saved["model"]["value_head.0.weight"].shape[1] == saved["model"]["policy_head.0.weight"].shape[1] + 54


@pytest.mark.parametrize(("example", "inputs"), [
    ("simple-spread.yaml", {"": 18 + 3}),  # one shared policy (its keys unprefixed); 18 numbers and a one-hot id
    ("simple-adversary.yaml", {"adversary": 8, "agent": 10}),  # a policy per role, each with its agents' inputs
])
def test_the_example_configs_train(ray_address: str, tmp_path: Path, example: str, inputs: dict[str, int]) -> None:
    from dppo.run.checkpoint import load, policy_entry

    run = tmp_path / "run"
    done = dppo("train", "--config", str(Path(__file__).parents[2] / "examples" / example), "--total-steps", "2400",
                "--no-tensorboard", "--address", ray_address, "--run-dir", str(run))
    assert done.returncode == 0, done.stderr
    (record,) = progress(run)
    assert record["episodes"] == 96  # 2 actors x 24 columns x two 25-step episodes
    assert record["env_steps"] == 2400 and record["episode_length_mean"] == 25 and record["policy_version"] == 1
    saved = load(run)
    for name, width in inputs.items():
        key = f"{name}/" if name else ""
        assert record[f"{key}approx_kl"] > 0 and record[f"{key}entropy"] > 0  # each policy updated on its own batch
        assert policy_entry(saved, name)["model"]["policy_head.0.weight"].shape[1] == width  # its agents' spaces
        assert f"{name} return=" in done.stdout
    if "adversary" in inputs:  # every agent's mean is the policies' means weighted by their agents (1 and 2)
        adversary, agent = record["adversary/episode_return_mean"], record["agent/episode_return_mean"]
        assert record["episode_return_mean"] == pytest.approx((adversary + 2 * agent) / 3)
        assert adversary < 0  # paid minus its distance to the goal: never positive


def test_a_users_module_whose_agents_leave_early_trains_with_masks_and_evaluation(
        ray_address: str, tmp_path: Path) -> None:
    (tmp_path / "crowd.py").write_text(textwrap.dedent(CROWD))
    run = tmp_path / "run"
    done = dppo("train", "--env", "crowd", "--set", "env.multiagent=true", "--set", "env.agent_id_in_obs=true",
                "--actors", "1", "--envs-per-actor", "2", "--segment-length", "21", "--total-steps", "100000",
                "--no-tensorboard", "--set", "ppo.minibatch_size=63", "--set", "run.eval_every=1", "--set",
                "run.eval_episodes=2", "--target-return", "4.99", "--set", "run.target_on=evaluation",
                "--address", ray_address, "--run-dir", str(run), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    records = progress(run)
    # every env episode lasts 7 steps (the last agent's life) and gives each agent one episode of its own life
    # (the first iteration's 18 episodes: 6 columns x 3 episodes); pressing its own button at every step earns it
    # 3, 5 and 7, a mean of 5 per agent; the untrained policy presses the other allowed button about half the time
    assert records[0]["episodes"] == 18 and records[0]["episode_return_mean"] < 4
    assert all(r["episode_length_mean"] == 7 for r in records)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["reason"] == "target_return"
    assert summary["eval_return_mean"] == pytest.approx(5)  # the agents' mean, played in turns: learned, every step
    evaluated = dppo("eval", "--checkpoint", str(run), "--episodes", "1", cwd=tmp_path)
    assert evaluated.returncode == 0 and "mean return 5.00" in evaluated.stdout, evaluated.stderr


def test_pettingzoo_envs_named_as_users_name_them_train_with_the_defaults(ray_address: str, tmp_path: Path) -> None:
    """env.num_envs counts env copies (8 by default: 24 agent columns of simple_spread), and a module of one's own
    with parallel_env() is a PettingZoo env without env.multiagent. The defaults whole, actors included: what a user
    who names the env gets."""
    (tmp_path / "crowd.py").write_text(textwrap.dedent(CROWD))
    for args, columns in ((["--env", "mpe2.simple_spread_v3"], 24), (["--env", "crowd"], 8 * 3)):
        run = tmp_path / args[1]
        done = dppo("train", *args, "--total-steps", "1", "--no-tensorboard", "--address", ray_address,
                    "--run-dir", str(run), cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        (record,) = progress(run)
        assert record["env_steps"] == 2 * columns * 128  # the defaults: 2 actors x 8 copies x agents x 128 steps
        assert yaml.safe_load((run / "config.yaml").read_text())["env"]["multiagent"] is True


def test_bad_multiagent_input_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "crowd.py").write_text(textwrap.dedent(CROWD) + textwrap.dedent('''
        class Odd(Crowd):
            def action_space(self, agent):
                return gym.spaces.Discrete(2 if agent == "a2" else 3)


        def odd_env():
            return Odd()
        '''))
    cases = [
        (["--set", "env.entry_point=crowd:odd_env", "--set", "env.multiagent=true", "--envs-per-actor", "3"],
         "have different spaces, and one policy acts for both; give them separate policies"),
    ]
    if importlib.util.find_spec("pymunk") is None:  # butterfly's dependency, not installed by the multiagent extra
        cases.append((["--env", "pettingzoo.butterfly.pistonball_v6"], "pip install 'pettingzoo[butterfly]'"))
    for args, message in cases:
        done = dppo("train", *args, "--run-dir", str(tmp_path / "run"), cwd=tmp_path, timeout=120)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert message in done.stderr
        assert not (tmp_path / "run").exists()


@pytest.fixture(autouse=True)
def _pettingzoo() -> None:
    pytest.importorskip("mpe2")
