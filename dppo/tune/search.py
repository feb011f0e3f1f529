"""How `dppo tune` spends its time budget, in two rounds. First each setting is screened while the first share of
the budget lasts: started, its sampling rounds timed, and an update timed once per batch size (the learner's update
costs the same whatever actors, envs or placement sampled the batch), which together predict its training speed;
the next setting screened is the one nearest (fewest options changed) to the fastest predicted so far, so a budget
that ends early has searched where the speed is. Then the fastest few predicted are trained for real for what is
left, in turn and twice over where start-ups allow (a shared machine's load drifts: each finalist then meets it
alike); the fastest of those by its training is the answer (listed first, the other finalists next, then the
screened by their prediction). ``full_seconds``: every candidate trained for the same time, no screen: the
reference a budgeted search is checked against (docs/benchmarks.md).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from dppo.config import Config
from dppo.tune.grid import Candidate, distance
from dppo.tune.measure import Screened, Trained, screen, train

FIRST_SHARE = 0.55  # of the budget, for screening
SCREEN_ROUNDS = 2  # timed sampling rounds of a screen at least, after one that warms up
FINAL_PASSES = 2  # turns each finalist gets, when its start-up is at most START_SHARE of a turn
START_SHARE = 0.25

Look = TypeVar("Look", Trained, Screened)


@dataclass
class Result:
    """A candidate and what was measured of it; ``skipped``: why it was not measured or kept (one line)."""

    candidate: Candidate
    screened: Screened | None = None
    trained: Trained | None = None  # a real training run (the full grid's), or a finalist's runs as one
    predicted: float = 0.0  # env steps/s of training its screen predicts (0: none)
    skipped: str | None = None

    @property
    def error(self) -> str | None:
        return next((look.error for look in (self.trained, self.screened) if look is not None and look.error), None)

    @property
    def steps_per_s(self) -> float:
        """Its measured training speed (0: not trained)."""
        return 0.0 if self.trained is None or self.trained.error else self.trained.steps_per_s

    @property
    def status(self) -> str:
        if self.skipped:
            return self.skipped
        if self.error:
            return f"failed: {self.error}"
        if self.trained is not None:
            return "finalist" if self.screened is not None else "measured"
        return "screened" if self.screened is not None else "not measured"


def fits(result: Result, max_rss_mib: float | None, max_gpu_mib: float | None = None) -> bool:
    """Measured, without an error, and under the memory limits (the tree's summed RSS, its GPU memory) in every look."""
    looks = [look for look in (result.screened, result.trained) if look is not None]
    if not looks or result.error:
        return False
    rss = max(look.rss_mib for look in looks)
    gpu = max((look.gpu_mib for look in looks if look.gpu_mib is not None), default=None)
    if max_rss_mib is not None and rss > max_rss_mib:
        result.skipped = f"over --max-rss-mib {max_rss_mib:g} ({rss:,.0f} MiB)"
        return False
    if max_gpu_mib is not None and gpu is not None and gpu > max_gpu_mib:
        result.skipped = f"over --max-gpu-mib {max_gpu_mib:g} ({gpu:,.0f} MiB of GPU memory)"
        return False
    return True


def search(configure: Callable[[Candidate], Config], candidates: list[Candidate], budget_s: float,
           finalists: int = 3, max_rss_mib: float | None = None, say: Callable[[str], None] = print,
           full_seconds: float | None = None, clock: Callable[[], float] = time.monotonic,
           look: Callable[[Config, int | None, float | None], Trained] = train,
           max_gpu_mib: float | None = None,
           first_look: Callable[[Config, int, int], Screened] = screen, passes: int = 1) -> list[Result]:
    """Every candidate's result, the answer first (``configure``: a candidate's config; it raises ValueError or
    UsageError for one the config refuses). ``full_seconds``: every candidate trained that long, no budget, ``passes``
    times in turn.
    ``look(config, iterations, seconds)``: a training run (:func:`dppo.tune.measure.train`);
    ``first_look(config, rounds, updates)``: a screen (:func:`dppo.tune.measure.screen`)."""
    results = [Result(candidate) for candidate in candidates]
    if full_seconds is not None:
        for i, result in enumerate(results * passes):
            again = measure(configure, result.candidate, lambda cfg: look(cfg, None, full_seconds), Trained)
            result.trained = again if result.trained is None else result.trained.add(again)
            say(line(i % len(results) + 1, len(results), result))
    else:
        start = clock()
        screen_all(configure, results, start + budget_s * FIRST_SHARE, clock, first_look, say)
        ranked = sorted((r for r in results if r.predicted > 0 and fits(r, max_rss_mib, max_gpu_mib)),
                        key=lambda r: -r.predicted)[:finalists]
        train_finalists(configure, ranked, lambda: budget_s - (clock() - start), look, say)
    for result in results:
        fits(result, max_rss_mib, max_gpu_mib)
    # The answer is one trained, by its training: a prediction picks the finalists, it does not answer.
    return sorted(results, key=lambda r: (r.skipped is not None or r.error is not None, r.steps_per_s <= 0,
                                          -(r.steps_per_s or r.predicted)))


def screen_all(configure: Callable[[Candidate], Config], results: list[Result], until: float,
               clock: Callable[[], float], first_look: Callable[[Config, int, int], Screened],
               say: Callable[[str], None]) -> None:
    """Screen the candidates, nearest the fastest predicted first, until ``until``; each one's prediction."""
    updates: dict[int, float] = {}  # each batch size's update seconds
    left, spent = list(results), []
    while left:
        best = max((r for r in results if r.predicted > 0), key=lambda r: r.predicted, default=None)
        result = min(left, key=lambda r: 0 if best is None else distance(r.candidate, best.candidate))
        if spent and clock() + statistics.mean(spent) > until:
            for rest in left:
                rest.skipped = "not measured: the first share of the time budget was spent (raise --minutes)"
            say(f"tune: {len(left)} of {len(results)} candidates left unscreened by the time budget")
            return
        left.remove(result)
        batch = result.candidate.batch
        updating = 0 if batch in updates else 1 if updates else 2  # the first update of all warms up
        result.screened = measure(configure, result.candidate,
                                  lambda cfg, u=updating: first_look(cfg, SCREEN_ROUNDS, u), Screened)
        spent.append(result.screened.wall_s)
        if result.screened.update_s is not None and not result.screened.error:
            updates[batch] = result.screened.update_s
        for r in results:
            r.predicted = predict(r.screened, updates) if r.screened is not None else 0.0
        say(line(len(results) - len(left), len(results), result, "screened"))


def predict(screened: Screened, updates: dict[int, float]) -> float:
    """Env steps/s of training: a round's steps over its seconds and its batch's update (one not timed: the nearest
    batch size's, scaled to this one's steps)."""
    if screened.error or not screened.round_s or not updates or screened.steps <= 0:
        return 0.0
    near = min(updates, key=lambda batch: abs(math.log(batch / screened.steps)))
    update_s = updates[near] * screened.steps / near
    return screened.steps / (screened.round_median_s + update_s)


def train_finalists(configure: Callable[[Candidate], Config], ranked: list[Result], left: Callable[[], float],
                    look: Callable[[Config, int | None, float | None], Trained], say: Callable[[str], None]) -> None:
    """Train the finalists in turn for the time left (the first one at least once, so there is an answer)."""
    turns = final_turns(ranked, left())
    for n, result in enumerate(turns):
        seconds = left() / (len(turns) - n) - overhead_s(result)
        if seconds <= 0 and n > 0:
            break
        seconds = max(seconds, 1.0)
        again = measure(configure, result.candidate, lambda cfg, s=seconds: look(cfg, None, s), Trained)
        result.trained = again if result.trained is None else result.trained.add(again)
        say(line(ranked.index(result) + 1, len(ranked), result, "finalist"))


def overhead_s(result: Result) -> float:
    """A training run's time beyond its timed seconds: its start-up and the iteration that warms up (predicted)."""
    screened = result.screened
    if screened is None or result.predicted <= 0:
        return 0.0
    return screened.start_s + screened.steps / result.predicted


def final_turns(ranked: list[Result], left_s: float) -> list[Result]:
    """The finalists in turn, FINAL_PASSES times over when each one's start-up and warm-up fit START_SHARE of a
    turn, else once."""
    if not ranked:
        return []
    start_s = max(overhead_s(r) for r in ranked)
    passes = FINAL_PASSES if start_s <= START_SHARE * left_s / (FINAL_PASSES * len(ranked)) else 1
    return ranked * passes


def measure(configure: Callable[[Candidate], Config], candidate: Candidate, run: Callable[[Config], Look],
            kind: type[Look]) -> Look:
    """One look at ``candidate`` (a config that refuses it: its one line as the error)."""
    from dppo.errors import UsageError

    try:
        config = configure(candidate)
    except (UsageError, ValueError) as err:
        return kind(error=str(err).splitlines()[0])
    return run(config)


def line(n: int, of: int, result: Result, look: str = "candidate") -> str:
    name = f"tune: {look} {n}/{of} {result.candidate.name}"
    if result.error:
        return f"{name}: {result.error}"
    if look == "screened":
        screened = result.screened
        assert screened is not None
        update = "" if screened.update_s is None else f", an update {screened.update_s:.2f} s"
        return (f"{name}: {result.predicted:,.0f} env steps/s of training predicted (a round of {screened.steps:,} "
                f"steps {screened.round_median_s:.2f} s{update}), {screened.rss_mib:,.0f} MiB")
    trained = result.trained
    assert trained is not None
    return (f"{name}: {trained.steps_per_s:,.0f} env steps/s of training over {trained.iterations} iterations, "
            f"{trained.rss_mib:,.0f} MiB")
