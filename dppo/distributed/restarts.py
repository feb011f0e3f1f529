"""The crash-loop guard: how many restarts a run allows before it stops."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from dppo.errors import RunFailure


class RestartBudget:
    """At most ``limit`` restarts within a sliding window of ``window_s`` seconds: a crash loop ends the run.
    ``clock`` (seconds, monotonic) is injectable so tests slide the window without sleeping."""

    def __init__(self, what: str, limit: int, window_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.what, self.limit, self.window_s = what, limit, window_s  # what: "actor" or "learner"
        self.clock = clock
        self.times: deque[float] = deque()

    def spend(self, err: Exception) -> None:
        """Count one restart now; RunFailure when the window holds more than the limit."""
        now = self.clock()
        self.times.append(now)
        while self.times and now - self.times[0] > self.window_s:
            self.times.popleft()
        if len(self.times) > self.limit:
            raise RunFailure(f"{len(self.times)} {self.what} restarts within {self.window_s:g}s exceeds "
                             f"faults.max_{self.what}_restarts={self.limit}; last: {err}")
