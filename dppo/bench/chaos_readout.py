"""What a user of `dppo bench chaos` reads: a line as each thing happens (a kill, a recovery, a planned kill that
waits and why, a job that ends and what follows, a heartbeat), then the report: a first line with the verdict in
words, the tables with plain column names, and a legend. Pure text from the records of
:mod:`dppo.bench.chaos_report` (tested without Ray).

Two clocks: ``t=m:ss`` is chaos time (from the first progress line of the first run under chaos, as the schedule's
moments); lines before it carry none.
"""

from __future__ import annotations

import time
from typing import Any

from dppo.markdown import table

HEARTBEAT_S = 30.0  # a quiet stretch (a long round, a driver restarting) still says where the run is


def clock(seconds: float) -> str:
    """``m:ss`` (``-0:05`` before zero)."""
    sign, whole = ("-" if seconds < 0 else ""), int(abs(seconds))
    return f"{sign}{whole // 60}:{whole % 60:02d}"


class Narrator:
    """The bench's running commentary, one flushed line per event (``say``), with the chaos clock once it runs."""

    def __init__(self, total_steps: int, chaos_s: float, word: str = "chaos") -> None:
        self.total_steps, self.chaos_s, self.word = total_steps, chaos_s, word  # word: "long run" without faults
        self.start = 0.0  # the chaos's start (monotonic; 0: not yet)
        self.said: dict[int, str] = {}  # id of a planned kill -> the reason it waits, last said
        self.beat_at = time.monotonic()

    def say(self, text: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        stamp = f"{self.word} t={clock(now - self.start)}" if self.start else f"{self.word}:"
        print(f"{stamp} {text}", flush=True)
        self.beat_at = now

    def killed(self, kill: dict[str, Any], attempt: int, now: float, node_down_s: float) -> None:
        what = (f"node {kill['victim']} (its whole `ray start` tree; back in {node_down_s:g} s)"
                if kill["kind"] == "node" else f"{kill['process']} pid {kill['victim']} (SIGSTOP, never resumed)"
                if kill["kind"] == "hang" else f"{kill['kind']} pid {kill['victim']}")
        verb = "hung" if kill["kind"] == "hang" else "killed"
        self.say(f"{verb} {what}; planned at t={clock(kill['planned_s'])}; run {kill['run']}, job attempt "
                 f"{attempt + 1}", now)

    def waits(self, kill: Any, reason: str, now: float) -> None:
        """A planned kill that is due but waits: said once per reason, so a long wait is one line."""
        if self.said.get(id(kill)) != reason:
            self.said[id(kill)] = reason
            self.say(f"the {kill.kind} kill planned at t={clock(kill.at_s)} waits: {reason}", now)

    def recovered(self, kill: dict[str, Any], record: dict[str, Any], now: float) -> None:
        self.say(f"recovered from the {kill['kind']} kill at t={clock(kill['done_s'])} in "
                 f"{now - kill['at']:.1f} s (run {kill['run']}, iteration {record['iteration']} with every actor's "
                 "segment)", now)

    def job_ended(self, run: int, attempt: int, status: str, retried: bool, summary: dict[str, Any]) -> None:
        if retried:
            self.say(f"run {run}: job attempt {attempt + 1} ended {status}; attempt {attempt + 2} resumes the run "
                     "from its newest checkpoint (--auto-resume, as the chart's retries do)")
        elif status == "SUCCEEDED":
            ret = summary.get("episode_return_mean")
            self.say(f"run {run} SUCCEEDED in {attempt + 1} job attempt{'s' * (attempt > 0)}: "
                     f"{summary.get('env_steps', 0):,} env steps trained, return "
                     f"{'-' if ret is None else f'{ret:.1f}'}")
        else:
            self.say(f"run {run} ended {status} after {attempt + 1} job attempts; no more runs")

    def heartbeat(self, run: int, attempt: int, seen: list[tuple[float, int, dict[str, Any]]], kills: int,
                  waiting: int, full: int, now: float) -> None:
        """Every HEARTBEAT_S without another line: where the run is."""
        if now - self.beat_at < HEARTBEAT_S:
            return
        if not seen:
            where = "starting (no progress line yet)"
        else:
            last = seen[-1][2]
            where = (f"iteration {last['iteration']}, {last['env_steps']:,} of {self.total_steps:,} env steps, "
                     f"last round {last['segments']}/{full} segments")
        name = f"run {run}" if run else "run 0 (without chaos)"
        if not self.start:
            self.say(f"{name}, job attempt {attempt + 1}: {where}", now)
            return
        phase = (f"{self.word} until t={clock(self.chaos_s)}" if now - self.start < self.chaos_s
                 else f"{self.word} over, the run finishes in peace")
        self.say(f"({phase}) {name}, job attempt {attempt + 1}: {where}; {kills} kills done, {waiting} due and "
                 "waiting", now)


def kill_rows(recovery: list[dict[str, Any]], missed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per kind, in plain words: planned, done, not done, recovered, run ended first, recovery median and worst."""
    rows = []
    for row in recovery:
        not_done = sum(1 for m in missed if m["kind"] == row["kind"])
        rows.append({"killed": row["kind"], "planned": row["kills"] + not_done, "done": row["kills"],
                     "not done": not_done, "recovered": row["recovered"], "run ended first": row["finished"],
                     "recovery median (s)": row["recover_median_s"], "recovery worst (s)": row["recover_worst_s"]})
    return rows


def run_rows(accounts: list[dict[str, Any]], row: dict[str, Any]) -> list[dict[str, Any]]:
    """The env steps of each training run and of all together, in plain words."""
    rows = [{"run": a["run"], "jobs": a["attempts"], "last job": a["status"], "env steps trained": a["trained"],
             "in progress.jsonl": a["in_progress"], "rewound": a["rewound_steps"],
             "rounds short": len(a["short_rounds"]), "segments dropped": a["dropped_segments"],
             "env failures": a.get("env_failures"), "exact": "yes" if a["exact"] else "NO"} for a in accounts]
    if len(accounts) > 1:
        rows.append({"run": "all", "jobs": row["attempts"], "last job": "", "env steps trained": row["steps_trained"],
                     "in progress.jsonl": row["steps_in_progress"], "rewound": row["steps_rewound"],
                     "rounds short": row["short_rounds"], "segments dropped": row["segments_dropped"],
                     "env failures": sum(a.get("env_failures") or 0 for a in accounts),
                     "exact": "yes" if row["accounting_exact"] else "NO"})
    return rows


def after_row(row: dict[str, Any]) -> dict[str, Any]:
    """What the chaos cost and left, in plain words."""
    return {"longest pause (s)": row["longest_gap_s"], "resumes that rewound": row["rewinds"],
            "driver kills": row["driver_kills"], "processes left": row["processes_left"],
            "/dev/shm left": row["shm_left"], "return": row["final_return"],
            "return without chaos": row["return_without_chaos"], "change": row["return_change"],
            "load average": row.get("load_avg")}


def verdict(row: dict[str, Any], accounts: list[dict[str, Any]], kills: list[dict[str, Any]],
            missed: list[dict[str, Any]], found: list[str] | None = None) -> list[str]:
    """Two lines: the one verdict in words (nothing lost, or each thing that went wrong, ``found`` by the readings
    of every process among them), then what was done."""
    problems = [f"run {a['run']}'s env steps NOT accounted" for a in accounts if not a["exact"]]
    problems += [f"run {a['run']} ended {a['status']}" for a in accounts if a["status"] != "SUCCEEDED"]
    if not row["rewinds_ok"]:
        problems.append(f"{row['rewinds']} checkpoint rewinds for {row['driver_kills']} driver kills")
    if row["processes_left"] or row["shm_left"]:
        problems.append(f"left behind: {row['processes_left']} processes, {row['shm_left']} /dev/shm entries "
                        "(results.json: leftovers)")
    unrecovered = sum(k["done"] - k["recovered"] - k["run ended first"] for k in kills)
    if unrecovered:
        problems.append(f"{unrecovered} kills never recovered from (no full round after them)")
    problems += [p for p in found or [] if " ended " not in p]  # a run's end is said above, by the accounts
    if row["return_change"] is not None:
        ret = (f"return {row['return_change']:+g} against the run without chaos ({row['final_return']:g} vs "
               f"{row['return_without_chaos']:g})")
    elif row["final_return"] is not None:
        ret = f"return {row['final_return']:g} (no run without chaos to compare: --no-baseline)"
    else:
        ret = "no run finished"
    if problems:
        first = "PROBLEMS: " + "; ".join(problems) + f"; {ret}"
    else:
        first = (f"nothing lost: every env step accounted ({row['steps_trained']:,} trained), "
                 f"{row['steps_rewound']:,} rewound{' and trained again' if row['steps_rewound'] else ''}; "
                 f"nothing left behind; {ret}")
    done = sum(k["done"] for k in kills)
    times = [k["recovery worst (s)"] for k in kills if k["recovery worst (s)"] is not None]
    each = ", ".join(f"{k['done']} {k['killed']}" for k in kills)
    second = (f"{done} kills ({each}) in {row['runs']} training "
              f"run{'s' * (row['runs'] != 1)} and {row['attempts']} job attempts; "
              + (f"the slowest recovery {max(times):g} s" if times else "no recovery measured")
              + (f"; {len(missed)} planned kill{'s' * (len(missed) != 1)} not done (why: below)" if missed else ""))
    return [first, second]


LEGEND = """\
- **run**: one training of the config from scratch to its `run.total_steps`; runs follow one another until the
  chaos time is up (the last one then finishes without kills). **jobs**: a run's attempts, each a job (one driver
  process) submitted with `ray job submit`; a killed driver fails its job and the next attempt resumes the same run
  from its newest checkpoint (`--auto-resume`, as the chart's retries do): 1 job plus one per driver kill.
- **env steps trained**: summary.json's count; **in progress.jsonl**: the sum of its lines, each a round's segments
  x env copies x agents (a multi-agent env's columns) x T; **rewound**: steps of lines a resume cut (trained after
  the last checkpoint of a killed driver, then sampled and trained again); **exact**: iterations 1..n once each,
  every line's steps its segments', the sum the trained count, and every line seen before a resume unchanged after
  it unless the resume cut it (at most one rewind per driver kill).
- **rounds short**: rounds that went on without a killed actor's segment (elastic membership; named in
  results.json); **segments dropped**: segments sampled but not trained on; **env failures**: env copies that
  raised and were recreated alone, their episodes cut (a flaky env's).
- **planned / done / not done**: kills of the seeded schedule (`schedule.json`); a kill waits until its kind has
  a victim and the run has recovered from the last kill of its kind; one that never could is listed with why.
  **recovered / recovery**: from the kill to the next progress line with every actor's segment (the bench's
  clock, polled every 0.2 s); **run ended first**: kills after which their run finished (SUCCEEDED) before another
  such line, so nothing was left to recover (not a problem).
- **longest pause**: the longest time between two progress lines of a run; **processes left**: the run's processes
  alive 60 s after its last job ended, and any process of the bench's cluster alive after it was stopped;
  **/dev/shm left**: entries the run's processes had open that still exist (a killed node's go with it, as a
  machine's memory does); **return**: the mean of the runs' final 100-episode returns; **change**: that return less
  the run's of the same config without chaos, in the return's own units (negative: worse, whatever the sign of the
  returns; a zero-sum game's draw against a slightly losing baseline reads as the gain it is); **load average**: the
  machine's 1-minute load during the chaos."""


def report_text(row: dict[str, Any], accounts: list[dict[str, Any]], kills: list[dict[str, Any]],
                missed: list[dict[str, Any]], found: list[str] | None = None) -> str:
    """The whole report: the one verdict (with what the readings ``found``), kills (and the planned ones not done,
    with why), env steps by run, what was left, and the legend."""
    parts = ["\n".join(verdict(row, accounts, kills, missed, found)), table(kills, list(kills[0]) if kills else [])]
    if missed:
        parts.append(table([{"kill not done": m["kind"], "planned at": f"t={clock(m['planned_s'])}", "why": m["why"]}
                            for m in missed], ["kill not done", "planned at", "why"]))
    runs = run_rows(accounts, row)
    parts += [table(runs, list(runs[0]) if runs else []), table([after_row(row)], list(after_row(row))), LEGEND]
    return "\n\n".join(parts)
