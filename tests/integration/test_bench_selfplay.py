"""`python -m benchmarks selfplay` end to end: a tiny tic-tac-toe run by self-play, its games against random and
minimax players counted per seat, the section and the Elo figure written. The pipeline, not learning."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from runs import run_benchmark

CONFIG = {"env": {"id": "pettingzoo.classic.tictactoe_v3", "num_envs": 8},
          "ppo": {"segment_length": 16, "num_minibatches": 2}, "selfplay": {"snapshot_every": 2},
          "run": {"actors": 1, "total_steps": 512}}


@pytest.mark.slow
def test_bench_selfplay_writes_its_section_and_figure(tmp_path: Path) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    docs = tmp_path / "docs" / "benchmarks.md"
    done = run_benchmark("selfplay", "--config", str(config), "--games", "4", "--out-dir", str(tmp_path / "runs"),
                         "--write-docs", str(docs), timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    text = docs.read_text()
    assert "## Self-play: tiny" in text and "![Self-play: tiny](figures/selfplay-tiny.png)" in text
    assert (tmp_path / "docs" / "figures" / "selfplay-tiny.png").stat().st_size > 0
    row = next(line for line in text.splitlines() if line.startswith("| 1 |"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[1] == "last" and cells[2] == "512"  # weights, env steps
    for seat in cells[6:8] + cells[10:12]:  # random and minimax, as the first and the second player: 2 games each
        assert sum(int(n) for n in seat.split("/")) == 2
    assert int(cells[13]) >= 1  # an untrained policy loses to minimax
    # and so it can be beaten, searched over every line: as the seat whose games it lost at least
    worst = dict(zip(("first", "second"), cells[14].split("/"), strict=True))
    assert set(worst.values()) <= {"win", "draw", "loss"}
    assert all(worst[seat] == "loss" for seat, cell in zip(worst, cells[10:12], strict=True) if int(cell.split("/")[2]))


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    done = run_benchmark("selfplay", "--config", str(config), "--opponents", "random,oracle", timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--opponents 'random,oracle'" in done.stderr
    config.write_text(yaml.safe_dump({**CONFIG, "ppo": {"minibatch_size": 4096}}))  # the run refuses it
    done = run_benchmark("selfplay", "--config", str(config), "--out-dir", str(tmp_path / "runs"), timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "ppo.minibatch_size 4096 exceeds" in done.stderr
