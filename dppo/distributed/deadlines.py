"""How long the driver waits for a call before it declares the process behind it hung (issue 62).

A deadlocked simulator, a stuck GPU kernel, a process paused by its node or cut off by a network partition answers
nothing and raises nothing: without a deadline the run waits as long as it hangs, and says nothing. Each kind of call
the driver waits on (a segment, an update, an evaluation, the inference service's answer) has a :class:`Deadline`
derived from the run's own timings of that call, max(HANG_FLOOR_S, HANG_FACTOR x their median), or
``faults.hang_timeout_s`` when set; past it :class:`Hangs` says so in one line, counts it and spends the hangs'
own restart budget, and the caller kills and replaces the process as it would a crashed one. Plain Python: the actor
pool, the learner group, the evaluation and the inference service's supervisor use it, and tests drive it with a
fake clock.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from dppo.config import FaultConfig
from dppo.distributed.restarts import RestartBudget

HANG_FLOOR_S = 60.0  # the least any call is given: start-up, a first compile, a loaded machine's slow round
HANG_FACTOR = 10.0  # a call this many times its median is not slow, it is stuck
KEPT = 100  # the durations the median is taken over (the most recent)


class Deadline:
    """How long one kind of call may take: ``override`` (faults.hang_timeout_s) when set, else
    max(HANG_FLOOR_S, HANG_FACTOR x the median of the durations observed so far)."""

    def __init__(self, override: float | None) -> None:
        self.override = override
        self.recent: deque[float] = deque(maxlen=KEPT)

    def observe(self, seconds: float) -> None:
        """A call of this kind that answered, after ``seconds``."""
        self.recent.append(seconds)

    @property
    def seconds(self) -> float:
        if self.override is not None:
            return self.override
        if not self.recent:
            return HANG_FLOOR_S
        return max(HANG_FLOOR_S, HANG_FACTOR * statistics.median(self.recent))

    def describe(self) -> str:
        """Where the deadline comes from, for the hang's line."""
        if self.override is not None:
            return f"{self.override:g} s (faults.hang_timeout_s)"
        median = f" so far, {statistics.median(self.recent):.2f} s" if self.recent else " (none yet)"
        return f"{self.seconds:.0f} s (max({HANG_FLOOR_S:g} s, {HANG_FACTOR:g}x the median{median}); " \
               "faults.hang_timeout_s sets it)"


class HangEvents(Protocol):
    """What a hang tells the run (its reporting implements it)."""

    def hung(self, process: str, line: str) -> None: ...


class SayHangs:
    """Hang events that are only said (a group driven outside a run: benchmarks, tests)."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say

    def hung(self, process: str, line: str) -> None:
        self.say(line)


class Hangs:
    """The run's hangs: each said in one line, counted by kind of process, and spent from faults.max_hang_restarts
    (a process that hangs again and again ends the run, as a crash loop does)."""

    def __init__(self, faults: FaultConfig, events: HangEvents, clock: Callable[[], float] = time.monotonic) -> None:
        self.events = events
        self.override = faults.hang_timeout_s
        self.budget = RestartBudget("hang", faults.max_hang_restarts, faults.restart_window_s, clock=clock)

    def deadline(self) -> Deadline:
        """A fresh deadline for one kind of call."""
        return Deadline(self.override)

    def declare(self, process: str, who: str, doing: str, waited_s: float, deadline: Deadline,
                then: str = "killing it and starting a replacement") -> None:
        """``who`` (of kind ``process``: actor, learner, inference, evaluation) hung while ``doing``: said with what
        is done ``then``, counted, spent (RunFailure past the budget). The caller kills and replaces it."""
        line = f"{who} hung: {doing} for {waited_s:.1f} s, past its deadline of {deadline.describe()}; {then}"
        self.events.hung(process, line)
        self.budget.spend(RuntimeError(line))


class Hung(RuntimeError):
    """A process that did not answer within its deadline (the loss a hang is recorded as)."""
