"""The one recovery path of every env kind (:func:`dppo.envs.failures.fresh_copy`, issue 62 item 5): a broken env
closed, a fresh one started, its start retried on another fresh one with its own seed, and past the retries one
EnvFailure naming the env, the tries and the user's file:line. A gymnasium copy (:class:`RecreateOnFailure`), a
PettingZoo Parallel copy and a self-play game go through it; the whole vector env remade mid-segment:
tests/unit/test_env_remade.py."""

from __future__ import annotations

import gymnasium as gym
import pytest

from dppo.config import load_config
from dppo.envs.failures import RESEED_STEP, EnvFailure, RecreateOnFailure, fresh_copy
from dppo.envs.flaky import FlakyPair, FlakyTurns
from dppo.envs.make import with_agents
from dppo.errors import UsageError
from dppo.rl.sampler import Sampler


class Copy:
    """An env copy that records its start's seed and whether it was closed; its start raises when told."""

    def __init__(self, made: list[Copy], bad: bool) -> None:
        self.bad, self.closed, self.seed = bad, False, None
        made.append(self)

    def start(self, seed: int) -> str:
        self.seed = seed
        if self.bad:
            raise ConnectionError("the simulator did not come back")
        return "started"

    def close(self) -> None:
        self.closed = True


def test_a_start_that_raises_is_retried_on_a_fresh_copy_with_its_own_seed() -> None:
    made: list[Copy] = []
    broken = Copy(made, bad=False)
    bad = iter([True, True, False])
    failed: list[tuple[str, str]] = []
    copy, started = fresh_copy(lambda: Copy(made, next(bad)), lambda env: env.start(100 + len(made)), "sim", 2,
                               broken, failed=failed)
    assert started == "started" and copy is made[-1] and not copy.closed
    assert [env.closed for env in made] == [True, True, True, False]  # the broken one and each failed try closed
    assert [env.seed for env in made[1:]] == [102, 103, 104]  # each try its own seed, as the caller draws it
    assert [line for line, _ in failed] == [f"ConnectionError: the simulator did not come back (at {__file__}:"
                                            f"{Copy.start.__code__.co_firstlineno + 3})"] * 2


def test_past_its_retries_one_env_failure_names_the_env_the_tries_and_the_users_file_and_line() -> None:
    made: list[Copy] = []
    with pytest.raises(EnvFailure, match=r"^env sim never got through a reset \(tried 3 times, recreating it each "
                                         r"time\): ConnectionError: the simulator did not come back \(at "
                                         r".*test_fresh_copy\.py:\d+\)$") as raised:
        fresh_copy(lambda: Copy(made, bad=True), lambda env: env.start(0), "sim", 2)
    assert "Traceback" in raised.value.details and len(made) == 3  # 1 try and 2 retries, each on a fresh copy
    with pytest.raises(EnvFailure, match=r"^env sim raised in step \(ValueError: boom\), and its vector env made "
                                         r"afresh could not reset in 1 tries: ConnectionError"):
        fresh_copy(lambda: Copy(made, bad=True), lambda env: env.start(0), "sim", 0, cause="ValueError: boom")


def test_what_no_retry_mends_is_raised_at_once() -> None:
    made: list[Copy] = []

    def start(env: Copy) -> None:
        raise UsageError("env sim: the old gym API")

    with pytest.raises(UsageError, match="old gym API"):
        fresh_copy(lambda: Copy(made, bad=False), start, "sim", 3)
    assert len(made) == 1


class Falls(gym.Wrapper):
    """CartPole whose step raises at ``plan["step_at"]`` and whose reset raises for the copies in ``plan["bad"]``
    (numbered as made), recording each copy's reset seeds."""

    def __init__(self, plan: dict) -> None:
        super().__init__(gym.make("CartPole-v1"))
        plan["made"] += 1
        self.number, self.plan, self.steps = plan["made"], plan, 0

    def reset(self, *, seed=None, options=None):
        self.plan["seeds"].append((self.number, seed))
        if self.number in self.plan["bad"]:
            raise ConnectionError("the simulator did not come back")
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        self.steps += 1
        if self.steps == self.plan["step_at"]:
            raise RuntimeError("the simulator fell over")
        return self.env.step(action)


def test_a_gymnasium_copy_that_raised_is_made_afresh_its_reset_retried_with_reproducible_seeds() -> None:
    plan = {"made": 0, "step_at": 3, "bad": {2}, "seeds": []}
    copy = RecreateOnFailure(lambda: Falls(plan), "sim", reset_tries=2)
    copy.reset(seed=7)
    copy.step(0)
    copy.step(0)
    _, reward, terminated, truncated, _ = copy.step(0)  # the step that raises: an episode cut, not a terminal state
    assert (reward, terminated, truncated) == (0.0, False, True)
    _, info = copy.reset()
    assert plan["seeds"] == [(1, 7), (2, 7 + RESEED_STEP), (3, 7 + 2 * RESEED_STEP)]
    assert info["env_failure"].startswith("ConnectionError: the simulator did not come back (at ")  # the last try's
    assert copy.env.number == 3 and copy.recreated == 2


def test_a_gymnasium_copy_whose_reset_at_an_episode_end_keeps_raising_is_one_env_failure() -> None:
    plan = {"made": 0, "step_at": 0, "bad": set(), "seeds": []}
    copy = RecreateOnFailure(lambda: Falls(plan), "sim", reset_tries=0)
    copy.reset(seed=7)
    plan["bad"].add(1)  # its reset after an episode's end raises, and it has no retry
    with pytest.raises(EnvFailure, match=r"^env sim never got through a reset \(tried 1 times, recreating it each "
                                         r"time\): ConnectionError: the simulator did not come back \(at "
                                         r".*test_fresh_copy\.py:\d+\)$"):
        copy.reset()
    assert plan["seeds"] == [(1, 7), (1, None)]  # tried on the copy itself, unseeded, then no fresh one


def never_back(seed: int | None) -> None:
    """A fresh copy's reset (seeded far from the start's seeds) raises: the simulator never comes back."""
    if seed is not None and seed > 1_000_000:
        raise ConnectionError("the simulator did not come back")


class PairNeverBack(FlakyPair):
    def reset(self, seed=None, options=None):
        never_back(seed)
        return super().reset(seed=seed, options=options)


class TurnsNeverBack(FlakyTurns):
    def reset(self, seed=None, options=None):
        never_back(seed)
        return super().reset(seed=seed, options=options)


def pair_never_back() -> PairNeverBack:
    return PairNeverBack(every=3, anywhere=True)


def turns_never_back() -> TurnsNeverBack:
    from pettingzoo.classic import tictactoe_v3

    return TurnsNeverBack(tictactoe_v3.env(), every=3, anywhere=True)


@pytest.mark.parametrize("entry_point", ["pair_never_back", "turns_never_back"])
def test_a_multiagent_copy_never_back_is_one_env_failure_with_the_users_file_and_line(entry_point: str) -> None:
    name = f"test_fresh_copy:{entry_point}"  # a PettingZoo Parallel copy, a self-play game
    sampler = Sampler(with_agents(load_config(overrides={
        "env.entry_point": name, "env.multiagent": True, "env.num_envs": 2, "ppo.segment_length": 32,
        "ppo.num_minibatches": 1, "faults.env_retries": 2, "model.hidden_sizes": [32]})))
    with pytest.raises(EnvFailure, match=rf"^env {name} never got through a reset \(tried 3 times, recreating it "
                                         r"each time\): ConnectionError: the simulator did not come back \(at "
                                         r".*test_fresh_copy\.py:\d+\)$"):
        for _ in range(4):
            sampler.sample()


class TurnsResetFailsOnce(FlakyTurns):
    """Tic-tac-toe whose first reset after a finished game (unseeded) raises, once in the process."""

    raised = False

    def reset(self, seed=None, options=None):
        if seed is None and not TurnsResetFailsOnce.raised:
            TurnsResetFailsOnce.raised = True
            raise ConnectionError("the next game did not start")
        return super().reset(seed=seed, options=options)


def turns_reset_fails_once() -> TurnsResetFailsOnce:
    from pettingzoo.classic import tictactoe_v3

    return TurnsResetFailsOnce(tictactoe_v3.env(), every=10**9, anywhere=True)


def test_a_game_whose_next_reset_raises_is_made_afresh_alone() -> None:
    """A self-play game over, the next one's reset raises: that copy alone is made afresh (one failure counted, with
    the user's file:line), the other games play on; not the whole vector env remade, every game cut."""
    name = "test_fresh_copy:turns_reset_fails_once"
    sampler = Sampler(with_agents(load_config(overrides={
        "env.entry_point": name, "env.multiagent": True, "env.num_envs": 4, "ppo.segment_length": 32,
        "ppo.num_minibatches": 1, "model.hidden_sizes": [32]})))
    try:
        failures = [sampler.sample().env_failures for _ in range(2)]
    finally:
        sampler.close()
    assert TurnsResetFailsOnce.raised
    assert sum(f.count for f in failures) == 1, [f.count for f in failures]
    first = next(f.first for f in failures if f.count)
    assert first.startswith("ConnectionError: the next game did not start (at ") and "test_fresh_copy.py" in first
