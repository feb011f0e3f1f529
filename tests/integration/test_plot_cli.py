"""The real `dppo plot` CLI (subprocesses): bad input exits 2 with one line, and importing the command does not
import matplotlib (so `dppo --help` and the other commands stay fast)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_importing_the_module_does_not_import_matplotlib() -> None:
    code = "import sys, dppo.commands.plot; assert 'matplotlib' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_cli_exits_2_with_one_line_on_bad_input(tmp_path: Path, dppo_cmd: list[str]) -> None:
    result = subprocess.run([*dppo_cmd, "plot", str(tmp_path / "nope")], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "does not exist" in result.stderr
