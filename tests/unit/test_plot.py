"""`dppo plot` in-process: two runs -> one PNG, one labelled curve per run on each of the two axes. The real CLI
and its import cost: tests/integration/test_plot_cli.py."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import yaml
from conftest import PNG_SIGNATURE, run_curves

from dppo.commands.plot import plot_runs, register
from dppo.errors import UsageError


def fake_run(root: Path, name: str, actors: int, iterations: int = 20) -> Path:
    """A run directory shaped like `dppo train`'s: faster wall clock with more actors."""
    run_dir = root / name
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"run": {"actors": actors}}))
    lines = []
    for i in range(1, iterations + 1):
        mean = None if i == 1 else min(500.0, 10.0 * i * i / 4)
        lines.append(json.dumps({"iteration": i, "env_steps": 1024 * actors * i, "wall_s": 1.5 * i,
                                 "episode_return_mean": mean}))
    (run_dir / "progress.jsonl").write_text("\n".join(lines) + "\n")
    (run_dir / "summary.json").write_text(json.dumps({"solved": True, "target_return": 475.0, "env": "CartPole-v1"}))
    return run_dir


def test_two_runs_give_two_labelled_curves_per_axes(tmp_path: Path) -> None:
    runs = [fake_run(tmp_path, "one", actors=1), fake_run(tmp_path, "two", actors=2)]
    output = tmp_path / "out" / "scaling.png"
    figure = plot_runs(runs, output)

    curves = run_curves(figure)
    assert len(curves) == 2
    for axes in curves:
        assert sorted(axes) == ["one (1 actor)", "two (2 actors)"]
    by_time, by_steps = curves
    assert by_time["one (1 actor)"][:2] == [3.0, 4.5], "the iteration without a return is skipped"
    assert by_steps["two (2 actors)"][-1] == 2 * 1024 * 20
    assert [ax.get_legend() is not None for ax in figure.axes] == [True, True]
    assert figure.get_suptitle() == "CartPole-v1"
    assert "wall-clock" in figure.axes[0].get_xlabel() and "env steps" in figure.axes[1].get_xlabel()

    data = output.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    assert 20_000 < len(data) < 2_000_000


def test_a_torn_last_line_is_ignored(tmp_path: Path) -> None:
    run = fake_run(tmp_path, "live", actors=1, iterations=5)
    with (run / "progress.jsonl").open("a") as f:
        f.write('{"iteration": 6, "env_st')
    figure = plot_runs([run], None)
    assert len(run_curves(figure)[0]["live (1 actor)"]) == 4


@pytest.mark.parametrize(("setup", "message"), [
    ("missing", "does not exist"),
    ("no_progress", "no progress.jsonl"),
    ("no_returns", "no iteration with a finished episode"),
    ("garbage", "not valid JSON"),
])
def test_bad_run_directories_are_usage_errors(tmp_path: Path, setup: str, message: str) -> None:
    run = tmp_path / "run"
    if setup != "missing":
        run.mkdir()
    if setup == "no_returns":
        (run / "progress.jsonl").write_text(json.dumps({"iteration": 1, "episode_return_mean": None}) + "\n")
    if setup == "garbage":
        (run / "progress.jsonl").write_text("not json\n{}\n")
    with pytest.raises(UsageError, match=message):
        plot_runs([run], tmp_path / "x.png")


def test_register_adds_the_plot_subcommand(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser(prog="dppo")
    register(parser.add_subparsers(dest="command", required=True))
    output = tmp_path / "p.png"
    args = parser.parse_args(["plot", str(fake_run(tmp_path, "a", 1)), str(fake_run(tmp_path, "b", 4)),
                              "-o", str(output)])
    assert args.func(args) == 0
    assert output.read_bytes().startswith(PNG_SIGNATURE)
