"""A resumed run whose stop rule holds already (its steps, target or time limit reached before the resume): it
ends at once, without starting Ray, with the line that says why and how to go on, and its summary.json again."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dppo.config import Config
    from dppo.run.logs import IterationLog
    from dppo.run.state import RunState
    from dppo.run.timing import PhaseClock


def finished_before(config: Config, resume_state: dict[str, Any]) -> tuple[RunState, str, str] | None:
    """A resumed run whose stop rule holds already (``--time-limit`` counts the whole run, resumes included): its
    state, the rule, and one line that says so and how to go on. It ends at once, without starting Ray."""
    from dppo.run.state import RunState

    state = RunState(config, 0)  # the normalizer statistics, if any, come from the checkpoint
    state.restore(resume_state)
    reason, counters, run = state.stop_reason(), state.counters, config.run
    if reason == "time_limit":
        line = (f"the time limit of {run.time_limit_s:g} s is spent: the run trained {counters.wall_s:,.1f} s before "
                "this resume (the limit counts the whole run); raise --time-limit to go on")
    elif reason == "total_steps":
        line = (f"the run has its {run.total_steps:,} env steps already ({counters.env_steps:,} trained before this "
                "resume); raise --total-steps to go on")
    elif reason == "target_return":
        line = (f"the run reached its target return {run.target_return:g} before this resume; raise --target-return "
                "to go on")
    else:
        return None
    return state, reason, line


def end_untrained(config: Config, run_dir: Path, state: RunState, reason: str, line: str,
                  clock: PhaseClock) -> tuple[dict[str, Any], IterationLog]:
    """A resumed run that had finished already: the line that says why, and its summary.json again."""
    from dppo.run.reporting import Reporter
    from dppo.run.run_dir import RunDir

    reporter = Reporter(config, RunDir(run_dir))
    reporter.message(line)
    return reporter.summary(state, reason, state.counters.wall_s, clock.phases, None), reporter.output
