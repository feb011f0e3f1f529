"""The run's end and evaluation (issue 55, item 8): the evaluation in flight is waited for, then the final weights
are evaluated, so summary.json holds the evaluation of what was saved; a stop signal or the wait's bound ends the
waiting, never a result."""

from __future__ import annotations

import ray
from fake_ray import Call, FakeRayCalls, Script

from dppo.config import load_config
from dppo.distributed.evaluation import FINISH_WAIT_S, Evaluation


def evaluation(seconds: float, every: int = 2, hang_timeout_s: float | None = None) -> tuple[Evaluation, FakeRayCalls]:
    """An evaluation whose calls take ``seconds`` of fake time and return the weights they were given, as returns."""
    calls = FakeRayCalls(lambda index, spawn: Script(calls=lambda n: Call(seconds)),
                         sample=lambda index, seed, broadcast: [float(broadcast)])
    config = load_config(overrides={"run.eval_every": every, "faults.hang_timeout_s": hang_timeout_s})
    return Evaluation(config, calls), calls


def test_the_end_waits_for_the_evaluation_in_flight_then_evaluates_the_final_weights() -> None:
    ended, calls = evaluation(30.0)
    ended.submit(2, iteration=2, env_steps=200)  # the weights after iteration 2, still running when the run ends
    results = ended.finish(3, iteration=3, env_steps=300, stopped=lambda: False)
    assert [(r.iteration, r.env_steps, r.returns) for r in results] == [(2, 200, [2.0]), (3, 300, [3.0])]
    assert ended.in_flight is None and calls.now() >= 60.0  # both waited for, one after the other


def test_the_final_weights_are_evaluated_whatever_eval_every_says() -> None:
    ended, _ = evaluation(1.0, every=5)
    (result,) = ended.finish(7, iteration=7, env_steps=700, stopped=lambda: False)
    assert (result.iteration, result.returns) == (7, [7.0])


def test_a_stop_signal_or_the_bound_ends_the_wait_and_leaves_what_did_not_finish() -> None:
    stopped, _ = evaluation(30.0)
    stopped.submit(2, iteration=2, env_steps=200)
    assert stopped.finish(3, iteration=3, env_steps=300, stopped=lambda: True) == []
    assert stopped.in_flight is not None  # the caller says it did not finish
    stuck, calls = evaluation(10 * FINISH_WAIT_S, hang_timeout_s=100 * FINISH_WAIT_S)  # slow, not hung
    stuck.submit(2, iteration=2, env_steps=200)
    assert stuck.finish(3, iteration=3, env_steps=300, stopped=lambda: False) == []
    assert stuck.in_flight is not None and calls.now() <= FINISH_WAIT_S + 1  # the final weights not queued behind it


def test_a_run_without_evaluation_or_without_training_evaluates_nothing() -> None:
    off, _ = evaluation(1.0, every=0)
    assert off.finish(3, iteration=3, env_steps=300, stopped=lambda: False) == []
    untrained, _ = evaluation(1.0)
    assert untrained.finish(0, iteration=0, env_steps=0, stopped=lambda: False) == []


def test_a_lost_evaluation_actor_is_said_in_one_line_counted_and_a_new_one_evaluates_the_final_weights() -> None:
    """An actor stopped while it starts is given up by Ray (ActorUnavailableError once gRPC cannot connect), before
    the evaluation's own deadline: the run says so, counts it and goes on with a new actor, never silently."""
    unreachable = ray.exceptions.ActorUnavailableError("The actor is temporarily unavailable: timed out", None)
    calls = FakeRayCalls(lambda index, spawn: Script(calls=lambda n: Call(20.0, unreachable) if spawn == 0 else Call()),
                         sample=lambda index, seed, broadcast: [float(broadcast)])
    said: list[str] = []
    ended = Evaluation(load_config(overrides={"run.eval_every": 2}), calls, say=said.append)
    ended.submit(2, iteration=2, env_steps=200)
    assert ended.collect(timeout_s=30.0) is None and ended.in_flight is None
    (line,) = said
    assert line.startswith("the evaluation actor lost with its node while evaluating the weights at "
                           "200 env steps (ActorUnavailableError: ") and "a new one when the next" in line, line
    assert ended.group.losses == {"node": 1}
    (result,) = ended.finish(3, iteration=3, env_steps=300, stopped=lambda: False)
    assert (result.iteration, result.returns) == (3, [3.0])  # by the new actor
