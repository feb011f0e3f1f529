"""Every metric in a run's registry follows the naming rules and is documented in docs/metrics.md.

Rules (https://prometheus.io/docs/practices/naming/): ``dppo_`` prefix, snake case, base units
(seconds, bytes) named as a suffix, ``_total`` on counters and only on counters, ``_info`` gauges of
constant 1, low-cardinality labels from a fixed set.
"""

from __future__ import annotations

import re
import socket
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from dppo.errors import UsageError
from dppo.run.metrics import Metrics

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
NAME = re.compile(r"^dppo_[a-z][a-z0-9]*(_[a-z0-9]+)*$")
# learner: rank < 64; key: an entry of metrics.info_keys (the env's info keys the user named, a handful)
ALLOWED_LABELS = {"phase", "actor", "reason", "env", "run", "learner", "cause", "policy", "key"}
# Non-base units and spellings that hide the unit; Prometheus wants seconds and bytes.
FORBIDDEN_SUFFIXES = ("_ms", "_millis", "_milliseconds", "_microseconds", "_us", "_ns", "_minutes", "_hours",
                      "_days", "_s", "_secs", "_sec", "_kb", "_mb", "_gb", "_kilobytes", "_megabytes", "_percent")
RESERVED_SUFFIXES = ("_total", "_count", "_sum", "_bucket", "_created")


def wrappers() -> list[MetricWrapperBase]:
    metrics = Metrics("CartPole-v1", "test-run")
    found = [m for m in vars(metrics).values() if isinstance(m, MetricWrapperBase)]
    found += list(metrics.diagnostics.values()) + list(metrics.per_policy.values())
    return found


WRAPPERS = wrappers()
FAMILIES = {f.name: f for f in Metrics("CartPole-v1", "test-run").registry.collect()}


def exposed(name: str) -> str:
    """The name users query: counters carry _total."""
    return f"{name}_total" if FAMILIES[name].type == "counter" else name


def test_every_registered_metric_is_a_field_of_metrics() -> None:
    assert {w._name for w in WRAPPERS} == set(FAMILIES), "a metric is registered outside Metrics' fields"


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_names_follow_the_prometheus_naming_rules(name: str) -> None:
    family = FAMILIES[name]
    assert NAME.match(name), f"{name}: use dppo_ and snake case"
    assert not name.endswith(RESERVED_SUFFIXES), f"{name}: {RESERVED_SUFFIXES} are added by the exposition"
    base = name.removesuffix("_info")
    assert not base.endswith(FORBIDDEN_SUFFIXES), f"{name}: use base units (seconds, bytes) spelled out"
    assert family.documentation.strip(), f"{name}: needs a help text"
    help_text = family.documentation.lower()
    if re.search(r"\bseconds\b|unix time|duration", help_text):
        assert "_seconds" in name, f"{name}: a duration or timestamp is named ..._seconds"
    if re.search(r"\bsize\b|\bbytes\b", help_text):
        assert name.endswith("_bytes"), f"{name}: a size is named ..._bytes"
    if name.endswith("_info") and name != "dppo_env_info":  # the name for the env's figures (not constant)
        assert family.type == "gauge"
        assert all(s.value == 1 for s in family.samples)


def test_exposed_series_names_follow_the_type() -> None:
    """Counters expose only ..._total (and _created); gauges their own name; histograms the usual three."""
    metrics = Metrics("CartPole-v1", "x")
    metrics.record_actor(0, 1.0)
    metrics.actor_restarts.labels(actor="0").inc()
    metrics.segments_dropped.labels(reason="timeout").inc()
    metrics.env_failures.labels(actor="0").inc()
    metrics.phase_seconds.labels(phase="sample").observe(0.1)
    metrics.learner_update_seconds.labels(learner="0").observe(0.1)
    metrics.learner_allreduce_seconds.labels(learner="0").observe(0.0)
    metrics.record_iteration({"env_steps_delta": 1, "iteration_s": 1.0, "adversary/episode_return_mean": 1.0,
                              **{f"adversary/{key}": 0.5 for key in metrics.per_policy}, "info/success": 0.5}, [], {})
    suffixes = {"counter": {"_total", "_created"}, "gauge": {""},
                "histogram": {"_bucket", "_sum", "_count", "_created"}}
    for family in metrics.registry.collect():
        assert family.samples, f"{family.name} has no series"
        for sample in family.samples:
            suffix = sample.name.removeprefix(family.name)
            assert suffix in suffixes[family.type], f"{sample.name} in {family.type} {family.name}"


def test_labels_are_low_cardinality() -> None:
    for wrapper in WRAPPERS:
        labels = set(wrapper._labelnames)
        assert labels <= ALLOWED_LABELS, f"{wrapper._name}: labels {labels - ALLOWED_LABELS} are not allowed"


def test_phase_and_duration_histograms_are_in_seconds() -> None:
    from dppo.run.metrics import PHASE_BUCKETS, PHASES

    assert set(PHASES) >= {"sample", "wait", "update", "sync", "env", "inference"}  # env, inference: of sample
    assert min(PHASE_BUCKETS) > 0 and max(PHASE_BUCKETS) <= 3600, "bucket bounds are seconds"


def test_served_exposition_parses_and_holds_every_metric() -> None:
    metrics = Metrics("CartPole-v1", "served")
    port = metrics.serve(0, host="127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
    finally:
        metrics.shutdown()
    parsed = {f.name for f in text_string_to_metric_families(text)}
    assert set(FAMILIES) <= parsed
    assert 'dppo_run_info{env="CartPole-v1",run="served"} 1.0' in text


def documented() -> dict[str, str]:
    """name -> type from the table rows of docs/metrics.md (| `name` | type | ...)."""
    rows = re.findall(r"^\| `(dppo_[a-z0-9_]+)`(?:\{[^}]*\})? \| (\w+) \|", DOCS.read_text(), re.MULTILINE)
    return dict(rows)


def test_every_metric_is_documented_with_its_type() -> None:
    """A run's metrics and a sweep's (dppo.sweep.metrics: the same names with a trial label, and its own)."""
    from dppo.sweep.metrics import TrialMetrics

    docs = documented()
    sweep = TrialMetrics("test-sweep", "CartPole-v1").registry.collect()
    expected = {f"{f.name}_total" if f.type == "counter" else f.name: f.type for f in [*FAMILIES.values(), *sweep]}
    assert docs == expected, "docs/metrics.md's tables and the registries disagree"


def test_a_sweep_keeps_the_series_of_live_trials_only() -> None:
    """The trial label stays bounded: an ended trial's series go when the next trial starts; trials by state
    count the ending trial in its new state (Tune calls back before it sets the status)."""
    from types import SimpleNamespace

    from dppo.sweep.metrics import TrialMetrics

    metrics = TrialMetrics("bounded", "CartPole-v1")
    first, second = (SimpleNamespace(trial_id=f"t_0000{i}", status="RUNNING") for i in (0, 1))

    def trial_labels() -> set[str]:
        return {s.labels.get("trial") for f in metrics.registry.collect() for s in f.samples} - {None}

    metrics.on_trial_start(0, [first], first)
    metrics.on_trial_result(0, [first], first, {"iteration": 1, "episode_return_mean": 10.0, "env_steps_delta": 64,
                                                "info/success": 0.5, "info/cost": None})
    assert metrics.registry.get_sample_value("dppo_env_info", {"trial": "t_00000", "key": "success"}) == 0.5
    assert metrics.registry.get_sample_value("dppo_env_info", {"trial": "t_00000", "key": "cost"}) is None
    metrics.on_trial_complete(0, [first], first)
    assert trial_labels() == {"t_00000"}  # the final values stay until the next start
    assert metrics.registry.get_sample_value("dppo_sweep_trials", {"state": "TERMINATED"}) == 1
    assert metrics.registry.get_sample_value("dppo_sweep_trials", {"state": "RUNNING"}) == 0
    first.status = "TERMINATED"
    metrics.on_trial_start(0, [first, second], second)
    metrics.on_trial_result(0, [first, second], second, {"iteration": 1, "episode_return_mean": float("-inf"),
                                                         "env_steps_delta": 64})
    assert trial_labels() == {"t_00001"}
    assert metrics.registry.get_sample_value("dppo_iteration", {"trial": "t_00001"}) == 1
    assert metrics.registry.get_sample_value("dppo_episode_return_mean", {"trial": "t_00001"}) is None  # none yet
    assert metrics.registry.get_sample_value("dppo_env_steps_total", {"trial": "t_00001"}) == 64


def test_a_metrics_port_taken_after_its_check_is_the_same_one_line() -> None:
    """Taken between `check_port` and the server's bind (by a connection's local port, say): bad input in one
    line, not the HTTP server's traceback."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(UsageError, match=rf"^the metrics port {port} on 127.0.0.1 cannot be used \(something "
                                             r"on this machine holds it\); pass another --metrics-port"):
            Metrics("CartPole-v1", "test-run").serve(port, "127.0.0.1")
