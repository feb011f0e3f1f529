"""How `dppo tune` spends its time budget (successive halving, in two rounds): every candidate is trained briefly
(a warm-up iteration and two timed ones), nearest the config's own setting first, while the first share of the
budget lasts; then the fastest few are trained again for what is left, in turn and twice over where start-ups allow
(a shared machine's load drifts: each finalist then meets it alike), and the fastest of those, over all its looks,
is the answer (listed first, the other finalists next). ``full_seconds``: every candidate trained for the same time,
the reference a budgeted search is checked against (docs/benchmarks.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from dppo.config import Config
from dppo.tune.grid import Candidate
from dppo.tune.measure import Trained, train

FIRST_SHARE = 0.55  # of the budget, for the first look at every candidate
FIRST_ITERATIONS = 2  # timed, after one that warms up
FINAL_PASSES = 2  # turns each finalist gets, when its start-up is at most START_SHARE of a turn
START_SHARE = 0.25


@dataclass
class Result:
    """A candidate and what was measured of it; ``skipped``: why it was not measured (one line)."""

    candidate: Candidate
    first: Trained | None = None
    second: Trained | None = None
    skipped: str | None = None

    @property
    def measured(self) -> Trained | None:
        """Both looks as one (the longer weighs more), or the one there is."""
        if self.first is None or self.second is None:
            return self.first
        return self.first.add(self.second)

    @property
    def steps_per_s(self) -> float:
        measured = self.measured
        return 0.0 if measured is None or measured.error else measured.steps_per_s

    @property
    def status(self) -> str:
        if self.skipped:
            return self.skipped
        if self.measured is not None and self.measured.error:
            return f"failed: {self.measured.error}"
        return "finalist" if self.second is not None else "measured"


def fits(result: Result, max_rss_mib: float | None, max_gpu_mib: float | None = None) -> bool:
    """Measured, without an error, and under the memory limits (the tree's summed RSS, its GPU memory)."""
    measured = result.measured
    if measured is None or measured.error:
        return False
    if max_rss_mib is not None and measured.rss_mib > max_rss_mib:
        result.skipped = f"over --max-rss-mib {max_rss_mib:g} ({measured.rss_mib:,.0f} MiB)"
        return False
    if max_gpu_mib is not None and measured.gpu_mib is not None and measured.gpu_mib > max_gpu_mib:
        result.skipped = f"over --max-gpu-mib {max_gpu_mib:g} ({measured.gpu_mib:,.0f} MiB of GPU memory)"
        return False
    return True


def search(configure: Callable[[Candidate], Config], candidates: list[Candidate], budget_s: float,
           finalists: int = 3, max_rss_mib: float | None = None, say: Callable[[str], None] = print,
           full_seconds: float | None = None, clock: Callable[[], float] = time.monotonic,
           look: Callable[[Config, int | None, float | None], Trained] = train,
           max_gpu_mib: float | None = None) -> list[Result]:
    """Every candidate's result, fastest first (``configure``: a candidate's config; it raises ValueError or
    UsageError for one the config refuses). ``full_seconds``: every candidate trained that long, no budget.
    ``look(config, iterations, seconds)``: one measurement (:func:`dppo.tune.measure.train`)."""
    start = clock()
    results = [Result(candidate) for candidate in candidates]
    first_until = start + budget_s * FIRST_SHARE
    for i, result in enumerate(results):
        spent = [r.first.wall_s for r in results[:i] if r.first is not None]
        if full_seconds is None and spent and clock() + sum(spent) / len(spent) > first_until:
            for rest in results[i:]:
                rest.skipped = "not measured: the first share of the time budget was spent (raise --minutes)"
            say(f"tune: {len(results) - i} of {len(results)} candidates left unmeasured by the time budget")
            break
        result.first = measure(configure, result.candidate, FIRST_ITERATIONS, full_seconds, look)
        say(line(i + 1, len(results), result))
    if full_seconds is None:
        ranked = sorted((r for r in results if fits(r, max_rss_mib, max_gpu_mib)),
                        key=lambda r: -r.steps_per_s)[:finalists]
        turns = final_turns(ranked, budget_s - (clock() - start))
        for n, result in enumerate(turns):
            assert result.first is not None
            seconds = (budget_s - (clock() - start)) / (len(turns) - n) - (result.first.wall_s - result.first.seconds)
            if seconds <= 0:
                break
            again = measure(configure, result.candidate, None, seconds, look)
            result.second = again if result.second is None else result.second.add(again)
            say(line(ranked.index(result) + 1, len(ranked), result, "finalist"))
    for result in results:
        fits(result, max_rss_mib, max_gpu_mib)
    # The answer is a finalist, by all its looks: a first look alone (two iterations) may have been lucky.
    return sorted(results, key=lambda r: (r.skipped is not None, r.second is None, -r.steps_per_s))


def final_turns(ranked: list[Result], left_s: float) -> list[Result]:
    """The finalists in turn, FINAL_PASSES times over when each one's start-up and warm-up (its first look's wall
    time beyond its timed seconds) fit START_SHARE of a turn, else once."""
    if not ranked:
        return []
    start_s = max(r.first.wall_s - r.first.seconds for r in ranked if r.first is not None)
    passes = FINAL_PASSES if start_s <= START_SHARE * left_s / (FINAL_PASSES * len(ranked)) else 1
    return ranked * passes


def measure(configure: Callable[[Candidate], Config], candidate: Candidate, iterations: int | None,
            seconds: float | None, look: Callable[[Config, int | None, float | None], Trained]) -> Trained:
    """One look at ``candidate`` (a config that refuses it: its one line as the error)."""
    from dppo.errors import UsageError

    try:
        config = configure(candidate)
    except (UsageError, ValueError) as err:
        return Trained(error=str(err).splitlines()[0])
    return look(config, None if seconds else iterations, seconds)


def line(n: int, of: int, result: Result, look: str = "candidate") -> str:
    measured = result.measured
    assert measured is not None
    if measured.error:
        return f"tune: {look} {n}/{of} {result.candidate.name}: {measured.error}"
    return (f"tune: {look} {n}/{of} {result.candidate.name}: {measured.steps_per_s:,.0f} env steps/s of training "
            f"over {measured.iterations} iterations, {measured.rss_mib:,.0f} MiB")
