"""The loop of `dppo bench chaos`: follow the current run's progress and job, do the planned kills when due (and say
why one waits), notice recoveries, bring killed nodes back. The command around it is :mod:`dppo.bench.chaos`."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil

from dppo.bench.chaos_cluster import FINISHED, Cluster, crash, hang, shm_in_use, title, tree, victims
from dppo.bench.chaos_readout import Narrator, clock
from dppo.bench.chaos_report import RunLog, recovered
from dppo.bench.chaos_schedule import ACTOR_CLASSES, Kill, pick
from dppo.bench.local_cluster import RAY

# With --every-kind, how long past its minutes the chaos may go on waiting for a kind's first kill: a kind with no
# victim all that while (an evaluation that never runs) is reported not done, as without the flag.
EVERY_KIND_MAX_S = 600.0


class Chaos:
    """The loop: follow the current run's progress and job, do the kills when due, bring nodes back."""

    def __init__(self, cluster: Cluster, out: Path, entrypoint: str, plan: list[Kill], seed: int,
                 node_down_s: float, cpus_per_worker: int, say: Narrator, every_kind: bool = False) -> None:
        self.cluster, self.out, self.entrypoint, self.plan, self.seed = cluster, out, entrypoint, plan, seed
        self.node_down_s, self.cpus_per_worker, self.say = node_down_s, cpus_per_worker, say
        # --every-kind: the kinds planned that the chaos goes on past its minutes for, until each is killed once
        self.every_kind = {kill.kind for kill in plan} if every_kind else set()
        self.why: dict[int, str] = {}  # id of a planned kill that waits -> why (said, and kept if it never happens)
        self.attempt = 0  # the current run's job attempt
        self.done: list[dict[str, Any]] = []
        self.down: dict[str, float] = {}  # worker node -> when it comes back
        self.shm: set[str] = set()
        self.pids: dict[int, float] = {}  # every process of ours seen: pid -> create time
        self.job_id = ""
        self.full = 0  # that many segments (run.actors)
        self.node_shm: dict[str, set[str]] = {}  # per node: the /dev/shm entries its processes had, last seen
        self.shm_with_nodes: list[str] = []  # removed with their killed node (a machine's /dev/shm goes with it)
        self.loads: list[float] = []  # the machine's 1-minute load, every 2 s under chaos

    def run_once(self, index: int, run_dir: Path, chaos_s: float | None, timeout_s: float) -> RunLog:
        """One training run, resubmitted until it ends well (or ``timeout_s``); kills for ``chaos_s`` seconds
        from the first progress line of the first run under chaos (Ray's and the run's start-up are not chaos
        time: on a loaded machine they would take the window)."""
        log = RunLog(index)
        raw: set[str] = set()
        attempt, start = 0, time.monotonic()
        self.attempt = 0
        entry = f"{self.entrypoint} --run-dir {shlex.quote(str(run_dir))}"
        self.job_id = f"chaos-{index}-{attempt}-{secrets.token_hex(2)}"
        self.cluster.submit(self.job_id, entry)
        last_status_at, last_scan_at = 0.0, 0.0
        while True:
            now = time.monotonic()
            self.read_progress(run_dir, raw, log, attempt)
            if now - last_status_at >= 1.0:
                last_status_at = now
                status = self.cluster.status(self.job_id)
                if status in FINISHED:
                    log.statuses.append(status)
                    self.read_progress(run_dir, raw, log, attempt)
                    if status == "SUCCEEDED" or now - start > timeout_s or attempt >= 1000:
                        self.say.job_ended(index, attempt, status, False, self.summary(run_dir))
                        break
                    self.save_job_log(self.job_id)
                    self.say.job_ended(index, attempt, status, True, {})
                    attempt += 1  # the chart's retry: the same entrypoint, resuming from the newest checkpoint
                    self.attempt = attempt
                    self.job_id = f"chaos-{index}-{attempt}-{secrets.token_hex(2)}"
                    self.cluster.submit(self.job_id, entry)
                elif now - start > timeout_s:
                    with contextlib.suppress(OSError):
                        subprocess.run([RAY, "job", "stop", "--address", self.cluster.dashboard, self.job_id],
                                       env=self.cluster.env, capture_output=True, timeout=120, check=False)
                    log.statuses.append("TIMEOUT")
                    self.say.job_ended(index, attempt, f"TIMEOUT (after {timeout_s:g} s)", False, {})
                    break
            if now - last_scan_at >= 2.0:
                last_scan_at = now
                self.scan()
            if chaos_s is not None and not self.chaos_start and log.seen:
                self.chaos_start, self.chaos_until = log.seen[0][0], log.seen[0][0] + chaos_s
                self.say.start = self.chaos_start
                self.say.say(f"the {self.say.word} begins: run {index}'s first progress line; {len(self.plan)} kills "
                             f"planned until t={clock(chaos_s)}", self.chaos_start)
            if chaos_s is not None and self.chaos_start:
                self.kill_due(now, index)
            self.bring_back(now)
            self.say.heartbeat(index, attempt, log.seen, len(self.done), len(self.due(now)), self.full, now)
            time.sleep(0.2)
        log.summary = self.summary(run_dir) if log.statuses[-1] == "SUCCEEDED" else {}
        log.final = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()] \
            if (run_dir / "progress.jsonl").exists() else []
        return log

    @staticmethod
    def summary(run_dir: Path) -> dict[str, Any]:
        path = run_dir / "summary.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def read_progress(self, run_dir: Path, raw: set[str], log: RunLog, attempt: int) -> None:
        """Lines not seen before (a resume rewrites the file with the kept lines: those were seen); a line with
        every actor's segment is the recovery from the kills before it."""
        path = run_dir / "progress.jsonl"
        if not path.exists():
            return
        now = time.monotonic()
        for line in path.read_text().split("\n")[:-1]:
            if line not in raw:
                raw.add(line)
                log.seen.append((now, attempt, json.loads(line)))
                if log.seen[-1][2]["segments"] >= self.full:
                    self.full_seen = True
                for kill in self.done:  # the kills of this run: the next run's start-up is no recovery
                    if ("recovered_s" not in kill and kill.get("run") == log.index
                            and recovered(kill, now, log.seen[-1][2], self.full)):
                        kill["recovered_s"] = round(now - kill["at"], 2)
                        self.say.recovered(kill, log.seen[-1][2], now)

    def scan(self) -> None:
        if self.chaos_start:
            self.loads.append(os.getloadavg()[0])
        processes = self.cluster.processes(self.job_id)
        for process in processes:
            with contextlib.suppress(psutil.Error):
                self.pids.setdefault(process.pid, process.create_time())
        self.shm |= shm_in_use(processes)
        for name, node in (self.cluster.local.nodes.items() if self.cluster.local else []):
            self.node_shm[name] = shm_in_use(tree(node.pid))

    def unhit(self) -> set[str]:
        """With --every-kind, the planned kinds not killed yet."""
        return self.every_kind - {kill["kind"] for kill in self.done}

    def going_on(self, now: float) -> bool:
        """Whether the chaos goes on: within its minutes; with --every-kind past them while a planned kind waits
        for its first kill (on a loaded machine the minutes can end before an evaluation is in flight), at most
        EVERY_KIND_MAX_S. The moment it ends is kept (``ended_s``, chaos time) and its going on is said once."""
        if not self.chaos_start:
            return True
        if now < self.chaos_until:
            return True
        if self.unhit() and now < self.chaos_until + EVERY_KIND_MAX_S:
            if not self.overtime:
                self.overtime = True
                kinds, until = sorted(self.unhit()), self.chaos_until - self.chaos_start
                self.say.say(f"the chaos's planned time (until t={clock(until)}) is over; it goes on (--every-kind) "
                             f"until {', '.join(kinds)} {'have' if len(kinds) > 1 else 'has'} been killed once, at "
                             f"most until t={clock(until + EVERY_KIND_MAX_S)}", now)
            return True
        if self.ended_s is None:
            self.ended_s = (now if self.overtime else self.chaos_until) - self.chaos_start
        return False

    def due(self, now: float) -> list[Kill]:
        """The planned kills whose moment has come while the chaos goes on: all of them within its minutes, after
        them (--every-kind) those of the kinds not killed yet."""
        if not self.chaos_start or not self.going_on(now):
            return []
        kinds = self.unhit() if now >= self.chaos_until else {k.kind for k in self.plan}
        return [k for k in self.plan if self.chaos_start + k.at_s <= now and k.kind in kinds]

    def kill_due(self, now: float, run: int) -> None:
        """The planned kills whose time has come and whose kind has a victim now (else they wait for one, and say
        why), one of a kind at a time, each once the run has recovered from the last of its kind (a full progress
        line since): otherwise a driver restarting on a loaded machine is killed again before it trains. A kill of
        a run that has ended gates nothing (that run never trains again): the current run's first full line does."""
        start = self.chaos_start
        waiting = self.due(now)
        if not waiting:
            return
        processes, kinds = None, set()
        for kill in waiting:
            last = max((k for k in self.done if k["kind"] == kill.kind and k["run"] == run), key=lambda k: k["at"],
                       default=None)
            if kill.kind in kinds:
                self.why[id(kill)] = f"another {kill.kind} kill was done at the same moment"
                continue  # one of a kind at a time
            if not self.full_seen if last is None else "recovered_s" not in last:
                self.wait(kill, "no progress line with every actor's segment yet" if last is None else
                          f"the run has not recovered from the {kill.kind} kill at t={clock(last['done_s'])} (no "
                          "progress line with every actor's segment since)", now)
                continue
            if kill.kind == "node":
                up = [n for n in (self.cluster.local.nodes if self.cluster.local else {}) if n != "head"]
                if self.down or not up:  # one node down at a time: two raylets registering at once can time out
                    self.wait(kill, f"one node down at a time: {', '.join(self.down)} is still down" if self.down
                              else "no worker node up", now)
                    continue
                name = pick(up, self.seed, len(self.done))
                self.cluster.local.kill(name)  # type: ignore[union-attr]
                self.lose_node_shm(name)
                self.down[name] = time.monotonic() + self.node_down_s
                victim: Any = name
            else:
                processes = processes if processes is not None else self.cluster.processes(self.job_id)
                found = {p.pid: p for p in victims(kill.kind, processes, str(self.out))}
                if not found:
                    self.wait(kill, no_victim(kill.kind, self.cluster.local is None), now)
                    continue
                victim = pick(list(found), self.seed, len(self.done))
                process = title(found[victim]).split(" ")[0].split(".")[0]  # ray::Learner, ... (a hang's victim)
                (hang if kill.kind == "hang" else crash)(found[victim])
                processes = None
            self.plan.remove(kill)
            self.why.pop(id(kill), None)
            kinds.add(kill.kind)
            self.done.append({"kind": kill.kind, "planned_s": kill.at_s, "done_s": round(now - start, 2),
                              "at": time.monotonic(), "victim": victim, "run": run,
                              **({"process": process} if kill.kind == "hang" else {})})
            self.say.killed(self.done[-1], self.attempt, now, self.node_down_s)

    def wait(self, kill: Kill, reason: str, now: float) -> None:
        self.why[id(kill)] = reason
        self.say.waits(kill, reason, now)

    def missed(self, ended: str) -> list[dict[str, Any]]:
        """The planned kills never done, each with the last reason it waited (or none: its moment never came)."""
        return [{"kind": k.kind, "planned_s": k.at_s,
                 "why": f"{self.why[id(k)]}, until {ended}" if id(k) in self.why else f"its moment never came: {ended}"}
                for k in self.plan]

    def lose_node_shm(self, name: str) -> None:
        """The /dev/shm entries of a killed node's processes go with it, as a machine's memory does (here the nodes
        share one /dev/shm): removed unless a process of another node has them too; counted apart, not leftovers."""
        others = set().union(*(paths for node, paths in self.node_shm.items() if node != name))
        for path in sorted(self.node_shm.pop(name, set()) - others):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                self.shm_with_nodes.append(path)
            self.shm.discard(path)

    def bring_back(self, now: float) -> None:
        """Start a killed node again when its time is up (a rescheduled pod), and a node whose start gave up again at
        once (a loaded machine can time a raylet's registration out): `LocalCluster.restart_if_exited`."""
        local = self.cluster.local
        if local is None:
            return
        for name in list(local.nodes):
            if local.restart_if_exited(name):
                self.say.say(f"node {name} exited; starting it again")
        for name, at in list(self.down.items()):
            if now >= at:
                local.start_worker(name, self.cpus_per_worker, wait=False)
                del self.down[name]
                self.say.say(f"node {name} starting again (a rescheduled pod)")

    def save_job_log(self, job_id: str) -> None:
        with contextlib.suppress(OSError, ValueError, KeyError):
            (self.out / f"{job_id}.log").write_text(self.cluster.api(f"/api/jobs/{job_id}/logs")["logs"])

    chaos_start = 0.0  # when the chaos began (monotonic; 0: not yet)
    full_seen = False  # a progress line with every actor's segment has appeared
    chaos_until = 0.0  # the end of its minutes (monotonic)
    overtime = False  # --every-kind: it went on past them (said)
    ended_s: float | None = None  # chaos time of its end, once ended


def no_victim(kind: str, given_cluster: bool) -> str:
    """Why a kind has no process to kill now, in words."""
    where = " on this machine (with --address only the run's processes on the bench's machine are killed)" \
        if given_cluster else ""
    if kind == "evaluation":
        return f"no evaluation actor alive{where}: it lives only while the run evaluates (every run.eval_every " \
               "iterations)"
    if kind == "driver":
        return f"no driver alive{where} (its job is starting)"
    if kind == "hang":
        return f"no Ray actor of the run alive and running{where} (starting, being replaced, or stopped already)"
    return f"no ray::{ACTOR_CLASSES[kind]} process alive{where} (starting, or being replaced)"
