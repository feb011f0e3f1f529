"""`dppo bench chaos`, the half-minute form: a chart-shaped local cluster (token auth, `ray job submit`), every kind of
process killed at least once (sampling actors, both learners, the inference service, the evaluation actor, a
worker node, the driver), and afterwards every env step accounted for, nothing left behind, every job SUCCEEDED; a
line said as each kill happened, and a report that opens with its verdict in words."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

KINDS = ["actor", "learner", "inference", "evaluation", "node", "driver"]
# Kills per minute, 6 for the others (3 each in the half minute). With seed 21 each process kind's first kill comes in
# the first 10 s of training, the node's at 11 s (back 10 s later) and the driver's (whose restart takes the run's
# processes with it) at 26 s (chaos_schedule.make_schedule: half a minute holds them all, the node back before the
# driver goes). A kill waits for a victim and for the run to recover from the last of its kind; what the half minute
# does not reach is not done (schedule.json says why) unless its kind has not been hit yet: --every-kind goes on for
# those (on a loaded machine the half minute can end before an evaluation is in flight: CI of 086b777 at load 4 and
# of cc2143d).
RATES = {"node": 2.0, "driver": 2.0}
SEED = 21


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_half_a_minute_of_chaos_loses_no_step_and_leaves_nothing(tmp_path: Path) -> None:
    out, docs, rows = tmp_path / "chaos", tmp_path / "benchmarks.md", tmp_path / "rows.json"
    done = subprocess.run([sys.executable, "-m", "dppo", "bench", "chaos", "--config", "configs/cartpole.yaml",
                           "--set", "run.learners=2", "--set", "run.inference=server",
                           "--set", "run.total_steps=24576", "--set", "run.checkpoint_every=5",
                           "--minutes", "0.5", "--seed", str(SEED), "--kinds", ",".join(KINDS),
                           *[arg for kind in KINDS for arg in ("--rate", f"{kind}={RATES.get(kind, 6.0)}")],
                           "--node-down-s", "10", "--every-kind", "--no-baseline", "--out", str(out),
                           "--json", str(rows), "--write-docs", str(docs)],
                          capture_output=True, text=True, timeout=1400, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((out / "results.json").read_text())
    run, kills = result["run"], {row["kind"]: row for row in result["kills"]}
    assert all(kills[kind]["kills"] >= 1 for kind in KINDS), f"{[(k, r['kills']) for k, r in kills.items()]}"
    assert set(run["final_status"].split(",")) == {"SUCCEEDED"}, result["runs"]
    assert run["accounting_exact"], result["runs"]
    assert run["steps_trained"] == run["steps_in_progress"] > 0
    assert run["rewinds"] <= kills["driver"]["kills"] and run["rewinds_ok"]
    assert run["shm_left"] == 0 and run["processes_left"] == 0, result["leftovers"]
    schedule = json.loads((out / "schedule.json").read_text())
    assert {k["kind"] for k in schedule["kills"]} == set(KINDS) and schedule["settings"]["seed"] == SEED
    late = [k for k in schedule["kills"] if k["done_s"] > 30]  # past the half minute: only each kind's first kill
    assert all(not any(e["kind"] == k["kind"] and e["done_s"] < k["done_s"] for e in schedule["kills"]) for k in late)
    assert all(m["why"] for m in schedule["not_done"])  # a planned kill not done says why
    # the report reads at a glance: the verdict first, then the tables (plain names) and their legend
    lines = done.stdout.splitlines()
    report = lines.index(result["verdict"][0])
    assert result["verdict"][0].startswith("nothing lost: every env step accounted"), result["verdict"]
    assert lines[report + 1] == result["verdict"][1]
    assert "| killed | planned | done | not done |" in done.stdout and "**jobs**" in done.stdout
    # a line per kill as it happened, before the report: each at its moment of the chaos's clock
    said = [re.match(r"chaos t=(\d+):(\d\d) killed ", line) for line in lines[:report]]
    said_s = [int(m[1]) * 60 + int(m[2]) for m in said if m]
    assert len(said_s) == len(schedule["kills"]), lines[:report]
    assert all(abs(at - k["done_s"]) <= 1 for at, k in zip(said_s, schedule["kills"], strict=True))
    assert "<!-- dppo-bench:chaos:begin -->" in docs.read_text() and result["verdict"][0] in docs.read_text()
    assert json.loads(rows.read_text())["run"]["accounting_exact"]
