"""What `dppo bench chaos` saw, turned into its figures: recovery per kind of kill and the accounting of every
env step. Pure (records and times in, rows out), so the accounting is tested on made-up runs too.

A run is one training run of the config; a driver kill makes it several attempts (jobs), each resuming from the
newest checkpoint. Records are progress lines as the bench saw them appear (its monotonic clock), tagged with the
attempt that wrote them; the final records are progress.jsonl as the run left it (cut back to the checkpoint on
each resume).
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass, field
from typing import Any

SETTLE_S = 2.0  # a line read this soon after a kill was written before it (its round gathered): no sign of recovery


@dataclass
class RunLog:
    """One training run under chaos: what appeared, what stayed, how each attempt (job) ended."""

    index: int
    seen: list[tuple[float, int, dict[str, Any]]] = field(default_factory=list)  # (at, attempt, record)
    final: list[dict[str, Any]] = field(default_factory=list)  # progress.jsonl at the end
    summary: dict[str, Any] = field(default_factory=dict)  # summary.json ({} when the run never finished)
    statuses: list[str] = field(default_factory=list)  # each attempt's job status, in order


def recovered(kill: dict[str, Any], at: float, record: dict[str, Any], full: int) -> bool:
    """A progress line seen at ``at`` shows the run recovered from ``kill``: every actor's segment (``full``), and
    seen more than SETTLE_S after the kill (one sooner had its round gathered before the kill landed)."""
    return at > kill["at"] + SETTLE_S and record["segments"] >= full


def recovery_s(kill: dict[str, Any], records: list[tuple[float, dict[str, Any]]], full: int) -> float | None:
    """Seconds from a kill to the next progress line that shows its run :func:`recovered`; None when the run
    ended first. ``records``: (seen at, record) of the run the kill hit, in time order (the next run's start-up
    is no recovery)."""
    after = next((at for at, record in records if recovered(kill, at, record, full)), None)
    return None if after is None else round(after - kill["at"], 2)


def recovery_rows(kills: list[dict[str, Any]], runs: list[RunLog], full: int, kinds: list[str]) -> list[dict[str, Any]]:
    """Per kind: kills done, recovered, median and worst seconds to recover (:func:`recovery_s`, each inside the
    run the kill hit; a kill not tagged with its run is timed against every run's lines), and ``finished``: kills not
    recovered from because their run finished (SUCCEEDED) first, with no full round after them."""
    by_run = {run.index: sorted(((at, record) for at, _, record in run.seen), key=lambda pair: pair[0])
              for run in runs}
    every = sorted((pair for records in by_run.values() for pair in records), key=lambda pair: pair[0])
    succeeded = {run.index for run in runs if run.statuses and run.statuses[-1] == "SUCCEEDED"}
    rows = []
    for kind in kinds:
        done = [k for k in kills if k["kind"] == kind and k.get("victim") is not None]
        timed = [(k, recovery_s(k, by_run.get(k["run"], []) if "run" in k else every, full)) for k in done]
        times = [t for _, t in timed if t is not None]
        rows.append({"kind": kind, "kills": len(done), "recovered": len(times),
                     "recover_median_s": round(statistics.median(times), 1) if times else None,
                     "recover_worst_s": round(max(times), 1) if times else None,
                     "finished": sum(t is None and k.get("run") in succeeded for k, t in timed)})
    return rows


def account(run: RunLog, steps_per_segment: int, full: int) -> dict[str, Any]:
    """The env steps of one run: trained (summary.json), in progress.jsonl, rewound by resumes, and the rounds that
    kills left short (named). ``exact``: iterations 1..n once each, every line's steps its segments' and the sum the
    trained count, and every line seen before a resume that survived it unchanged (none counted twice, none lost
    beyond the named short rounds and rewinds)."""
    final = run.final
    in_progress = sum(r["env_steps_delta"] for r in final)
    by_iteration = {r["iteration"]: r for r in final}
    rewinds, rewound_steps, rewound_iterations, changed = 0, 0, [], 0
    attempts = sorted({attempt for _, attempt, _ in run.seen})
    for before, after in itertools.pairwise(attempts):
        last = max((r["iteration"] for _, a, r in run.seen if a == before), default=0)
        first = min((r["iteration"] for _, a, r in run.seen if a == after), default=last + 1)
        if first <= last:
            rewinds += 1
            cut = [r for _, a, r in run.seen if a == before and r["iteration"] >= first]
            rewound_steps += sum(r["env_steps_delta"] for r in cut)
            rewound_iterations += [f"{run.index}:{r['iteration']}" for r in cut]
    for _, _, record in run.seen:  # what a later attempt did not cut must be in the file as seen
        kept = by_iteration.get(record["iteration"])
        if kept is not None and kept["env_steps"] == record["env_steps"]:
            continue
        if f"{run.index}:{record['iteration']}" not in rewound_iterations:
            changed += 1
    short = [f"{run.index}:{r['iteration']} ({r['segments']}/{full})" for r in final if r["segments"] < full]
    trained = run.summary.get("env_steps")
    exact = ([r["iteration"] for r in final] == list(range(1, len(final) + 1))
             and all(r["env_steps_delta"] == r["segments"] * steps_per_segment for r in final)
             and trained == in_progress == (final[-1]["env_steps"] if final else 0) and changed == 0)
    return {"run": run.index, "attempts": len(run.statuses), "status": run.statuses[-1] if run.statuses else None,
            "trained": trained, "in_progress": in_progress, "rewinds": rewinds, "rewound_steps": rewound_steps,
            "rewound": rewound_iterations, "short_rounds": short,
            "dropped_segments": run.summary.get("segments_dropped"), "exact": exact,
            "env_failures": final[-1].get("env_failures") if final else None,
            "final_return": run.summary.get("episode_return_mean")}


def longest_gap_s(runs: list[RunLog]) -> float | None:
    """The longest time between two progress lines of one run (driver kills and resumes included)."""
    gaps = [b[0] - a[0] for run in runs for a, b in itertools.pairwise(run.seen)]
    return round(max(gaps), 1) if gaps else None


def run_row(runs: list[RunLog], kills: list[dict[str, Any]], steps_per_segment: int, full: int,
            baseline_return: float | None, leftovers: dict[str, list[str]]
            ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The chaos run's one line (accounting over all runs, rewinds against driver kills, leftovers, returns) and
    each run's accounting."""
    accounts = [account(run, steps_per_segment, full) for run in runs]
    driver_kills = sum(1 for k in kills if k["kind"] == "driver" and k.get("victim") is not None)
    finished = [a["final_return"] for a in accounts if a["final_return"] is not None]
    final_return = round(statistics.mean(finished), 1) if finished else None
    return {
        "runs": len(runs), "attempts": sum(a["attempts"] for a in accounts),
        "final_status": ",".join(str(a["status"]) for a in accounts),
        "longest_gap_s": longest_gap_s(runs),
        "steps_trained": sum(a["trained"] or 0 for a in accounts),
        "steps_in_progress": sum(a["in_progress"] for a in accounts),
        "steps_rewound": sum(a["rewound_steps"] for a in accounts),
        "short_rounds": len([s for a in accounts for s in a["short_rounds"]]),
        "segments_dropped": sum(a["dropped_segments"] or 0 for a in accounts),
        "accounting_exact": all(a["exact"] for a in accounts),
        "rewinds": sum(a["rewinds"] for a in accounts), "driver_kills": driver_kills,
        "rewinds_ok": sum(a["rewinds"] for a in accounts) <= driver_kills,
        "shm_left": len(leftovers.get("shm", [])), "processes_left": len(leftovers.get("processes", [])),
        "final_return": final_return, "return_without_chaos": baseline_return,
        "return_change": return_change(final_return, baseline_return),
    }, accounts


def return_change(final: float | None, baseline: float | None) -> float | None:
    """The runs' return less the run's without chaos, in the return's own units: it reads the same for negative
    returns (-20.9 against -20.1 is -0.8, worse) and for zero-sum games (0 against -0.06 is +0.06), where a ratio
    reads backwards or means nothing."""
    return None if final is None or baseline is None else round(final - baseline, 3)
