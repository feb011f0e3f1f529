"""A worker node lost mid-run, on a real multi-node Ray cluster (`ray start` nodes on this machine, token auth
on, a head with 0 CPUs as the chart builds it): the run keeps training on the actors that are left, its
replacements join when the node comes back, and a node that never returns does not stop the run. Driven by
`dppo bench node-loss`'s own functions, with a short run."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import require

from dppo.bench.node_loss import Scenario, measure, run_scenario
from dppo.bench.prometheus import prometheus_binary

pytestmark = pytest.mark.slow


def test_a_node_lost_for_a_while_costs_its_actors_rounds_only(tmp_path: Path) -> None:
    require(prometheus_binary() is not None, "prometheus not found; `apt-get install prometheus` (make tools does)")
    scenario = Scenario(total_steps=60_000, kill_after=5, down_s=12.0, timeout_s=300)
    timeline, summary, stderr = run_scenario(scenario, tmp_path)
    row = measure(scenario, timeline, summary)
    print(row, f"node starts: {timeline.node_starts}")
    assert row["finished"] == "total_steps"
    down = [r for t, r in timeline.records if timeline.killed_at < t <= (timeline.back_at or 0)]
    assert any(r["segments"] == 2 for r in down)  # training went on while the node was gone
    # every actor's segment again once it came back (its `ray start` tried again while it gave up, as a pod's is)
    assert row["full_count_after_return_s"] is not None, f"the node's starts: {timeline.node_starts}"
    assert row["env_steps_exact"] and row["iterations_contiguous"]
    # one node, its two actors; a replacement Ray placed on the node before it knew the node was gone is lost
    # with it too: none of it spends the crash-loop budget
    assert summary["node_losses"] == 1 and summary["actor_crashes"] == 0 and summary["actor_restarts"] >= 2
    assert stderr.count("lost with its node") == summary["actor_restarts"] and stderr.count(" back after ") == 2
    # the dashboard's degraded-state queries, on a real Prometheus scrape during the outage
    assert row["prometheus_actors_missing"] == 2 and row["prometheus_actors_pending"] == 2
    assert row["prometheus_actors_lost_with_node"] == 2 and row["prometheus_actor_crashes"] == 0


def test_a_node_that_never_returns_leaves_the_run_to_finish_on_the_survivors(tmp_path: Path) -> None:
    scenario = Scenario(total_steps=30_000, kill_after=5, down_s=None, timeout_s=300)
    timeline, summary, stderr = run_scenario(scenario, tmp_path)
    row = measure(scenario, timeline, summary)
    print(row)
    assert row["finished"] == "total_steps" and row["env_steps_exact"] and row["iterations_contiguous"]
    short = timeline.first_short_round(scenario.actors)
    after = [r for t, r in timeline.records if short is not None and t >= short]
    assert after and all(r["segments"] == 2 for r in after)  # the two actors left, every round from then on
    assert summary["node_losses"] == 1 and summary["actor_crashes"] == 0 and " back after " not in stderr
