"""The docs say what the code and the benchmark tables say: where `dppo train`'s framing lines go (the stream
dppo.run.logs.run_line writes them to), the MiniGrid example's figures (read off the learning-checks table of
docs/benchmarks.md, their one source), and the length of the test a "N-minute form" names (its `--minutes`)."""

from __future__ import annotations

import re

import pytest
from runs import REPO

from dppo.run.logs import run_line

DOCS = REPO / "docs"


def sentence_with(text: str, words: str) -> str:
    """The sentence of ``text`` (joined across line breaks) that holds ``words``."""
    flat = " ".join(text.split())
    found = [s for s in re.split(r"(?<=[.:;])\s+(?=[A-Z(`])", flat) if words in s]
    assert found, f"no sentence with {words!r}"
    return found[0]


def test_training_md_says_the_framing_lines_go_where_run_line_writes_them(capsys: pytest.CaptureFixture[str]
                                                                           ) -> None:
    run_line("training CartPole-v1 ...", "text")
    run_line("stopped (total_steps) ...", "json")
    out, err = capsys.readouterr()
    assert out.startswith("training") and err.startswith("stopped")  # stdout; stderr beside JSON records
    text = (DOCS / "training.md").read_text()
    said = sentence_with(text, "One line per iteration goes to stdout")
    assert "the first" in said and "the last (how it ended)" in said, said
    assert "stderr" not in said.split("with `--log-format json`")[0], said
    assert "--log-format json` those three go to stderr" in " ".join(text.split())


def learning_check(name: str) -> dict[str, str]:
    """A row of the learning-checks table of docs/benchmarks.md, by its check's name."""
    text = (DOCS / "benchmarks.md").read_text()
    header = next(line for line in text.splitlines() if line.startswith("| check | measure | value |"))
    row = next(line for line in text.splitlines() if line.startswith(f"| {name} |"))
    names = [c.strip() for c in header.strip("|").split("|")]
    return dict(zip(names, (c.strip() for c in row.strip("|").split("|")), strict=True))


def test_the_minigrid_figures_are_the_learning_checks_reading() -> None:
    row = learning_check("minigrid-example")
    steps, value, wall = row["env_steps"], row["value"], row["wall_s"]
    environments = sentence_with((DOCS / "environments.md").read_text(), "`examples/minigrid.yaml` solves")
    results = next(line for line in (DOCS / "results.md").read_text().splitlines() if line.startswith("| MiniGrid"))
    for said in (environments, results):
        assert steps in said and value in said and wall in said, said
        assert "python -m benchmarks learning-checks" in said  # the command the figure came from
        assert not re.search(r"\b\d+k env steps", said), said


def test_an_n_minute_form_of_a_test_runs_n_minutes() -> None:
    named = [(0.5 if m[1] == "half" else int(m[1]), m[2]) for path in [*DOCS.glob("*.md"), REPO / "README.md"]
             for m in re.finditer(r"\b(?:the|a) (\d+|half)-minute form \((tests/[\w/]+\.py)\)", path.read_text(), re.I)]
    assert named, "no N-minute form named"
    for minutes, test in named:
        given = re.findall(r'"--minutes", "([\d.]+)"', (REPO / test).read_text())
        assert given and all(float(g) == minutes for g in given), (test, minutes, given)
