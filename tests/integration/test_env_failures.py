"""An env that raises now and then (issue 45, item 1): only the copy that raised is recreated, its episode cut and
never counted as a return, the rest of the segment kept; each failure counted (segment, progress.jsonl,
summary.json, Prometheus), warned once with the user's file:line; the run stops only past
faults.max_env_failure_share of episodes, or when an env never gets through a reset."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from runs import progress_records

from dppo.config import load_config
from dppo.envs.failures import EnvFailure
from dppo.errors import RunFailure
from dppo.rl.sampler import Sampler
from dppo.rl.segment import EnvFailures
from dppo.run.reporting import Reporter
from dppo.run.run_dir import RunDir
from dppo.run.state import RunState

MYSIM = textwrap.dedent('''
    """A user's simulator: CartPole whose step raises on about one step in ``every`` (its own seeded stream)."""
    import gymnasium as gym
    import numpy as np


    class FlakyCartPole(gym.Wrapper):
        raised = 0  # in this process
        natural = []  # returns of the episodes that ended by themselves, in this process, in order

        resets = 0  # in this process

        def __init__(self, every=400, resets_allowed=None):
            super().__init__(gym.make("CartPole-v1"))
            self.every, self.resets_allowed = every, resets_allowed
            self.rng, self.ret = np.random.default_rng(0), 0.0

        def reset(self, *, seed=None, options=None):
            FlakyCartPole.resets += 1
            if self.resets_allowed is not None and FlakyCartPole.resets > self.resets_allowed:
                raise RuntimeError("no licence for the simulator")
            if seed is not None:
                self.rng = np.random.default_rng(seed + 7)
            self.ret = 0.0
            return self.env.reset(seed=seed, options=options)

        def step(self, action):
            if self.rng.random() < 1 / self.every:
                FlakyCartPole.raised += 1
                raise ValueError("the simulator lost its state")
            obs, reward, terminated, truncated, info = self.env.step(action)
            self.ret += reward
            if terminated or truncated:
                FlakyCartPole.natural.append(self.ret)
            return obs, reward, terminated, truncated, info
''')
RAISE_LINE = next(i for i, line in enumerate(MYSIM.splitlines(), 1) if "raise ValueError" in line)
SMALL = ["--segment-length", "128", "--no-tensorboard", "--set", "run.target_return=null"]
TWO_ACTORS = ["--actors", "2", "--envs-per-actor", "8"]  # failures counted per actor and warned once across them


@pytest.fixture
def mysim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The user's module in their project directory, imported afresh by each test (its counters start at 0)."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "mysim.py").write_text(MYSIM)
    monkeypatch.syspath_prepend(str(project))
    yield project
    sys.modules.pop("mysim", None)


def flaky_config(every: int, **overrides: object):
    return load_config(overrides={"env.entry_point": "mysim:FlakyCartPole", "env.kwargs": {"every": every},
                                  "env.num_envs": 8, "ppo.segment_length": 128, **overrides})


def test_only_the_env_that_raised_is_recreated_and_its_episode_never_counts(mysim: Path) -> None:
    import mysim as module

    sampler = Sampler(flaky_config(400))
    segments = [sampler.sample() for _ in range(6)]  # 6 x 8 x 128 steps: about 15 raise
    assert module.FlakyCartPole.raised >= 5
    assert sum(s.env_failures.count for s in segments) == module.FlakyCartPole.raised  # each one counted
    assert sampler.env_resets == 0  # the vector env was never restarted: every segment kept whole
    # the returns recorded are exactly those of the episodes that ended by themselves: no cut-short one
    recorded = np.concatenate([s.episode_returns for s in segments]).tolist()
    assert recorded == module.FlakyCartPole.natural
    failed = next(s for s in segments if s.env_failures.count)
    assert failed.env_failures.first == (f"ValueError: the simulator lost its state (at {mysim / 'mysim.py'}:"
                                         f"{RAISE_LINE})")
    assert "Traceback" in failed.env_failures.details
    # the failed step is an episode cut bootstrapped from the last observation, never a terminal state
    cuts = sum(int(s.truncated.sum()) for s in segments)
    assert cuts >= module.FlakyCartPole.raised and sum(int(s.terminated.sum()) for s in segments) == len(recorded)


def test_an_async_vector_env_recreates_the_copy_in_its_worker(mysim: Path) -> None:
    sampler = Sampler(flaky_config(50, **{"env.vectorization": "async", "env.num_envs": 2}))
    try:
        segment = sampler.sample()
    finally:
        sampler.close()
    assert segment.env_failures.count > 0 and sampler.env_resets == 0
    assert segment.env_failures.first.startswith("ValueError: the simulator lost its state (at ")


def test_the_count_survives_a_resume_and_a_share_past_the_setting_stops_the_run(mysim: Path) -> None:
    config = flaky_config(400, **{"run.actors": 2})
    state = RunState(config, 4)
    sampler = Sampler(config, actor_id=1)
    segment = sampler.sample()
    segment.env_failures = EnvFailures(3, "ValueError: boom (at mysim.py:7)", "Traceback ...")
    state.absorb([segment])
    resumed = RunState(config, 4)
    resumed.restore(state.to_state())
    assert resumed.counters.env_failures == 3 and resumed.counters.env_failures_by_actor == {"1": 3}
    segment = sampler.sample()
    finished = len(segment.episode_returns) + resumed.counters.episodes
    segment.env_failures = EnvFailures(finished, "ValueError: boom (at mysim.py:7)", "Traceback ...")
    with pytest.raises(RunFailure, match=r"^env mysim:FlakyCartPole: \d+ of the \d+ episodes ended so far were cut by "
                                         r"the env raising \(5\d%, more than faults.max_env_failure_share 0.5\); the "
                                         r"last: ValueError: boom \(at mysim.py:7\); fix the env"):
        resumed.absorb([segment])


def test_an_env_that_never_gets_through_a_reset_is_an_env_failure(mysim: Path) -> None:
    """The licence runs out after the first resets: the first episode's end cannot start another."""
    sampler = Sampler(flaky_config(400, **{"env.kwargs": {"resets_allowed": 8}, "faults.env_retries": 2}))
    with pytest.raises(EnvFailure, match=r"env mysim:FlakyCartPole never got through a reset \(tried 3 times, "
                                         r"recreating it each time\): RuntimeError: no licence for the simulator "
                                         r"\(at .*mysim.py:\d+\)"):
        sampler.sample()
    assert sampler.env_resets == 0  # no whole-vector-env retry: the copy's own retries were spent


def test_the_first_failure_is_warned_with_file_line_then_counted_at_most_every_30_s(
        mysim: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = flaky_config(50)
    sampler, run_dir = Sampler(config), RunDir(tmp_path / "run")
    run_dir.path.mkdir()
    reporter = Reporter(config, run_dir)
    total = 0
    for _ in range(3):
        segment = sampler.sample()
        total += segment.env_failures.count
        reporter.env_failures([segment], total)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("env mysim:FlakyCartPole raised in actor 0: ValueError: "
                                                   f"the simulator lost its state (at {mysim / 'mysim.py'}:")
    assert "Traceback" in run_dir.log.read_text()
    reporter.failures_said = (reporter.failures_said[0] - 31, reporter.failures_said[1])  # 31 s later
    segment = sampler.sample()
    reporter.env_failures([segment], total + segment.env_failures.count)
    assert capsys.readouterr().err == (f"env failures: {total + segment.env_failures.count} so far (last: "
                                       f"{segment.env_failures.first})\n")
    exposed = reporter.metrics.registry.get_sample_value("dppo_env_failures_total", {"actor": "0"})
    assert exposed == total + segment.env_failures.count


def train(project: Path, run_dir: Path, ray_address: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dppo", "train", *SMALL, *args,
                           "--run-dir", str(run_dir), "--address", ray_address],
                          cwd=project, capture_output=True, text=True, timeout=300)


def test_a_run_with_an_env_that_raises_now_and_then_trains_and_says_so(mysim: Path, ray_address: str) -> None:
    run_dir = mysim / "run"
    done = train(mysim, run_dir, ray_address, *TWO_ACTORS, "--set", "env.entry_point=mysim:FlakyCartPole",
                 "--set", "env.kwargs.every=100", "--total-steps", "8192")
    assert done.returncode == 0, done.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_failures"] > 0 and summary["reason"] == "total_steps"
    assert sum(summary["env_failures_by_actor"].values()) == summary["env_failures"]
    records = progress_records(run_dir)
    assert records[-1]["env_failures"] == summary["env_failures"] and all(r["segments"] == 2 for r in records)
    warned = [line for line in done.stderr.splitlines() if "raised in actor" in line]
    assert len(warned) == 1 and f"mysim.py:{RAISE_LINE})" in warned[0], done.stderr


def test_failures_past_the_share_of_episodes_stop_the_run_with_one_line(mysim: Path, ray_address: str) -> None:
    run_dir = mysim / "run"
    # one actor (of 16 envs: the 2048-step round of two of 8): the stop needs no second actor's start-up
    done = train(mysim, run_dir, ray_address, "--actors", "1", "--envs-per-actor", "16", "--set",
                 "env.entry_point=mysim:FlakyCartPole", "--set", "env.kwargs.every=4", "--total-steps", "100000")
    assert done.returncode == 1, done.stderr
    last = done.stderr.splitlines()[-1]
    assert "of the" in last and "episodes ended so far were cut by the env raising" in last, done.stderr
    assert "faults.max_env_failure_share 0.5" in last and f"mysim.py:{RAISE_LINE})" in last, done.stderr
    assert json.loads((run_dir / "summary.json").read_text())["reason"] == "error"


@pytest.mark.parametrize("value", ["0", "1.5", "lots"])
def test_a_bad_failure_share_is_one_line(value: str, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "dppo", "train", "--set", f"faults.max_env_failure_share={value}",
                           "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "faults.max_env_failure_share" in done.stderr and not (tmp_path / "run").exists()
