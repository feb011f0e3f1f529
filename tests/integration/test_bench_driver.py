"""`dppo bench driver`: the run's own Coordinator with N tiny actors, its driver-side work broken down per iteration.

No wall time is asserted: the checks are on the counts the driver makes (the ``ray.wait`` polls over the refs still
pending), the pieces fitting the whole, the inference service's batch figures in server rows, and the section
written.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dppo.bench.docs import section_markers
from dppo.cli_args import Parser
from dppo.commands.bench import register
from dppo.errors import UsageError


def run_bench(argv: list[str]) -> int:
    parser = Parser(prog="dppo")
    register(parser.add_subparsers(dest="command", required=True, parser_class=Parser))
    args = parser.parse_args(["bench", *argv])
    return args.func(args)


def test_driver_command_breaks_the_iteration_down_per_n(ray_address: str, tmp_path: Path) -> None:
    out, docs = tmp_path / "driver.json", tmp_path / "benchmarks.md"
    argv = ["driver", "--actors", "1,2", "--iterations", "3", "--segment-length", "4", "--inference", "actor,server",
            "--json", str(out), "--write-docs", str(docs), "--address", ray_address]
    assert run_bench(argv) == 0
    rows = json.loads(out.read_text())
    assert [(r["actors"], r["inference"]) for r in rows] == [(1, "actor"), (1, "server"), (2, "actor"), (2, "server")]
    for row in rows:
        n = row["actors"]
        if row["inference"] == "server":  # a pass per env step and one for the last values, at most N rows each
            assert row["inference_batches"] >= 4 + 1 and 1 <= row["inference_rows"] <= n
            assert row["inference_forward_ms"] > 0 and row["inference_queue_ms"] >= 0
        else:
            assert "inference_batches" not in row
        assert row["iterations"] == 3 and row["startup_s"] > 0
        # the overhead is the iteration less the slowest actor's sampling, and its parts are inside the iteration
        assert row["iteration_ms"] > row["overhead_ms"] > 0 and row["sample_ms"] > 0
        assert row["overhead_per_actor_ms"] == pytest.approx(row["overhead_ms"] / n, abs=1e-3)
        for piece in ("broadcast_ms", "gather_wait_ms", "gather_get_ms", "batch_ms", "sgd_ms", "report_ms"):
            assert 0 < row[piece] < row["iteration_ms"], piece
        # each poll is over the refs still pending of the n asked: at least one, at most n
        assert row["polls"] >= 1 and row["polls"] <= row["polled_refs"] <= row["polls"] * n and row["poll_us"] > 0
        assert row["driver_cpu_ms"] > 0 and row["actor_rss_mib"] > row["actor_pss_mib"] > 0
    text = docs.read_text()
    begin, end = section_markers("driver-CartPole-v1")
    assert begin in text and end in text and "dppo bench driver" in text and "Machine:" in text
    assert "what breaks first at 1,000 actors" in text and "inference_queue_ms" in text
    assert re.search(r"the 1,000 polls of a 1,000-segment gather with every object ready took \d+ ms", text)


def test_driver_bad_input_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="--actors"):
        run_bench(["driver", "--actors", "0"])
    with pytest.raises(UsageError, match=r"run\.actors"):  # before Ray or any actor starts
        run_bench(["driver", "--actors", "16,2000"])
    with pytest.raises(SystemExit):
        run_bench(["driver", "--actor-cpus", "0"])
    with pytest.raises(SystemExit):
        run_bench(["driver", "--inference", "actor,gpu"])
    with pytest.raises(UsageError, match=r"env\.num_envs must be even"):
        run_bench(["driver", "--inference", "server", "--envs-per-actor", "3"])


def test_with_learner_processes_the_driver_receives_summaries_not_segments(ray_address: str, tmp_path: Path) -> None:
    """Issue 56: Atari-sized segments (8 steps of 84x84x4 uint8 frames, 220 KiB) cross into the driver with one
    learner (it updates there); with two learner processes only each segment's summary does, under 1 KiB."""
    rows = {}
    for learners in (1, 2):
        out = tmp_path / f"driver-{learners}.json"
        argv = ["driver", "--actors", "2", "--iterations", "2", "--segment-length", "8", "--env", "dppo/Frames-v0",
                "--learners", str(learners), "--json", str(out), "--address", ray_address]
        assert run_bench(argv) == 0
        (rows[learners],) = json.loads(out.read_text())
    segment_kib = 8 * 84 * 84 * 4 / 1024
    assert rows[1]["learners"] == 1 and rows[1]["received_kib_per_actor"] > segment_kib
    assert rows[2]["learners"] == 2 and rows[2]["received_kib_per_actor"] < 1
