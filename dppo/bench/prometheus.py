"""A throwaway Prometheus server on 127.0.0.1 scraping one target every second: how a benchmark (and the tests of
the dashboard) read the run's metrics the way Grafana would, through PromQL on a real scrape."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from dppo.distributed.ports import free_ports

SCRAPE_INTERVAL_S = 1
RATE_INTERVAL = f"{4 * SCRAPE_INTERVAL_S}s"  # what Grafana puts for $__rate_interval: 4 x the scrape interval


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


class Prometheus:
    """``binary`` scraping 127.0.0.1:``target_port`` every second, its data under ``workdir``."""

    def __init__(self, binary: str, workdir: Path, target_port: int) -> None:
        self.port = free_ports(1)[0]
        self.url = f"http://127.0.0.1:{self.port}"
        config = workdir / "prometheus.yml"
        config.write_text(
            f"global:\n  scrape_interval: {SCRAPE_INTERVAL_S}s\n  evaluation_interval: {SCRAPE_INTERVAL_S}s\n"
            f"scrape_configs:\n  - job_name: dppo\n    static_configs:\n"
            f"      - targets: ['127.0.0.1:{target_port}']\n"
        )
        self.log = (workdir / "prometheus.log").open("w")
        self.process = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.process.returncode}; see {self.log.name}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("prometheus did not become ready within 30 s")

    def api(self, path: str, **params: Any) -> Any:
        """A query API call's result; an error response raises, naming the query."""
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as response:
                body = json.load(response)
        except urllib.error.HTTPError as err:
            body = json.load(err)
        if body["status"] != "success":
            raise RuntimeError(f"prometheus refused {params}: {body.get('error')}")
        return body["data"]["result"]

    def query_at(self, expr: str, at: float) -> list[dict[str, Any]]:
        return self.api("query", query=expr, time=at)

    def query_range(self, expr: str, start: float, end: float) -> list[dict[str, Any]]:
        return self.api("query_range", query=expr, start=start, end=end, step=SCRAPE_INTERVAL_S)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        self.log.close()
