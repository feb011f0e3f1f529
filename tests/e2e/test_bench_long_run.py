"""`dppo bench chaos --no-faults`, in small: one CartPole run trained for 21 s on a chart-shaped local cluster
while every process is read each 2 s; afterwards a reading per 2 s, a growth figure per process of the run and of
Ray, nothing left in /dev/shm, the run dir bounded by its checkpoints, and the section and figure in the docs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_a_run_without_faults_is_read_every_interval_and_leaves_nothing(tmp_path: Path) -> None:
    out, docs = tmp_path / "long", tmp_path / "docs" / "benchmarks.md"
    done = subprocess.run([sys.executable, "-m", "dppo", "bench", "chaos", "--no-faults", "--minutes", "0.35",
                           "--sample-s", "2", "--warmup-min", "0.1", "--env", "CartPole-v1",
                           "--set", "run.actors=2", "--set", "run.checkpoint_every=5", "--workers", "1",
                           "--out", str(out), "--write-docs", str(docs)],
                          capture_output=True, text=True, timeout=1400, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((out / "results.json").read_text())
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    training = [s for s in samples if s["training_s"] is not None]
    assert len(training) >= 8  # a reading each 2 s of the 21 s trained
    assert [s["t_s"] for s in samples] == sorted(s["t_s"] for s in samples)  # one reading after another
    assert result["run"]["final_status"] == "SUCCEEDED" and result["kills"] == []
    growth = result["growth"]
    roles = {row["process"] for row in growth["processes"]}
    assert {"driver", "actor", "raylet", "gcs"} <= roles, roles
    assert all(row["growth (%/h)"] is not None for row in growth["processes"])
    assert sum(row["process"] == "actor" for row in growth["processes"]) == 2
    totals = growth["totals"]
    assert totals["minutes trained"] >= 0.3 and totals["/dev/shm left at end"] == 0
    assert result["leftovers"]["shm"] == [] and result["leftovers"]["processes"] == []
    assert 1 <= totals["checkpoints max"] <= 4 and totals["object store max (MiB)"] is not None
    assert any(s["shm"]["entries"] for s in training)  # the run's shared memory was seen while it ran
    assert growth["verdict"][0] in done.stdout.splitlines()  # the report opens with its verdict
    text = docs.read_text()
    assert "<!-- dppo-bench:long-cartpole-v1:begin -->" in text and growth["verdict"][0] in text
    assert "![Long run: CartPole-v1, 0.35 minutes without faults](bench-long-cartpole-v1.png)" in text
    assert (docs.parent / "bench-long-cartpole-v1.png").stat().st_size > 10_000
