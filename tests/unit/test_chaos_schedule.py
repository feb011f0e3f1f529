"""The chaos bench's schedule, its accounting of env steps (a multi-agent env's columns included) and the report a
user reads, on their own (no Ray cluster)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from ray.util.state.common import ActorState

from dppo.bench.chaos import env_steps_per_segment
from dppo.bench.chaos_cluster import Cluster, machine_ips, own_processes
from dppo.bench.chaos_loop import Chaos
from dppo.bench.chaos_readout import Narrator, kill_rows, report_text, verdict
from dppo.bench.chaos_report import RunLog, account, recovery_rows, run_row
from dppo.bench.chaos_schedule import Kill, make_schedule, parse_kinds, parse_rates, pick, write_schedule
from dppo.bench.local_cluster import LocalCluster
from dppo.config import load_config
from dppo.errors import UsageError

E_T = 8 * 64  # env steps per segment


def test_a_seed_gives_the_same_schedule_and_each_rate_its_count() -> None:
    rates = {"actor": 1.5, "node": 0.2, "driver": 0.0}
    first = make_schedule(rates, 20, seed=3)
    assert first == make_schedule(rates, 20, seed=3)
    assert first != make_schedule(rates, 20, seed=4)
    assert sum(k.kind == "actor" for k in first) == 30 and sum(k.kind == "node" for k in first) == 4
    assert not any(k.kind == "driver" for k in first)
    assert [k.at_s for k in first] == sorted(k.at_s for k in first)
    assert all(0 <= k.at_s < 20 * 60 for k in first)
    # one kill in each equal slot: spread over the run, never bunched at the start
    actors = [k.at_s for k in first if k.kind == "actor"]
    assert all(i * 40 <= at < (i + 1) * 40 for i, at in enumerate(actors))


def test_adding_a_kind_leaves_the_other_kinds_moments() -> None:
    alone = make_schedule({"actor": 1.0}, 10, seed=1)
    mixed = make_schedule({"actor": 1.0, "learner": 2.0}, 10, seed=1)
    assert [k for k in mixed if k.kind == "actor"] == alone


def test_the_victim_is_seeded_and_independent_of_the_order_found() -> None:
    assert pick([30, 10, 20], 1, 5) == pick([10, 20, 30], 1, 5)
    assert {pick([10, 20, 30], 1, i) for i in range(40)} == {10, 20, 30}


@pytest.mark.parametrize(("kinds", "rates", "says"), [
    ("actor,gremlin", [], "unknown kind gremlin"),
    ("", [], "unknown kind (none given)"),
    ("actor", ["actor=-1"], "must be >= 0"),
    ("actor", ["actor=nan"], "must be >= 0"),
    ("actor", ["actor"], "is not KIND=PER_MIN"),
    ("actor", ["node=1"], "not in --kinds"),
    ("actor", ["actor=fast"], "is not a number"),
])
def test_bad_kinds_and_rates_say_what_is_wrong(kinds: str, rates: list[str], says: str) -> None:
    with pytest.raises(UsageError, match=says.replace("(", r"\(").replace(")", r"\)")):
        parse_rates(rates, parse_kinds(kinds))


def test_rates_default_per_kind_and_override() -> None:
    assert parse_rates(["node=0.5"], ["actor", "node"]) == {"actor": 1.2, "node": 0.5}


def test_the_schedule_is_written_beside_the_results(tmp_path: Path) -> None:
    write_schedule(tmp_path / "schedule.json", [Kill(1.5, "actor"), Kill(2.0, "evaluation")],
                   [{"kind": "actor", "victim": 42}], {"seed": 1},
                   [{"kind": "evaluation", "planned_s": 2.0, "why": "no evaluation actor alive"}])
    data = json.loads((tmp_path / "schedule.json").read_text())
    assert data["planned"][0] == {"at_s": 1.5, "kind": "actor"} and data["kills"][0]["victim"] == 42
    assert data["not_done"] == [{"kind": "evaluation", "planned_s": 2.0, "why": "no evaluation actor alive"}]


def record(iteration: int, segments: int = 2, steps_before: int | None = None) -> dict[str, object]:
    before = (iteration - 1) * 2 * E_T if steps_before is None else steps_before
    return {"iteration": iteration, "segments": segments, "env_steps_delta": segments * E_T,
            "env_steps": before + segments * E_T}


def test_a_run_resumed_after_a_driver_kill_accounts_for_every_step() -> None:
    """Attempt 0 wrote iterations 1-5, the checkpoint was at 3: the resume cuts 4-5 (one rewind, named) and writes
    4-6 again; iteration 2 lost one actor's segment (a short round, named)."""
    first = [record(1), record(2, segments=1), *(record(i, steps_before=(i - 1) * 2 * E_T - E_T) for i in (3, 4, 5))]
    again = [record(i, steps_before=(i - 1) * 2 * E_T - E_T) for i in (4, 5, 6)]
    run = RunLog(1, seen=[(float(i), 0, r) for i, r in enumerate(first)]
                 + [(10.0 + i, 1, r) for i, r in enumerate(again)],
                 final=[*first[:3], *again], statuses=["FAILED", "SUCCEEDED"])
    run.summary = {"env_steps": again[-1]["env_steps"], "segments_dropped": 0, "episode_return_mean": 480.0}
    result = account(run, E_T, 2)
    assert result["exact"], result
    assert result["rewinds"] == 1 and result["rewound"] == ["1:4", "1:5"] and result["rewound_steps"] == 4 * E_T
    assert result["short_rounds"] == ["1:2 (1/2)"]
    assert result["trained"] == result["in_progress"] == 11 * E_T


def test_a_step_counted_twice_or_lost_is_not_exact() -> None:
    records = [record(1), record(2), record(3)]
    twice = RunLog(1, seen=[(0.0, 0, r) for r in records], final=records, statuses=["SUCCEEDED"],
                   summary={"env_steps": 4 * E_T})  # the summary says less than the lines add up to
    assert not account(twice, E_T, 2)["exact"]
    gap = RunLog(1, seen=[(0.0, 0, r) for r in records], final=[records[0], records[2]], statuses=["SUCCEEDED"],
                 summary={"env_steps": 6 * E_T})  # iteration 2 missing from the file
    assert not account(gap, E_T, 2)["exact"]
    altered = dict(records[1], env_steps=records[1]["env_steps"] + 1)  # a line changed after it was seen
    changed = RunLog(1, seen=[(0.0, 0, r) for r in records], final=[records[0], altered, records[2]],
                     statuses=["SUCCEEDED"], summary={"env_steps": 6 * E_T})
    assert not account(changed, E_T, 2)["exact"]


def test_recovery_is_timed_to_the_next_full_round_and_rewinds_are_held_to_driver_kills() -> None:
    seen = [(1.0, 0, record(1)), (3.0, 0, record(2, segments=1)), (6.0, 0, record(3))]
    run = RunLog(1, seen=seen, final=[r for _, _, r in seen], statuses=["SUCCEEDED"],
                 summary={"env_steps": 5 * E_T, "episode_return_mean": 470.0})
    run.final[2] = dict(run.final[2], env_steps=5 * E_T)
    run.seen[2] = (6.0, 0, run.final[2])
    kills = [{"kind": "actor", "at": 2.0, "victim": 7}, {"kind": "actor", "at": 7.0, "victim": 8},
             {"kind": "node", "at": 2.5, "victim": None}]
    rows = recovery_rows(kills, [run], 2, ["actor", "node"])
    assert rows[0] == {"kind": "actor", "kills": 2, "recovered": 1, "recover_median_s": 4.0, "recover_worst_s": 4.0,
                       "finished": 0}  # kills not tagged with their run: none said to end with it
    assert rows[1]["kills"] == 0
    row, _ = run_row([run], kills, E_T, 2, 500.0, {"shm": [], "processes": []})
    assert row["accounting_exact"] and row["rewinds"] == 0 and row["rewinds_ok"]
    assert row["longest_gap_s"] == 3.0 and row["return_change"] == -30.0


@pytest.mark.parametrize(("overrides", "steps"), [
    ({"env.id": "CartPole-v1", "env.num_envs": 8, "ppo.segment_length": 32}, 8 * 32),
    # a PettingZoo Parallel env: each copy gives one column per agent (simple_spread: 3)
    ({"env.id": "mpe2.simple_spread_v3", "env.num_envs": 2, "ppo.segment_length": 25}, 2 * 3 * 25),
    # self-play: one learning seat per game
    ({"env.id": "pettingzoo.classic.tictactoe_v3", "env.num_envs": 64, "ppo.segment_length": 32}, 64 * 32),
])
def test_a_segment_holds_every_agent_column(overrides: dict[str, object], steps: int) -> None:
    assert env_steps_per_segment(load_config(overrides=overrides)) == steps


def test_a_multi_agent_run_accounts_exactly_by_its_agent_columns() -> None:
    """Records as a simple_spread run writes them (2 actors x 2 copies x 3 agents x 25 steps a round): exact when a
    segment is counted by its agent columns, not when it is counted as one agent's (env.num_envs x T)."""
    columns = env_steps_per_segment(load_config(overrides={"env.id": "mpe2.simple_spread_v3", "env.num_envs": 2,
                                                           "ppo.segment_length": 25}))
    records = [{"iteration": i, "segments": 2, "env_steps_delta": 300, "env_steps": 300 * i} for i in (1, 2, 3)]
    run = RunLog(1, seen=[(float(i), 0, r) for i, r in enumerate(records)], final=records, statuses=["SUCCEEDED"],
                 summary={"env_steps": 900, "segments_dropped": 0})
    assert account(run, columns, 2)["exact"]
    assert not account(run, 2 * 25, 2)["exact"]  # one agent's count: every line looks three times too big


def a_run_with_kills() -> tuple[RunLog, list[dict[str, object]], list[dict[str, object]]]:
    """One run of 3 iterations in 2 jobs (its driver killed once), an actor killed and recovered from 4 s later, and
    an evaluation kill that never found its victim."""
    seen = [(1.0, 0, record(1)), (3.0, 1, record(2)), (6.0, 1, record(3))]
    run = RunLog(1, seen=seen, final=[r for _, _, r in seen], statuses=["FAILED", "SUCCEEDED"],
                 summary={"env_steps": 6 * E_T, "segments_dropped": 0, "episode_return_mean": 499.0})
    kills = [{"kind": "actor", "at": 2.0, "victim": 7, "done_s": 1.0}, {"kind": "driver", "at": 2.5, "victim": 9}]
    missed = [{"kind": "evaluation", "planned_s": 50.0,
               "why": "no evaluation actor alive: it lives only while the run evaluates, until the chaos ended"}]
    return run, kills, missed


def test_the_report_opens_with_its_verdict_in_words_then_plain_tables_and_a_legend() -> None:
    run, kills, missed = a_run_with_kills()
    row, accounts = run_row([run], kills, E_T, 2, 500.0, {"shm": [], "processes": []})
    words = kill_rows(recovery_rows(kills, [run], 2, ["actor", "evaluation", "driver"]), missed)
    lines = report_text(row, accounts, words, missed).splitlines()
    assert lines[0] == ("nothing lost: every env step accounted (3,072 trained), 0 rewound; nothing left behind; "
                        "return -1 against the run without chaos (499 vs 500)")
    assert lines[1].startswith("2 kills (1 actor, 0 evaluation, 1 driver) in 1 training run and 2 job attempts;")
    assert ("| killed | planned | done | not done | recovered | run ended first | recovery median (s) | recovery "
            "worst (s) |") in lines
    assert "| evaluation | 1 | 0 | 1 | 0 | 0 | - | - |" in lines
    assert f"| evaluation | t=0:50 | {missed[0]['why']} |" in lines  # a planned kill not done says why
    assert "| 1 | 2 | SUCCEEDED | 3072 | 3072 | 0 | 0 | 0 | - | yes |" in lines  # run 1 in 2 jobs
    text = "\n".join(lines)
    assert "**run**" in text and "**jobs**" in text  # the legend tells a run from a job attempt
    assert not any(name in text for name in ("accounting_exact", "recover_median_s", "steps_in_progress"))


def test_the_verdict_names_what_went_wrong() -> None:
    run, kills, _ = a_run_with_kills()
    run.summary["env_steps"] = 5 * E_T  # a round's steps missing from the trained count
    row, accounts = run_row([run], kills, E_T, 2, 500.0, {"shm": [], "processes": ["ray::Actor"]})
    words = kill_rows(recovery_rows(kills, [run], 2, ["actor", "driver"]), [])
    assert verdict(row, accounts, words, [])[0] == (
        "PROBLEMS: run 1's env steps NOT accounted; left behind: 1 processes, 0 /dev/shm entries (results.json: "
        "leftovers); return -1 against the run without chaos (499 vs 500)")


def titled(title: str) -> subprocess.Popen[bytes]:
    """A process whose command line starts with ``title`` (as a Ray worker's or a driver's does), once it has."""
    process = subprocess.Popen(["bash", "-c", f"exec -a {shlex.quote(title)} sleep 60"])
    deadline = time.monotonic() + 10
    while psutil.Process(process.pid).cmdline()[:1] != [title]:  # bash until it execs
        assert time.monotonic() < deadline, f"{title} did not start"
        time.sleep(0.02)
    return process


def test_on_a_given_cluster_only_the_runs_own_processes_on_this_machine_are_its() -> None:
    """With --address, Ray reports pids of every node: one of a node elsewhere names another process here (another
    run's actor, the test itself), and another job's actor here is another run's: none is the run's."""
    ours, others, driver = titled("ray::Actor.sample"), titled("ray::Actor.sample"), \
        titled("python -m dppo train --config /out/config.yaml")
    try:
        def actor(job: str, node: str, pid: int) -> ActorState:
            return ActorState(actor_id=f"{pid:032x}", class_name="Actor", state="ALIVE", job_id=job, name="",
                              node_id=node, pid=pid, ray_namespace="chaos")

        job = {"job_id": "02000000", "driver_info": {"id": "02000000", "node_ip_address": "127.0.0.1",
                                                     "pid": driver.pid}}
        actors = [actor("02000000", "here", ours.pid), actor("02000000", "far", others.pid),
                  actor("03000000", "here", others.pid), actor("02000000", "here", os.getpid())]
        nodes = {"here": "127.0.0.1", "far": "10.9.9.9"}
        assert "127.0.0.1" in machine_ips()
        found = own_processes(job, actors, nodes, machine_ips(), "/out")
        assert sorted(p.pid for p in found) == sorted([ours.pid, driver.pid])
        far_driver = {**job, "driver_info": {**job["driver_info"], "node_ip_address": "10.9.9.9"}}
        assert [p.pid for p in own_processes(far_driver, actors, nodes, machine_ips(), "/out")] == [ours.pid]
    finally:
        for process in (ours, others, driver):
            process.kill()
            process.wait()


def test_each_kill_recovery_and_reason_to_wait_is_a_line_as_it_happens(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """The loop on a cluster of one process titled as a sampling actor: the actor kill is done and said, the
    evaluation and node kills wait and say why once, the recovery is said when a full round appears, and the kills
    never done keep their reason."""
    local = LocalCluster({}, root=tmp_path)
    local.nodes["head"] = titled("ray::Actor.sample")
    plan = [Kill(1.0, "actor"), Kill(1.5, "evaluation"), Kill(2.0, "node"), Kill(50.0, "driver")]
    chaos = Chaos(Cluster("", {}, local, str(tmp_path)), tmp_path, "true", list(plan), 1, 10.0, 1,
                  Narrator(10_000, 60.0))
    now = time.monotonic()
    chaos.chaos_start = chaos.say.start = now - 5.0
    chaos.chaos_until, chaos.full, chaos.full_seen = now + 55.0, 2, True
    try:
        chaos.kill_due(now, 1)
        chaos.kill_due(now + 0.2, 1)  # the same reasons: no new line
        assert local.nodes["head"].wait(timeout=10) == -9  # SIGKILLed
    finally:
        local.nodes["head"].kill()
    (tmp_path / "progress.jsonl").write_text(json.dumps(record(1)) + "\n")
    chaos.read_progress(tmp_path, set(), RunLog(1), 0)  # seen at once: its round was gathered before the kill
    chaos.done[0]["at"] -= 3.0
    (tmp_path / "progress.jsonl").write_text(json.dumps(record(1)) + "\n" + json.dumps(record(2)) + "\n")
    chaos.read_progress(tmp_path, {json.dumps(record(1))}, RunLog(1), 0)  # 3 s after the kill: recovered
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4, lines
    assert lines[0].startswith(f"chaos t=0:05 killed actor pid {local.nodes['head'].pid}; planned at t=0:01; run 1")
    assert lines[1] == "chaos t=0:05 the evaluation kill planned at t=0:01 waits: no evaluation actor alive: it " \
                       "lives only while the run evaluates (every run.eval_every iterations)"
    assert lines[2] == "chaos t=0:05 the node kill planned at t=0:02 waits: no worker node up"
    recovered = re.search(r"recovered from the actor kill at t=0:05 in (\d+\.\d) s \(run 1, iteration 2 with every "
                          r"actor's", lines[3])  # 3 s before, and the test's own seconds since on a loaded machine
    assert recovered is not None and 3.0 <= float(recovered.group(1)) < 4.0, lines[3]
    missed = chaos.missed("the chaos ended at t=1:00")
    assert [(m["kind"], m["why"].split(":")[0]) for m in missed] == [
        ("evaluation", "no evaluation actor alive"), ("node", "no worker node up, until the chaos ended at t=1"),
        ("driver", "its moment never came")]


def test_a_kill_whose_run_ended_before_it_recovered_holds_back_no_later_kill(tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """An evaluation killed as run 1 finished has no full line of run 1 after it: run 2's evaluation kills go on
    (before, every evaluation kill of a 60-minute chaos run after its first waited on it, and none was done)."""
    local = LocalCluster({}, root=tmp_path)
    local.nodes["head"] = titled("ray::Evaluator.evaluate")
    chaos = Chaos(Cluster("", {}, local, str(tmp_path)), tmp_path, "true", [Kill(1.0, "evaluation")], 1, 10.0, 1,
                  Narrator(10_000, 60.0))
    now = time.monotonic()
    chaos.chaos_start = chaos.say.start = now - 5.0
    chaos.chaos_until, chaos.full, chaos.full_seen = now + 55.0, 2, True
    chaos.done.append({"kind": "evaluation", "planned_s": 0.5, "done_s": 0.5, "at": now - 4.5, "victim": 1, "run": 1})
    try:
        chaos.kill_due(now, 2)
        assert local.nodes["head"].wait(timeout=10) == -9  # SIGKILLed
    finally:
        local.nodes["head"].kill()
    assert [k["run"] for k in chaos.done] == [1, 2] and chaos.plan == []
    assert "waits" not in capsys.readouterr().out


@pytest.mark.parametrize("every_kind", [False, True])
def test_every_kind_goes_on_past_the_minutes_for_a_kind_not_killed_yet(tmp_path: Path, every_kind: bool,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A half minute that ends before an evaluation was in flight (a loaded machine): with --every-kind the chaos
    goes on, due only the kills of the kinds not killed yet, says so once, and ends when each has been killed (or
    at its bound); without it, it ends at its minutes with that kill not done."""
    plan = [Kill(5.0, "actor"), Kill(8.0, "evaluation"), Kill(20.0, "actor")]
    chaos = Chaos(Cluster("", {}, None, str(tmp_path)), tmp_path, "true", list(plan), 1, 10.0, 1,
                  Narrator(10_000, 30.0), every_kind)
    now = time.monotonic()
    chaos.chaos_start = chaos.say.start = now - 40.0
    chaos.chaos_until = now - 10.0  # its half minute ended 10 s ago
    chaos.done.append({"kind": "actor", "planned_s": 5.0, "done_s": 5.0, "at": now - 35.0, "victim": 1, "run": 1})
    chaos.plan.remove(plan[0])
    assert chaos.going_on(now) is every_kind
    assert chaos.due(now) == ([plan[1]] if every_kind else [])  # the later actor kill is not due: actor was hit
    assert chaos.going_on(now + 1.0) is every_kind and chaos.ended_s == (None if every_kind else 30.0)
    said = [line for line in capsys.readouterr().out.splitlines() if "goes on" in line]
    assert said == (["chaos t=0:40 the chaos's planned time (until t=0:30) is over; it goes on (--every-kind) until "
                     "evaluation has been killed once, at most until t=10:30"] if every_kind else [])
    if every_kind:
        chaos.done.append({"kind": "evaluation", "planned_s": 8.0, "done_s": 45.0, "at": now + 5.0, "victim": 2,
                           "run": 1})
        chaos.plan.remove(plan[1])
        assert not chaos.going_on(now + 5.2) and chaos.ended_s == pytest.approx(45.2)
        assert chaos.due(now + 6.0) == []
        fresh = Chaos(Cluster("", {}, None, str(tmp_path)), tmp_path, "true", [Kill(8.0, "evaluation")], 1, 10.0, 1,
                      Narrator(10_000, 30.0), every_kind)
        fresh.chaos_start, fresh.chaos_until = now - 40.0, now - 10.0
        assert fresh.going_on(now + 589.0) and not fresh.going_on(now + 590.0)  # at most 10 minutes more
        assert [m["kind"] for m in fresh.missed("the chaos ended at t=10:30")] == ["evaluation"]


def test_a_node_whose_start_exits_is_started_again_and_its_leftovers_go(tmp_path: Path) -> None:
    """A `ray start` that gives up (its raylet not registered in time, on a loaded machine) is started again as a
    pod's container would be; what the failed try left in its process group (its GCS) is killed; a node that never
    starts is one error naming it after the last try, with its first try's log and its last's."""
    local = LocalCluster({}, root=tmp_path)
    tries = tmp_path / "tries"
    # The first try leaves a child behind (a GCS, say) and exits; the second says Ray runs and stays.
    script = (f'echo x >> {tries}; if [ $(wc -l < {tries}) -lt 2 ]; then sleep 300 & echo $! > {tmp_path}/left; '
              'exit 1; fi; echo "Ray runtime started."; exec sleep 300')
    try:
        local.start("head", ["sh", "-c", script], env=dict(os.environ), timeout=30)
        assert tries.read_text().count("x") == 2
        left = int((tmp_path / "left").read_text())
        deadline = time.monotonic() + 10
        while psutil.pid_exists(left) and psutil.Process(left).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the failed try's child outlived it"
            time.sleep(0.1)
        assert local.nodes["head"].poll() is None and "Ray runtime started" in local.log("head-restart-1")
        with pytest.raises(RuntimeError, match=r"Ray node worker did not start in 2 tries"):
            local.start("worker", ["sh", "-c", "echo no; exit 1"], env=dict(os.environ), tries=2)
        # a command made for each try (a node's ports chosen afresh): each try runs its own
        made = iter(range(2))
        with pytest.raises(RuntimeError, match=r"(?s)the first try's log ends:\ntry 0.*the last try's:\ntry 1"):
            local.start("other", lambda: ["sh", "-c", f"echo try {next(made)}; exit 1"], env=dict(os.environ), tries=2)
    finally:
        for proc in local.nodes.values():
            proc.kill()
            proc.wait()


def test_a_node_whose_start_gives_up_later_is_started_again_with_its_command(tmp_path: Path) -> None:
    """A node started without waiting (one coming back while a run goes on) whose `ray start` then exits is started
    again by ``restart_if_exited`` with the command made afresh, its leftovers killed and its log kept; a node that
    runs is left alone."""
    local = LocalCluster({}, root=tmp_path)
    made = iter(range(3))

    def command() -> list[str]:
        n = next(made)  # the first try leaves a child behind and gives up; the second runs
        if n == 0:
            return ["sh", "-c", f'sleep 300 & echo $! > {tmp_path}/left; echo "try 0"; exit 1']
        return ["sh", "-c", f'echo "try {n}"; echo "Ray runtime started."; exec sleep 300']

    try:
        local.start("worker", command, env=dict(os.environ), wait=False)
        local.nodes["worker"].wait(timeout=30)
        assert local.restart_if_exited("worker")
        left = int((tmp_path / "left").read_text())
        assert not psutil.pid_exists(left) or psutil.Process(left).status() == psutil.STATUS_ZOMBIE
        assert "try 0" in local.log("worker-exited-1")
        deadline = time.monotonic() + 10
        while "Ray runtime started" not in local.log("worker"):
            assert time.monotonic() < deadline and local.nodes["worker"].poll() is None, local.log("worker")
            time.sleep(0.1)
        assert "try 1" in local.log("worker") and not local.restart_if_exited("worker")
        assert not local.restart_if_exited("never-started")
    finally:
        for proc in local.nodes.values():
            proc.kill()
            proc.wait()
