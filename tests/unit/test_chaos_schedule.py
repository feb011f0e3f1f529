"""The chaos bench's schedule and its accounting of env steps, on their own (no Ray, no processes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dppo.bench.chaos_report import RunLog, account, recovery_rows, run_row
from dppo.bench.chaos_schedule import Kill, make_schedule, parse_kinds, parse_rates, pick, write_schedule
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
    write_schedule(tmp_path / "schedule.json", [Kill(1.5, "actor")], [{"kind": "actor", "victim": 42}], {"seed": 1})
    data = json.loads((tmp_path / "schedule.json").read_text())
    assert data["planned"] == [{"at_s": 1.5, "kind": "actor"}] and data["kills"][0]["victim"] == 42


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
    assert rows[0] == {"kind": "actor", "kills": 2, "recovered": 1, "recover_median_s": 4.0, "recover_worst_s": 4.0}
    assert rows[1]["kills"] == 0
    row, _ = run_row([run], kills, E_T, 2, 500.0, {"shm": [], "processes": []})
    assert row["accounting_exact"] and row["rewinds"] == 0 and row["rewinds_ok"]
    assert row["longest_gap_s"] == 3.0 and row["return_ratio"] == 0.94
