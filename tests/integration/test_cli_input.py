"""Command-line input: step budgets in e-notation, `train --help`, and bad input: exit 2, one line naming the
problem and the fix, no traceback, nothing written."""

from __future__ import annotations

import argparse
import os
import subprocess
from pathlib import Path

import pytest
from conftest import new_checkpoint

from dppo.commands.parser import main
from dppo.config import load_config
from dppo.run.checkpoint import CheckpointStore


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A scratch cwd with the files the cases refer to."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "malformed.yaml").write_text("ppo: [1, 2\nrun: {")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    (tmp_path / "wrongtype.yaml").write_text("run:\n  actors: many\n")
    (tmp_path / "unknownkey.yaml").write_text("ppo:\n  lr: 0.1\n")
    (tmp_path / "a-file").write_text("not a directory")
    (tmp_path / "empty-run").mkdir()
    (tmp_path / "used-run").mkdir()
    (tmp_path / "used-run" / "progress.jsonl").write_text('{"iteration": 1}\n')
    (tmp_path / "garbage.pt").write_bytes(os.urandom(256))
    run = tmp_path / "cartpole-run"
    config = load_config(overrides={"run.run_dir": str(run)})
    (run).mkdir()
    (run / "config.yaml").write_text(config.to_yaml())
    path = CheckpointStore(run / "checkpoints", 3).save(new_checkpoint(config)[0], 1)
    (tmp_path / "truncated.pt").write_bytes(path.read_bytes()[:-100])
    return tmp_path


CASES = [
    (["train", "--actors", "0"], "run.actors"),
    (["train", "--envs-per-actor", "0"], "env.num_envs"),
    (["train", "--segment-length", "-5"], "ppo.segment_length"),
    (["train", "--actors", "abc"], "invalid int value"),
    (["train", "--total-steps", "1.5e3x"], "invalid int value"),
    (["train", "--total-steps", "2.5"], "'2.5' is not a whole number"),
    (["train", "--set", "run.total_steps=2.5e0"], "run.total_steps: Input should be a valid integer"),
    (["train", "--target-return", "high"], "invalid float value"),
    (["train", "--time-limit", "0"], "run.time_limit_s: Input should be greater than 0"),
    (["train", "--env", "NoSuchEnv-v0"], "unknown environment 'NoSuchEnv-v0'"),
    (["train", "--set", "ppo.minibatch_size=100000"], "exceeds the batch"),
    (["train", "--set", "ppo.nosuch=1"], "unknown key 'ppo.nosuch'"),
    (["train", "--set", "nosection.x=1"], "unknown key 'nosection.x'"),
    (["train", "--set", "ppo.learning_rate=abc"], "ppo.learning_rate"),
    (["train", "--set", "ppo.gamma=1.5"], "ppo.gamma"),
    (["train", "--set", "novalue"], "is not key=value"),
    (["train", "--set", "run.log_format=xml"], "run.log_format"),
    (["train", "--log-format", "xml"], "invalid choice"),
    (["train", "--metrics-port", "70000"], "metrics.port"),
    (["train", "--config", "missing.yaml"], "not found"),
    (["train", "--config", "malformed.yaml"], "not valid YAML"),
    (["train", "--config", "list.yaml"], "must hold a mapping"),
    (["train", "--config", "wrongtype.yaml"], "run.actors"),
    (["train", "--config", "unknownkey.yaml"], "unknown key 'ppo.lr' (did you mean ppo.learning_rate?)"),
    (["train", "--resume"], "--run-dir"),
    (["train", "--resume", "--run-dir", "empty-run"], "no intact checkpoint"),
    (["train", "--run-dir", "a-file"], "is a file"),
    (["train", "--run-dir", "a-file/run"], "'a-file' is a file"),
    (["train", "--set", "faults.min_actors=3"], "faults.min_actors 3 exceeds run.actors 2"),
    (["train", "--set", "run.torch_threads=2", "--set", "run.actor_threads=1"], "keep only run.actor_threads"),
    (["train", "--run-dir", "used-run"], "already holds a run"),
    (["train", "--run-dir", "cartpole-run"], "already holds a run"),  # a checkpoint, no progress line yet
    (["train", "--resume", "--run-dir", "cartpole-run", "--env", "Pendulum-v1"], "is for env 'CartPole-v1'"),
    (["train", "--resume", "--run-dir", "cartpole-run", "--set", "model.hidden_sizes=[8]"], "model settings"),
    (["eval", "--checkpoint", "missing.pt"], "not found"),
    (["eval", "--checkpoint", "garbage.pt"], "not a dppo checkpoint"),
    (["eval", "--checkpoint", "truncated.pt"], "truncated or corrupt"),
    (["eval", "--checkpoint", "empty-run"], "no intact checkpoint"),
    (["eval", "--checkpoint", "cartpole-run", "--episodes", "0"], "--episodes"),
    (["nosuchcommand"], "invalid choice"),
    # options only in full: argparse's abbreviations took --envs for --envs-per-actor (and trained with it)
    (["train", "--envs", "4", "--actors", "0"], "unrecognized arguments: --envs 4; did you mean --env or "
                                                "--envs-per-actor? (see dppo train --help)"),
    (["train", "--total", "1e3", "--actors", "0"], "did you mean --total-steps?"),
    (["eval", "--check", "cartpole-run", "--episodes", "0"], "did you mean --checkpoint? (see dppo eval --help)"),
    (["export", "--checkpoint", "cartpole-run", "-o", "policy.xyz"], "name the file .onnx (ONNX) or .pt"),
]


def test_step_budgets_in_e_notation_are_integers(tmp_path: Path) -> None:
    """`--total-steps 1e6` and `--set run.total_steps=2e6` (and 1e6 in a YAML file) mean those integers."""
    from dppo.commands.parser import build_parser

    args = build_parser().parse_args(["train", "--total-steps", "1e6", "--actors", "4.0"])
    assert (args.total_steps, args.actors) == (1_000_000, 4)
    assert load_config(sets=["run.total_steps=2e6"]).run.total_steps == 2_000_000
    path = tmp_path / "c.yaml"
    path.write_text("run:\n  total_steps: 3e5\nenv:\n  kwargs: {name: 1e3}\n")
    config = load_config(path)
    assert config.run.total_steps == 300_000 and isinstance(config.run.total_steps, int)
    assert config.env.kwargs == {"name": "1e3"}  # the env's own arguments pass through untouched


def test_no_parser_takes_an_option_abbreviated() -> None:
    """Every parser of the tree, subcommands' and `dppo bench`'s own included: an option only in full."""
    from dppo.commands.parser import build_parser

    parsers, seen = [build_parser()], 0
    while parsers:
        parser = parsers.pop()
        seen += 1
        assert parser.allow_abbrev is False, parser.prog
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                parsers.extend(action.choices.values())
    assert seen > 10  # dppo, its subcommands and the bench diagnostics


def snapshot(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")}


@pytest.mark.parametrize(("argv", "expected"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_input_exits_2_with_one_line(workdir: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                                         expected: str) -> None:
    before = snapshot(workdir)
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dppo: error: "), err
    assert expected in err
    assert "Traceback" not in err
    assert snapshot(workdir) == before, "bad input must not write anything"


def test_real_process_bad_input_has_no_traceback(dppo_cmd: list[str], tmp_path: Path) -> None:
    done = subprocess.run([*dppo_cmd, "train", "--set", "ppo.minibatch_size=999999"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "ppo.minibatch_size" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_every_config_typo_is_named_in_one_line_with_the_key_meant(dppo_cmd: list[str], tmp_path: Path) -> None:
    """Both typos of one command line, each with its suggestion: a user fixes them in one go."""
    done = subprocess.run([*dppo_cmd, "train", "--set", "ppo.lr=1e-3", "--set", "rn.actors=2"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert ("unknown keys 'ppo.lr' (did you mean ppo.learning_rate?) and 'rn.actors' (did you mean run.actors?)"
            in done.stderr), done.stderr
    assert list(tmp_path.iterdir()) == []


def test_help_lists_every_config_key(dppo_cmd: list[str]) -> None:
    done = subprocess.run([*dppo_cmd, "train", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    for key in ("env.num_envs", "ppo.clip_coef", "run.target_return", "metrics.linger_s", "faults.sample_timeout_s"):
        assert key in done.stdout


def test_a_metrics_port_in_use_is_bad_input_before_anything_is_written(workdir: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """The run claims its metrics port before Ray starts or the run dir exists: taken, it is one line, exit 2."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        before = snapshot(workdir)
        with pytest.raises(SystemExit) as exit_info:
            main(["train", "--metrics-port", str(port), "--set", "metrics.host=127.0.0.1", "--run-dir", "new-run"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"the metrics port {port} on 127.0.0.1 cannot be used" in err, err
    assert "something on this machine holds it" in err and "--metrics-port" in err
    assert snapshot(workdir) == before and not (workdir / "new-run").exists()
