"""`dppo bench chaos --kinds hang` (issue 62): a hang is in the schedule like a kill; its victim is any Ray actor of the
run (sampling actors, learners, the inference service, the evaluation actor) that is not stopped already, and it is
stopped with SIGSTOP, never resumed. Real processes titled as Ray titles its actors' (``ray::<Class>``)."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator

import psutil
import pytest

from dppo.bench.chaos_cluster import hang, stopped, victims
from dppo.bench.chaos_readout import Narrator
from dppo.bench.chaos_schedule import KINDS, make_schedule, parse_kinds, parse_rates


@pytest.fixture
def titled() -> Iterator[dict[str, psutil.Process]]:
    """Sleeping processes whose command lines read as Ray's actor titles, and one that is not a Ray actor."""
    names = ["ray::Actor", "ray::Learner", "ray::InferenceService", "ray::Evaluator.evaluate", "ray::IDLE"]
    started = {name: subprocess.Popen(["bash", "-c", f'exec -a "{name}" sleep 60']) for name in names}
    try:
        end = time.monotonic() + 10
        while not all(psutil.Process(p.pid).cmdline()[:1] == [name] for name, p in started.items()):
            assert time.monotonic() < end, "the titled processes did not start"
            time.sleep(0.05)
        yield {name: psutil.Process(p.pid) for name, p in started.items()}
    finally:
        for process in started.values():
            with contextlib.suppress(OSError):
                process.kill()
            process.wait()


def test_a_hang_stops_a_ray_actor_of_any_class_once_and_never_another_process(titled) -> None:
    processes = list(titled.values())
    found = victims("hang", processes, marker="unused")
    assert {p.pid for p in found} == {titled[name].pid for name in titled if name != "ray::IDLE"}
    victim = titled["ray::Learner"]
    hang(victim)
    end = time.monotonic() + 10
    while not stopped(victim):
        assert time.monotonic() < end, "SIGSTOP did not stop the process"
        time.sleep(0.05)
    assert victim.pid not in {p.pid for p in victims("hang", processes, marker="unused")}  # stopped: the run's now
    assert victim.pid in {p.pid for p in victims("learner", processes, marker="unused")}  # a kill may still take it


def test_hang_is_a_kind_of_the_schedule_with_its_own_rate_and_its_line_says_what_was_stopped(capsys) -> None:
    assert "hang" in KINDS and parse_kinds("hang,actor") == ["hang", "actor"]
    rates = parse_rates(["hang=2"], ["hang"])
    assert rates == {"hang": 2.0}
    assert [k.kind for k in make_schedule(rates, 3, seed=1)] == ["hang"] * 6
    Narrator(1000, 180, "chaos").killed({"kind": "hang", "process": "ray::Learner", "victim": 4242, "planned_s": 12.0,
                                         "run": 1}, 0, time.monotonic(), 15.0)
    assert "hung ray::Learner pid 4242 (SIGSTOP, never resumed)" in capsys.readouterr().out
