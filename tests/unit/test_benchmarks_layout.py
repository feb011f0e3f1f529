"""The reproductions live in a clone's benchmarks/, the diagnostics in dppo.bench (issue 44): dppo never imports
benchmarks/, a wheel does not carry it, each entry lists its own commands, and a docs section shows the command as
it was typed at its entry."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

from benchmarks.__main__ import build_parser, parse
from dppo.bench.common import typed_argv
from dppo.cli_args import Parser
from dppo.commands.bench import register

REPO = Path(__file__).resolve().parents[2]
REPRODUCTIONS = {"solve", "learn", "learning-checks", "variants", "sweep", "envs", "selfplay", "peer"}


def commands(parser: argparse.ArgumentParser) -> set[str]:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return set(sub.choices)


def test_the_package_never_imports_benchmarks() -> None:
    for path in (REPO / "dppo").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [
                node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n == "benchmarks" or n.startswith("benchmarks.") for n in names), path


def test_a_wheel_carries_dppo_only() -> None:
    text = (REPO / "pyproject.toml").read_text()
    assert '[tool.setuptools.packages.find]\ninclude = ["dppo*"]\n' in text  # (tomllib: Python 3.11 on)


def test_each_entry_lists_its_own_commands() -> None:
    parser = Parser(prog="dppo")
    register(parser.add_subparsers(dest="command", required=True, parser_class=Parser))
    bench = parser._subparsers._group_actions[0].choices["bench"]
    assert commands(bench) >= {"sampling", "update", "round", "node-loss", "score", "driver"}  # and more diagnostics
    assert not commands(bench) & REPRODUCTIONS
    assert commands(build_parser()) == REPRODUCTIONS


def test_a_section_shows_the_command_as_typed_at_its_entry() -> None:
    args = parse(["learn", "--env", "CartPole-v1", "--json", "rows.json", "--write-docs"])
    assert typed_argv(args) == ["python", "-m", "benchmarks", "learn", "--env", "CartPole-v1", "--write-docs"]
