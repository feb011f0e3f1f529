"""The real `dppo status` CLI (a subprocess) against the loopback stand-in for the Kubernetes API server
(tests/unit/kube_api_standin.py): the command is wired in, prints the table, and bad input exits 2 with one line;
the kubernetes client is not imported at start-up."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import load_module, require
from runs import REPO

standin = load_module(REPO / "tests" / "unit" / "kube_api_standin.py")


@pytest.fixture
def api_server() -> Iterator[standin.StandIn]:
    with standin.serving() as server:
        yield server


def test_real_cli_prints_the_table_and_exits_2_on_an_api_error(api_server: standin.StandIn, tmp_path: Path) -> None:
    """The real CLI: `dppo status` is wired in, and bad input exits 2 with one line."""
    kubeconfig = standin.write_kubeconfig(api_server, tmp_path / "kubeconfig")
    help_out = subprocess.run([sys.executable, "-m", "dppo", "--help"], capture_output=True, text=True, timeout=60,
                              check=False)
    require("status" in help_out.stdout, "dppo.commands.parser does not register the status command yet")
    out = subprocess.run([sys.executable, "-m", "dppo", "status", "--kubeconfig", str(kubeconfig)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert "big-dppo" in out.stdout and "123,456" in out.stdout
    api_server.rayjobs_status = 404
    out = subprocess.run([sys.executable, "-m", "dppo", "status", "--kubeconfig", str(kubeconfig)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and "KubeRay" in out.stderr


def test_no_kubernetes_import_at_startup() -> None:
    code = "import sys, dppo.commands.status; print('kubernetes' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"
