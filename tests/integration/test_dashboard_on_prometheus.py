"""The dashboard against a real Prometheus: every panel query returns data for a scraped dppo run.

A private Prometheus (temp config and data dir, 127.0.0.1 only, 1 s scrapes) scrapes the learner's
exporter. Each panel query, with the dashboard variables substituted, must return at least one series
with a finite value over the run's time range: a panel that would stay empty in Grafana fails here.
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from runs import REPO, progress_records

from dppo.bench.prometheus import RATE_INTERVAL, SCRAPE_INTERVAL_S
from dppo.bench.prometheus import Prometheus as BenchPrometheus
from dppo.distributed.ports import free_ports
from dppo.run.metrics import Metrics

# What ships (tests/deploy/test_dashboard.py checks it equals the generator's output), so no SDK is needed here.
DASHBOARD = json.loads((REPO / "helm" / "dppo" / "dashboards" / "dppo.json").read_text())
SWEEP_PREFIX = "Sweep: "  # the sweep row's panel titles (helm/dashboard.py)
SELFPLAY_PREFIX = "Self-play: "  # the self-play row's (data for a two-player game only)
POLICIES_PREFIX = "Policies: "  # the policies row's (data for a run of several policies only)
ENV_INFO_PREFIX = "Env info: "  # the env-info row's (data for a run with metrics.info_keys only)


class Prometheus(BenchPrometheus):
    """The package's throwaway Prometheus, with the reads these tests make."""

    def run_variable(self) -> list[str]:
        """What Grafana's label_values(dppo_run_info, run) lists."""
        url = f"{self.url}/api/v1/label/run/values?" + urllib.parse.urlencode({"match[]": "dppo_run_info"})
        with urllib.request.urlopen(url, timeout=10) as response:
            return list(json.load(response)["data"])

    def last_values(self, expr: str) -> list[float]:
        """The newest value of each series of ``expr``, on the 1 s grid the panels' queries see."""
        result = self.api("query", query=f"last_over_time(({expr})[10m:{SCRAPE_INTERVAL_S}s])")
        return [float(r["value"][1]) for r in result]

    def last(self, expr: str) -> float:
        values = self.last_values(expr)
        assert len(values) == 1, f"{expr}: {values}"
        return values[0]

    def wait_for_scrapes(self, expr: str, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            result = self.api("query", query=f"count_over_time({expr}[1h])")
            if result and float(result[0]["value"][1]) >= count:
                return
            time.sleep(0.5)
        raise AssertionError(f"fewer than {count} scrapes of {expr} within {timeout_s} s")

    def wait_for_value(self, expr: str, value: float, timeout_s: float) -> None:
        """Poll until the newest scraped sample of ``expr`` is ``value``: the exporter's final state is in."""
        deadline = time.monotonic() + timeout_s
        seen = None
        while time.monotonic() < deadline:
            seen = self.last_values(expr)
            if seen == [value]:
                return
            time.sleep(0.2)
        raise AssertionError(f"{expr} was {seen}, not [{value}], {timeout_s} s after the last update")

    def scrapes_since(self, since: float) -> int:
        window = max(1, math.ceil(time.time() - since))
        result = self.api("query", query=f"count_over_time(dppo_iteration[{window}s])")
        return int(float(result[0]["value"][1])) if result else 0

ALL_ROWS = ("run", "selfplay", "policies", "envinfo")  # the rows a single run can fill (the sweep row: a sweep's)


def row_of(title: str) -> str:
    prefixes = {SWEEP_PREFIX: "sweep", SELFPLAY_PREFIX: "selfplay", POLICIES_PREFIX: "policies",
                ENV_INFO_PREFIX: "envinfo"}
    return next((row for prefix, row in prefixes.items() if title.startswith(prefix)), "run")


def panel_queries(run: str, sweep: bool = False, rows: tuple[str, ...] = ("run",)) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target of the panels of ``rows`` (run: a single run's; selfplay: a
    two-player game's; policies: a run of several policies'; ``sweep``: only the sweep row's), with the dashboard
    variables substituted as Grafana would."""
    rows = ("sweep",) if sweep else rows
    substituted = []
    for title, expr in [(p["title"], t["expr"]) for p in DASHBOARD["panels"] for t in p.get("targets", [])]:
        if row_of(title) not in rows:
            continue
        expr = expr.replace("$__rate_interval", RATE_INTERVAL).replace("$run", run)
        assert "$" not in expr, f"{title}: unsubstituted variable in {expr}"
        substituted.append((title, expr))
    return substituted


def assert_every_panel_has_data(prom: Prometheus, run: str, start: float, end: float, sweep: bool = False,
                                rows: tuple[str, ...] = ("run",)) -> None:
    empty = []
    for title, expr in panel_queries(run, sweep, rows):
        series = prom.query_range(expr, start, end)
        finite = [v for s in series for _, v in s["values"] if math.isfinite(float(v))]
        if not finite:
            empty.append(f"{title}: {expr}")
    assert not empty, "panels without data:\n" + "\n".join(empty)


@pytest.fixture
def exporter() -> Iterator[tuple[Metrics, int]]:
    metrics = Metrics("CartPole-v1", "synthetic-run")
    port = metrics.serve(0, host="127.0.0.1")
    yield metrics, port
    metrics.shutdown()


def test_every_panel_has_data_for_the_metrics_module(prometheus_bin: str, tmp_path: Path,
                                                     exporter: tuple[Metrics, int]) -> None:
    """Fast check of the queries against the real Metrics class, fed iterations like the learner's."""
    metrics, port = exporter
    prom = Prometheus(prometheus_bin, tmp_path, port)
    try:
        rng = random.Random(0)
        start = time.time()
        metrics.actors_desired.set(2)
        metrics.actors_alive.set(2)
        steps, iteration = 0, 0
        prom.wait_for_scrapes("dppo_run_info", 1, timeout_s=30)  # the first scrape can lag readiness
        feeding = time.time()
        # Iterations every 0.25 s until Prometheus has scraped 6 times while they changed (bounded).
        while iteration < 24 or prom.scrapes_since(feeding) < 6:
            assert iteration < 240, "Prometheus scraped fewer than 6 times in a minute"
            iteration += 1
            for actor in (0, 1):
                metrics.record_actor(actor, 0.1)
            returns = [rng.uniform(10, 500) for _ in range(rng.randint(1, 4))]
            phases = {"sample": 0.01, "wait": 0.1, "update": 0.05, "sync": 0.01, "checkpoint": 0.0}
            steps += 1024
            record = {"iteration": iteration, "env_steps": steps, "env_steps_delta": 1024, "iteration_s": 0.25,
                      "episode_return_mean": sum(returns) / len(returns), "episode_length_mean": 100.0,
                      "steps_per_s": 4096.0, "policy_loss": -0.01, "value_loss": 20.0, "entropy": 0.6,
                      "approx_kl": 0.01, "clip_fraction": 0.1, "explained_variance": 0.5,
                      "learning_rate": 2.5e-4, "grad_norm": 0.4, "policy_version": iteration,
                      "selfplay_win_rate": 0.5, "selfplay_draw_rate": 0.3, "selfplay_loss_rate": 0.2,
                      "selfplay_elo": 1000.0 + iteration, "selfplay_pool_size": 1 + iteration // 10,
                      "info/success": rng.uniform(0, 1),
                      **{f"{policy}/{key}": rng.uniform(0.01, 1) for policy in ("red", "blue")
                         for key in ("episode_return_mean", "episode_length_mean", "eval_return_mean", "policy_loss",
                                     "value_loss", "entropy", "approx_kl", "clip_fraction", "explained_variance",
                                     "learning_rate", "grad_norm")}}
            metrics.record_iteration(record, returns, phases)
            for rank in ("0", "1"):  # what the learner records per learner process
                metrics.learner_update_seconds.labels(learner=rank).observe(0.05)
                metrics.learner_allreduce_seconds.labels(learner=rank).observe(0.01)
            metrics.policy_lag.set(0)
            if iteration == 12:  # the labelled counters get their first child mid-run
                metrics.actor_restarts.labels(actor="1").inc()
                metrics.segments_dropped.labels(reason="timeout").inc()
            if iteration % 5 == 0:
                metrics.checkpoints.inc()
                metrics.checkpoint_bytes.set(50_000)
            time.sleep(0.25)
        prom.wait_for_value("dppo_env_steps_total", steps, timeout_s=30)  # the last iteration's values scraped
        assert_every_panel_has_data(prom, "synthetic-run", start, time.time(), rows=ALL_ROWS)
        assert_every_panel_has_data(prom, ".*", start, time.time(), rows=ALL_ROWS)  # the "All" value
        assert prom.last("dppo_env_steps_total") == steps
        assert prom.run_variable() == ["synthetic-run"]
        actor_restarts, learner_restarts = [expr for title, expr in panel_queries("synthetic-run")
                                             if title == "Actor restarts, learner restarts"]
        assert prom.last(actor_restarts) == 1 and prom.last(learner_restarts) == 0
        for title, expr in panel_queries("no-such-run", rows=ALL_ROWS):
            assert not prom.query_range(expr, start, time.time()), f"{title} ignores the run variable: {expr}"
    finally:
        prom.stop()


@pytest.fixture
def scraping(prometheus_bin: str, tmp_path: Path) -> Iterator[tuple[Prometheus, int]]:
    """A private Prometheus scraping a free local port, where a dppo process is to serve its metrics."""
    metrics_port = free_ports(1)[0]
    prom = Prometheus(prometheus_bin, tmp_path, metrics_port)
    try:
        yield prom, metrics_port
    finally:
        prom.stop()


@pytest.mark.slow
def test_every_panel_has_data_for_a_real_training_run(scraping: tuple[Prometheus, int], ray_address: str,
                                                       dppo_cmd: list[str], tmp_path: Path) -> None:
    """A short CartPole run scraped end to end; the final counter equals summary.json's env_steps."""
    prom, metrics_port = scraping
    run_dir = tmp_path / "e2e-run"
    start = time.time()
    train = subprocess.run(
        [*dppo_cmd, "train", "--env", "CartPole-v1", "--actors", "2", "--total-steps", "24576",
         "--seed", "1", "--run-dir", str(run_dir), "--metrics-port", str(metrics_port),
         "--address", ray_address, "--set", "metrics.host=127.0.0.1", "--set", "metrics.linger_s=4",
         "--set", "run.checkpoint_every=3", "--set", "env.num_envs=4", "--set", "ppo.segment_length=256",
         "--set", "ppo.minibatch_size=512",
         # 0.5 ms of sleep per env step stretches the ~12 iterations over several scrapes, using no CPU.
         "--set", "env.latency_ms=0.5"],
        capture_output=True, text=True, timeout=240,
    )
    assert train.returncode == 0, train.stderr[-3000:]
    end = time.time()
    summary = json.loads((run_dir / "summary.json").read_text())
    run = run_dir.name
    assert_every_panel_has_data(prom, run, start, end)
    assert prom.last("dppo_env_steps_total") == summary["env_steps"]
    assert prom.last("dppo_iteration") == summary["iterations"]
    assert prom.run_variable() == [run]


@pytest.mark.slow
def test_the_sweep_row_has_data_for_a_real_sweep(scraping: tuple[Prometheus, int], ray_address: str,
                                                  dppo_cmd: list[str], tmp_path: Path) -> None:
    """A two-trial `dppo sweep` scraped end to end: every sweep panel has data, by trial."""
    prom, metrics_port = scraping
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(yaml.safe_dump({
        "name": "dash-sweep", "base": {"env": "CartPole-v1"}, "trials": 2, "concurrent": 2, "driver_cpus": 0.25,
        "set": {"run.total_steps": 8192, "run.actors": 1, "run.actor_cpus": 0.5, "run.tensorboard": False,
                "env.latency_ms": 0.5},
        "space": {"ppo.learning_rate": "choice([0.0003, 0.001])"},
        "metrics": {"port": metrics_port, "host": "127.0.0.1", "linger_s": 4}}))
    start = time.time()
    sweep = subprocess.run([*dppo_cmd, "sweep", "--config", str(sweep_file), "--out-dir", str(tmp_path / "out"),
                            "--address", ray_address], capture_output=True, text=True, timeout=300)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    end = time.time()
    assert prom.run_variable() == ["dash-sweep"]
    assert_every_panel_has_data(prom, "dash-sweep", start, end, sweep=True)
    trials = {p.name for p in (tmp_path / "out" / "trials").iterdir()}
    returns = prom.query_range(panel_queries("dash-sweep", sweep=True)[0][1], start, end)
    assert {s["metric"]["trial"] for s in returns} == trials


def train_scraped(dppo_cmd: list[str], ray_address: str, metrics_port: int, run_dir: Path, *args: str
                  ) -> tuple[float, float]:
    """A `dppo train` serving its metrics where the scraping Prometheus looks (and 4 s after, for the last scrape),
    run to its end; when it started and ended."""
    start = time.time()
    train = subprocess.run(
        [*dppo_cmd, "train", *args, "--run-dir", str(run_dir), "--metrics-port", str(metrics_port), "--address",
         ray_address, "--no-tensorboard", "--set", "metrics.host=127.0.0.1", "--set", "metrics.linger_s=4"],
        capture_output=True, text=True, timeout=240,
    )
    assert train.returncode == 0, train.stderr[-3000:]
    return start, time.time()


@pytest.mark.slow
def test_the_selfplay_row_has_data_for_a_real_two_player_game(scraping: tuple[Prometheus, int], ray_address: str,
                                                              dppo_cmd: list[str], tmp_path: Path) -> None:
    """A short tic-tac-toe run by self-play scraped end to end: every self-play panel has data; the Elo scraped
    last is the one in progress.jsonl."""
    prom, metrics_port = scraping
    run_dir = tmp_path / "selfplay-run"
    start, end = train_scraped(dppo_cmd, ray_address, metrics_port, run_dir, "--env", "pettingzoo.classic.tictactoe_v3",
                               "--actors", "1", "--total-steps", "4096", "--envs-per-actor", "16", "--segment-length",
                               "32", "--seed", "1", "--set", "selfplay.snapshot_every=2")
    assert_every_panel_has_data(prom, run_dir.name, start, end, rows=("selfplay",))
    last = progress_records(run_dir)[-1]
    assert prom.last("dppo_selfplay_elo") == pytest.approx(last["selfplay_elo"])
    assert prom.last("dppo_selfplay_pool_size") == last["selfplay_pool_size"] == 4


@pytest.mark.slow
def test_the_policies_row_has_data_for_a_real_run_of_two_policies(scraping: tuple[Prometheus, int],
                                                                  ray_address: str, dppo_cmd: list[str],
                                                                  tmp_path: Path) -> None:
    """A short simple_adversary run with a policy per role scraped end to end: every panel of the policies row has
    data, one series per policy; the return scraped last is the one in progress.jsonl."""
    pytest.importorskip("mpe2")
    prom, metrics_port = scraping
    run_dir = tmp_path / "policies-run"
    start, end = train_scraped(
        dppo_cmd, ray_address, metrics_port, run_dir, "--env", "mpe2.simple_adversary_v3", "--actors", "1",
        "--total-steps", "6000", "--envs-per-actor", "6", "--segment-length", "25", "--seed", "1", "--set",
        "env.kwargs.max_cycles=25", "--set", "ppo.minibatch_size=50", "--set",
        "policies={adversary: [adversary_0], agent: ['agent_*']}", "--set", "run.eval_every=2", "--set",
        "run.eval_episodes=1", "--set", "env.latency_ms=0.5")
    assert_every_panel_has_data(prom, run_dir.name, start, end, rows=("policies",))
    returns = prom.query_range(panel_queries(run_dir.name, rows=("policies",))[0][1], start, end)
    assert {s["metric"]["policy"] for s in returns} == {"adversary", "agent"}
    last = progress_records(run_dir)[-1]
    assert prom.last('dppo_per_policy_episode_return_mean{policy="agent"}') == pytest.approx(
        last["agent/episode_return_mean"])
    assert prom.last("dppo_actor_segments_total") == last["iteration"]  # one actor: one delivery of both a round
