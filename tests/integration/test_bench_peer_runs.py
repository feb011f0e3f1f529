"""`python -m benchmarks peer` end to end: dppo and the real RLlib peer script, in a venv of its own with the packages
the command's hint tells a user to install (peer_python: layered on the project's venv, whose torch and Ray are the
pinned ones, so pip adds only RLlib's own; under the clone's .cache/, reused when it works, made before the suite's
other tests on its worker: tests/conftest.py SLOW_RESOURCES), both trained to the same tiny budget; the section, its
two rows and its figure written. The pipeline, not learning. Then bad input: one line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from runs import REPO, run_benchmark

from benchmarks.peer import VENV_COMMANDS

BUDGET = 4800  # agent steps: two iterations of examples/simple-spread.yaml on each side


@pytest.fixture(scope="session")
def peer_python() -> Path:
    """The RLlib peer's venv under the clone's .cache/ (git-ignored; `make clean` removes it), kept while it works. Its
    python. It is layered on the project's venv (a .pth file adds that venv's site-packages after its own), so pip
    installs only what RLlib adds: the peer's torch and Ray are the project's, the versions PEER_PACKAGES pins, and
    what RLlib pins differently (its gymnasium) is installed in the peer's own site-packages, which come first. A
    user's separate venv (VENV_HINT) installs a second torch and Ray: two minutes of CPU here, for the same code."""
    import sysconfig

    from benchmarks.peer import PEER_PACKAGES, PEER_SCRIPT, PEER_VENV

    venv = REPO / PEER_VENV
    python = venv / "bin" / "python"
    if python.exists() and subprocess.run([str(python), str(PEER_SCRIPT), "--check"], capture_output=True,
                                          timeout=300).returncode == 0:
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=120)
    own = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    project = sysconfig.get_paths()["purelib"]  # addsitedir, not a bare path: its own .pth files count too
    (Path(own) / "dppo-project-venv.pth").write_text(f"import site; site.addsitedir({project!r})\n")
    for group in PEER_PACKAGES:
        done = subprocess.run([str(python), "-m", "pip", "install", "-q", *group], capture_output=True, text=True,
                              timeout=900)
        assert done.returncode == 0, f"pip install {' '.join(group)}: {done.stderr[-2000:]}"
    return python


@pytest.mark.slow
def test_bench_peer_trains_both_sides_to_the_same_steps_and_writes_its_section(tmp_path: Path,
                                                                               peer_python: Path) -> None:
    docs = tmp_path / "docs" / "benchmarks.md"
    done = run_benchmark("peer", "--peer-python", str(peer_python), "--seeds", "1", "--total-steps", str(BUDGET),
                    "--patched-peer", "--out-dir", str(tmp_path / "runs"), "--json", str(tmp_path / "rows.json"),
                    "--write-docs", str(docs), cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert [row["system"] for row in rows] == ["dppo", "RLlib PPO", "RLlib PPO, time limit bootstrapped"]
    for row in rows:
        run, = row["runs"]
        assert run["agent_steps"] == BUDGET and row["agent_steps"] == BUDGET  # equal agent steps on both sides
        assert isinstance(run["return"], float) and run["return"] < 0  # simple_spread's returns are negative
        assert run["wall_s"] >= run["startup_s"] + run["train_s"] > 0
    text = docs.read_text()
    title = "Against a peer: mpe2.simple_spread_v3, dppo and RLlib's PPO"
    assert f"## {title}" in text and f"![{title}](bench-peer-rllib-simple-spread.png)" in text
    assert VENV_COMMANDS in text and f"ray {rows[1]['version'].split()[1]}" in text
    assert (tmp_path / "docs" / "bench-peer-rllib-simple-spread.png").read_bytes().startswith(b"\x89PNG")
    for name in ("peer-seed1.log", "peer-patched-seed1.log"):
        log = (tmp_path / "runs" / name).read_text()
        assert len(re.findall(r"^dppo-peer \{\"event\": \"iteration\"", log, re.M)) == BUDGET // 2400


def test_bad_input_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    docs = tmp_path / "benchmarks.md"
    cases = [
        (["--peer-python", str(tmp_path / "none" / "python")], "no such interpreter; create the peer's venv: "),
        (["--seeds", "1,x"], "--seeds '1,x' is not a comma-separated list"),
        (["--config", str(tmp_path / "missing.yaml")], "no such file"),
        (["--total-steps", "0"], "--total-steps 0: give a positive number"),
        (["--set-nothing"], "unrecognized arguments"),
    ]
    for argv, message in cases:
        done = run_benchmark("peer", *argv, "--write-docs", str(docs), cwd=REPO, timeout=120)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and message in done.stderr, (argv, done.stderr)
    cartpole = tmp_path / "cartpole.yaml"
    cartpole.write_text("env: {id: CartPole-v1}\n")
    done = run_benchmark("peer", "--config", str(cartpole), cwd=REPO, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "is not a PettingZoo env" in done.stderr
    assert not docs.exists() and not (tmp_path / "bench-peer-rllib-simple-spread.png").exists()
