"""`dppo bench`: every command runs on tiny settings and writes well-formed rows and doc sections.

No wall time is asserted anywhere: these check shapes, keys and files, not speed.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import pytest
import ray
from runs import progress_records

from benchmarks.__main__ import parse as benchmarks_args
from dppo.bench.docs import section_markers
from dppo.bench.sampling import bench_sampling
from dppo.bench.update import bench_update
from dppo.cli_args import Parser
from dppo.commands.bench import register
from dppo.config import load_config
from dppo.errors import UsageError

TINY = ["--envs-per-actor", "2", "--segment-length", "8", "--iterations", "1"]


def run_bench(argv: list[str]) -> int:
    parser = Parser(prog="dppo")
    register(parser.add_subparsers(dest="command", required=True, parser_class=Parser))
    args = parser.parse_args(["bench", *argv])
    return args.func(args)


def run_benchmark(argv: list[str]) -> int:
    """A clone's `python -m benchmarks ARGV`, in this process (a UsageError raised, not printed)."""
    args = benchmarks_args(argv)
    return args.func(args)


def test_sampling_rows_include_the_in_process_baseline(ray_address: str) -> None:
    rows = bench_sampling([1, 2], envs_per_actor=2, segment_length=8, iterations=1, address=ray_address)
    assert [(r["mode"], r["actors"]) for r in rows] == [("raw-loop", 0), ("in-process", 0), ("ray", 1), ("ray", 2)]
    for r in rows:
        assert r["steps_per_s"] > 0 and r["efficiency"] > 0 and r["envs_per_actor"] == 2
    assert rows[1]["efficiency"] == 1.0
    assert rows[2]["processes"] >= 2 and rows[2]["rss_mib"] > 0


def test_sampling_command_writes_json_and_docs(ray_address: str, tmp_path: Path) -> None:
    out, docs = tmp_path / "rows.json", tmp_path / "docs" / "benchmarks.md"
    argv = ["sampling", "--actors", "1", "--env-latency-ms", "1", *TINY, "--json", str(out),
            "--write-docs", str(docs), "--address", ray_address]
    assert run_bench(argv) == 0
    rows = json.loads(out.read_text())
    for key in ("actors", "envs_per_actor", "env_latency_ms", "steps_per_s", "efficiency"):
        assert all(key in r for r in rows), key
    assert [r["actors"] for r in rows if r["mode"] == "in-process"] == [0]
    assert all(r["env_latency_ms"] == 1.0 and r["of_limit"] > 0 for r in rows)
    text = docs.read_text()
    begin, end = section_markers("sampling-latency-1ms")
    assert begin in text and end in text and "Machine:" in text and "dppo bench sampling" in text
    assert run_bench(argv) == 0  # a second run replaces its section instead of adding one
    assert docs.read_text().count(begin) == 1


def test_update_command(ray_address: str, tmp_path: Path) -> None:
    out = tmp_path / "update.json"
    argv = ["update", "--hidden-sizes", "8", "--actors", "2", *TINY, "--minibatch-size", "8",
            "--json", str(out), "--address", ray_address]
    assert run_bench(argv) == 0
    (row,) = json.loads(out.read_text())
    assert row["hidden_sizes"] == [8] and row["actors"] == 2 and row["batch"] == 32
    assert row["samples_per_s"] > 0 and row["broadcast_s"] > 0 and row["broadcast_fraction"] > 0
    assert row["minibatch_size"] == 8 and row["epochs"] >= 1
    assert row["device"] == "cpu"  # the default; --device cuda times the update on a GPU


def test_solve_command_runs_train_and_draws_the_figure(ray_address: str, tmp_path: Path) -> None:
    """Each env step sleeps 10 ms (env.latency_ms) and the 2 envs of the one actor step one after another: a round
    of 16 steps sleeps 0.32 s, a lower bound the timings in the row must respect."""
    out, docs = tmp_path / "solve.json", tmp_path / "benchmarks.md"
    argv = ["solve", "--actors", "1", "--repeats", "1", "--out-dir", str(tmp_path / "runs"),
            "--set", "run.total_steps=64", "--set", "env.num_envs=2", "--set", "ppo.segment_length=16",
            "--set", "ppo.minibatch_size=16", "--set", "env.latency_ms=10", "--json", str(out),
            "--write-docs", str(docs), "--address", ray_address]
    assert run_benchmark(argv) == 0
    returned_at = time.time()
    (row,) = json.loads(out.read_text())
    assert row["actors"] == 1 and row["repeats"] == 1 and row["solved"] == 0
    (run,) = row["runs"]
    assert run["env_steps"] == 64 and run["wall_s"] >= run["train_s"] and run["peak_rss_mib"] > 0
    phases = run["phases"]
    assert list(phases) == ["launch", "config", "ray_init", "learner", "actors_ready"]
    assert run["startup_s"] == pytest.approx(sum(phases.values()), abs=0.01)  # the phases make up the start-up
    assert min(phases["launch"], phases["ray_init"], phases["actors_ready"]) > 0  # the interpreter, Ray, an actor
    # the first round sleeps 2 x 16 x 10 ms; the second at least 0.30 s (each env may carry up to one latency of
    # overrun into it, LatencyWrapper's debt) and comes after the first
    assert run["first_iteration_s"] >= 0.32 and run["train_s"] >= run["first_iteration_s"] + 0.30
    # the exit: from summary.json's finish to the process's end, which was before run_benchmark returned
    finished_at = json.loads((Path(run["run_dir"]) / "summary.json").read_text())["finished_at"]
    assert 0 <= run["exit_s"] <= returned_at - finished_at + 0.01
    assert run["startup_s"] + run["train_s"] + run["exit_s"] <= run["wall_s"] + 0.5  # the parts fit the whole
    assert (tmp_path / "bench-solve-CartPole-v1.png").stat().st_size > 0
    assert "![Time to solve CartPole-v1, 1 actor](bench-solve-CartPole-v1.png)" in docs.read_text()
    assert "Start-up, phase by phase" in docs.read_text()
    assert "\npython -m benchmarks solve --actors 1 --repeats 1 " in docs.read_text()  # the command, as typed


def test_update_on_a_missing_gpu_is_a_usage_error(ray_address: str) -> None:
    import torch

    argv = ["update", "--hidden-sizes", "8", "--actors", "1", *TINY, "--minibatch-size", "8", "--iterations", "1",
            "--device", "cuda", "--address", ray_address]
    if torch.cuda.is_available():
        assert run_bench(argv) == 0
    else:
        with pytest.raises(UsageError, match=r"run\.device=cuda but the learner sees no CUDA device"):
            run_bench(argv)


def test_solve_with_the_reference_times_sb3_on_the_same_preset(ray_address: str, tmp_path: Path) -> None:
    """--reference: a first row of Stable-Baselines3's PPO in one process with the same preset and overrides,
    and every row's wall time over the reference's; SB3 leaves no log directory behind (its default logger makes
    one in the temp dir a run)."""
    out = tmp_path / "solve.json"
    sb3_dirs = set(Path(tempfile.gettempdir()).glob("SB3-*"))
    argv = ["solve", "--actors", "1", "--repeats", "1", "--out-dir", str(tmp_path / "runs"), "--reference",
            "--set", "run.total_steps=256", "--set", "env.num_envs=2", "--set", "ppo.segment_length=16",
            "--set", "ppo.minibatch_size=16", "--json", str(out), "--address", ray_address]
    assert run_benchmark(argv) == 0
    reference, ours = json.loads(out.read_text())
    # the preset's run.actors (2) x env.num_envs (2): the envs of `make demo`'s run
    assert reference["actors"] == "SB3 PPO, 1 process, 4 envs" and reference["vs_reference"] == 1.0
    (run,) = reference["runs"]
    assert run["env_steps"] == 256 and run["wall_s"] > run["train_s"] > 0 and not run["solved"]
    assert ours["actors"] == 1 and ours["runs"][0]["env_steps"] == 256
    assert ours["vs_reference"] == round(ours["wall_s"]["median"] / reference["wall_s"]["median"], 3)
    assert set(Path(tempfile.gettempdir()).glob("SB3-*")) == sb3_dirs


def test_update_uses_the_preset_minibatch(ray_address: str) -> None:
    (row,) = bench_update([[8]], actors=1, envs_per_actor=8, segment_length=64, iterations=1, address=ray_address)
    assert row["minibatch_size"] == load_config().ppo.minibatch_size


def test_bad_input_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(UsageError, match="--actors"):
        run_bench(["sampling", "--actors", "x"])
    with pytest.raises(UsageError, match="unknown gymnasium environment"):
        run_bench(["sampling", "--env", "NoSuchEnv-v0"])
    with pytest.raises(SystemExit):
        run_bench(["sampling", "--iterations", "0"])
    with pytest.raises(UsageError, match=r"--actors 5 do not fit on 2 workers of 2 CPUs"):
        run_bench(["node-loss", "--actors", "5"])
    with pytest.raises(SystemExit, match="2"):
        run_bench(["sampling", "--actor-gpus", "0.5", "--inference", "actor,server"])
    assert "--actor-gpus puts each actor's own policy on a GPU share, and --inference server" in capsys.readouterr().err


def test_the_gpu_share_actor_needs_a_gpu_and_says_so_in_one_line(ray_address: str,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """`--actor-gpus F` measures the actor whose policy runs on its GPU share: where none is, one line naming it,
    on this machine (its torch) or on the cluster (its nodes)."""
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="2"):
            run_bench(["sampling", "--actor-gpus", "0.5", "--actors", "1"])
        assert "--actor-gpus 0.5 puts each actor's policy on a GPU share, and this machine's torch sees no CUDA " \
               "device" in capsys.readouterr().err
    gpus = sum(node["Resources"].get("GPU", 0.0) for node in ray.nodes() if node["Alive"])
    with pytest.raises(UsageError, match=rf"--actor-gpus {gpus + 1:g}: run.actor_gpus={gpus + 1:g} asks Ray for a "
                                         r"GPU share per actor, and no node of the Ray cluster has"):
        run_bench(["sampling", "--actor-gpus", f"{gpus + 1:g}", "--actors", "1", *TINY, "--address", ray_address])


def test_round_command_breaks_the_round_down(ray_address: str, tmp_path: Path) -> None:
    out, docs = tmp_path / "round.json", tmp_path / "benchmarks.md"
    argv = ["round", "--segment-lengths", "1,16", "--envs-per-actor", "2", "--iterations", "3", "--json", str(out),
            "--write-docs", str(docs), "--address", ray_address]
    assert run_bench(argv) == 0
    short, long_ = json.loads(out.read_text())
    for row in (short, long_):
        # each holds round by round, so for the medians too: round = broadcast + submit + wait >= sample
        assert row["round_ms"] >= row["sample_ms"] > 0 and 0 < row["overhead_ms"] <= row["round_ms"]
        assert row["round_ms"] >= max(row["broadcast_ms"], row["submit_ms"]) > 0
        assert row["actor_call_ms"] > 0 and row["weight_load_ms"] > 0
        assert row["segment_buffers"] >= 1 and row["broadcast_buffers"] >= 1
    # a Segment of CartPole holds 4 float32 observations per step and env: 16 steps carry at least 16x2x16 bytes
    assert long_["segment_kib"] > short["segment_kib"] and long_["segment_kib"] * 1024 >= 16 * 2 * 16
    assert long_["sample_ms"] > short["sample_ms"]
    assert short["broadcast_kib"] == long_["broadcast_kib"]  # the same model
    assert "dppo bench round" in docs.read_text() and "round-CartPole-v1" in docs.read_text()
    with pytest.raises(UsageError, match="--segment-lengths"):
        run_bench(["round", "--segment-lengths", "0"])


def test_score_command_times_each_threshold_and_breaks_iterations_down(ray_address: str, tmp_path: Path) -> None:
    out, docs = tmp_path / "score.json", tmp_path / "benchmarks.md"
    argv = ["score", "--actors", "1,2", "--thresholds", "20,60,1000", "--total-steps", "12288", "--out-dir",
            str(tmp_path / "runs"), "--json", str(out), "--write-docs", str(docs), "--address", ray_address]
    assert run_bench(argv) == 0
    rows = json.loads(out.read_text())
    assert [r["actors"] for r in rows] == [1, 2]
    for row in rows:
        records = progress_records(Path(row["run_dir"]))
        first_20 = next(r for r in records if (r["episode_return_mean"] or 0) >= 20)
        assert row["to_20_s"] == first_20["wall_s"] and row["to_20_steps"] == first_20["env_steps"]
        assert row["to_1000_s"] is None  # CartPole cannot reach 1000
        assert 0 < row["of_sampling"] <= 1 and row["sampling_steps_per_s"] >= row["steps_per_s"]
        assert row["update_s"] > 0 and row["sample_s"] > 0
    text = docs.read_text()
    assert "dppo bench score" in text and "score-CartPole-v1" in text and (tmp_path / "bench-score-CartPole-v1.png"
                                                                             ).stat().st_size > 1000
    with pytest.raises(UsageError, match="--thresholds"):
        run_bench(["score", "--thresholds", "x"])
