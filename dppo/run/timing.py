"""Timing by named phase: the start-up of a run (so `python -m benchmarks solve` can say where the seconds before the
first sampling round go: interpreter, config, imports, Ray, model, actors) and each iteration's phases."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def seconds_since_process_start() -> float:
    """From this process's exec to now. Linux: /proc/self/stat's start tick against the boot clock (10 ms
    resolution; psutil's create_time adds the boot time, which /proc gives in whole seconds only)."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        start_ticks = int(fields[19])  # field 22 of the whole line: starttime, clock ticks after boot
        return time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        import psutil

        return time.time() - psutil.Process().create_time()


class PhaseClock:
    """Seconds per phase in order; the first phase counts from the process's own start."""

    def __init__(self) -> None:
        self.phases: dict[str, float] = {"launch": round(seconds_since_process_start(), 3)}
        self.last = time.perf_counter()

    def mark(self, phase: str) -> None:
        """The phase that just ended: the seconds since the previous mark."""
        now = time.perf_counter()
        self.phases[phase] = round(now - self.last, 3)
        self.last = now


class PhaseTimer:
    """Seconds per named phase of one iteration, timed by ``with timer.phase(name):`` blocks."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.seconds: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - began

    def elapsed(self) -> float:
        """Seconds since the iteration began."""
        return time.perf_counter() - self.start
