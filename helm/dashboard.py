"""The Grafana dashboard for dppo's Prometheus metrics, generated as code with Grafana's own SDK.

The JSON that ships is the committed file ``helm/dppo/dashboards/dppo.json`` (the chart reads it with
``.Files.Get``); this module is how it is made, and a test checks the two agree. Regenerate after a
change with ``python helm/dashboard.py`` (``--check`` only compares), then ``make manifests``.

Built with grafana-foundation-sdk (Grafana's typed builders, pinned in the ``dev`` extras): its models are
generated from Grafana's own schema, so the file is the schema Grafana 11.6+ reads (schemaVersion 41)
without a migration on load; grafanalib was rejected for writing schemaVersion 12 and the legacy heatmap.
The SDK is needed to regenerate only, never at run time.

Every query selects one run through the ``run`` variable by joining on ``dppo_run_info``, whose
``run`` label carries the run's name; ``job`` and ``instance`` come from the scrape, so the join works
with any scrape config (static target, PodMonitor, ServiceMonitor).
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard, heatmap, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models.heatmap import HeatmapColorMode, HeatmapColorScale
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

# The SDK release the committed file is generated with; pyproject.toml's `dev` extras pin the same (a test checks).
# Its builds carry an epoch per Grafana version, so a bare `pip install grafana-foundation-sdk` gets the oldest
# schema (10.1) rather than this one.
SDK_VERSION = "1769699379!11.6.0"
UID = "dppo-training"
TITLE = "dppo: distributed PPO training"
DASHBOARD_PATH = Path(__file__).resolve().parent / "dppo" / "dashboards" / "dppo.json"

DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
RUN_SELECTOR = 'dppo_run_info{run=~"$run"}'
RUN_VARIABLE_QUERY = "label_values(dppo_run_info, run)"
RATE = "$__rate_interval"
SWEEP_ROW = "Sweep"
SWEEP_PREFIX = "Sweep: "  # the sweep row's panel titles (they have data for a `dppo sweep` only)
SELFPLAY_ROW = "Self-play"
SELFPLAY_PREFIX = "Self-play: "  # the self-play row's panel titles (data for a two-player game only)
POLICIES_ROW = "Policies"
ENV_INFO_ROW = "Env info"
ENV_INFO_PREFIX = "Env info: "  # the env-info row's panel titles (data for a run with metrics.info_keys only)
POLICIES_PREFIX = "Policies: "  # the policies row's panel titles (data for a run of several policies only)

Panel = timeseries.Panel | stat.Panel | heatmap.Panel
Query = prometheus.Dataquery


def by_run(expr: str) -> str:
    """Keep only the series of the selected runs and give them the ``run`` label."""
    return f"({expr}) * on(job, instance) group_left(run) {RUN_SELECTOR}"


def zero_per_run() -> str:
    """A 0 per selected run: the fallback for labelled counters that have no child yet."""
    return f"sum by (run) (0 * {RUN_SELECTOR})"


def target(expr: str, legend: str, ref: str = "A", fmt: PromQueryFormat = PromQueryFormat.TIME_SERIES) -> Query:
    return (prometheus.Dataquery().datasource(DATASOURCE).expr(expr).legend_format(legend).ref_id(ref)
            .format(fmt).range())


def targets(*pairs: tuple[str, str]) -> list[Query]:
    """One target per (expr, legend), refIds A, B, ..."""
    return [target(expr, legend, ref=chr(ord("A") + i)) for i, (expr, legend) in enumerate(pairs)]


def timeseries_panel(title: str, description: str, queries: list[Query], unit: str = "short",
                     axis_label: str = "", minimum: float | None = None, decimals: int | None = None) -> Panel:
    panel = (timeseries.Panel().title(title).description(description).datasource(DATASOURCE).targets(queries)
             .unit(unit).axis_label(axis_label).line_width(2).fill_opacity(10)
             .show_points(common.VisibilityMode.NEVER).span_nulls(True)
             .legend(common_builders.VizLegendOptions().display_mode(common.LegendDisplayMode.LIST)
                     .placement(common.LegendPlacement.BOTTOM).show_legend(True))
             .tooltip(common_builders.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI)
                      .sort(common.SortOrder.DESCENDING)))
    if minimum is not None:
        panel.min(minimum)
    if decimals is not None:
        panel.decimals(decimals)
    return panel


def stat_panel(title: str, description: str, expr: str, unit: str = "short", decimals: int | None = None,
               alarm_at: float | None = None) -> Panel:
    """A single value; with ``alarm_at`` it turns red from that value up (green below)."""
    steps = ([model.Threshold(color="green"), model.Threshold(color="red", value=alarm_at)] if alarm_at is not None
             else [model.Threshold(color="blue")])
    panel = (stat.Panel().title(title).description(description).datasource(DATASOURCE)
             .with_target(target(expr, "{{run}}")).unit(unit)
             .color_scheme(dashboard.FieldColor().mode(model.FieldColorModeId.THRESHOLDS))
             .thresholds(dashboard.ThresholdsConfig().mode(model.ThresholdsMode.ABSOLUTE).steps(steps))
             .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False))
             .color_mode(common.BigValueColorMode.VALUE).graph_mode(common.BigValueGraphMode.AREA)
             .text_mode(common.BigValueTextMode.AUTO).justify_mode(common.BigValueJustifyMode.AUTO)
             .orientation(common.VizOrientation.AUTO))
    if decimals is not None:
        panel.decimals(decimals)
    return panel


def heatmap_panel(title: str, description: str, expr: str, unit: str = "short") -> Panel:
    return (heatmap.Panel().title(title).description(description).datasource(DATASOURCE)
            .with_target(target(expr, "{{le}}", fmt=PromQueryFormat.HEATMAP)).max_data_points(100)
            .hide_from(common_builders.HideSeriesConfig().legend(False).tooltip(False).viz(False))
            .calculate(False).cell_gap(1)
            .color(heatmap.HeatmapColorOptions().mode(HeatmapColorMode.SCHEME).scheme("Oranges")
                   .scale(HeatmapColorScale.EXPONENTIAL).exponent(0.5).steps(64))
            .y_axis(heatmap.YAxisConfig().axis_placement(common.AxisPlacement.LEFT).unit(unit))
            .rows_frame(heatmap.RowsHeatmapOptions().layout(common.HeatmapCellLayout.AUTO))
            .mode(common.TooltipDisplayMode.SINGLE).hide_y_histogram().show_legend()
            .cell_values(heatmap.CellValues().unit("short"))
            .filter_values(heatmap.FilterValueRange().le(1e-9)))


def mean_of(histogram: str) -> str:
    """Mean observation of a histogram over the rate window: rate(sum) / rate(count)."""
    return f"rate({histogram}_sum[{RATE}]) / rate({histogram}_count[{RATE}])"


def quantile(q: float, histogram: str, by: str) -> str:
    joined = by_run(f"rate({histogram}_bucket[{RATE}])")
    return f"histogram_quantile({q}, sum by ({by}, le) ({joined}))"


def sections() -> list[tuple[str, list[tuple[int, int, Panel]]]]:
    """Rows of (width, height, panel); the SDK lays the panels out from their widths (each row's sum to 24)."""
    overview = [
        (4, 4, stat_panel("Env steps", "Env steps collected by all actors (dppo_env_steps_total).",
                          by_run("dppo_env_steps_total"), decimals=0)),
        (4, 4, stat_panel("Iteration", "Iterations completed (dppo_iteration).", by_run("dppo_iteration"), decimals=0)),
        (4, 4, stat_panel("Episode return", "Mean return of the last 100 finished episodes.",
                          by_run("dppo_episode_return_mean"), decimals=1)),
        (4, 4, stat_panel("Env steps / s", "Env steps per second over the last iteration.",
                          by_run("dppo_env_steps_per_second"), unit="suffix:steps/s", decimals=0)),
        (4, 4, stat_panel("Actors alive", "Actors currently alive.", by_run("dppo_actors_alive"), decimals=0)),
        (4, 4, stat_panel("Run time", "Seconds since the run started.", by_run("time() - dppo_start_time_seconds"),
                          unit="s")),
    ]
    learning = [
        (12, 8, timeseries_panel(
            "Episode return (100-episode mean)", "dppo_episode_return_mean: what the target_return stop uses.",
            [target(by_run("dppo_episode_return_mean"), "{{run}}")], axis_label="return")),
        (12, 8, timeseries_panel(
            "Evaluation return", "dppo_eval_return_mean: the mean return of the last evaluation of the weights "
            "(run.eval_every; greedy unless run.eval_mode: sampled), beside the training episodes' mean.",
            targets((by_run("dppo_eval_return_mean"), "{{run}} evaluation"),
                    (by_run("dppo_episode_return_mean"), "{{run}} training")), axis_label="return")),
        (12, 8, timeseries_panel(
            "Episode return quantiles", "p10 / p50 / p90 of the returns of episodes finished in the window, "
            "interpolated from the dppo_episode_return histogram's buckets.",
            targets(*[(quantile(q, "dppo_episode_return", "run"), f"{{{{run}}}} p{round(q * 100)}")
                      for q in (0.1, 0.5, 0.9)]), axis_label="return")),
        (12, 8, heatmap_panel(
            "Episode return distribution", "Episodes finished per return bucket (dppo_episode_return histogram), "
            "all selected runs together.",
            f"sum by (le) ({by_run(f'increase(dppo_episode_return_bucket[{RATE}])')})")),
        (12, 8, timeseries_panel(
            "Episode length (100-episode mean)", "dppo_episode_length_steps.",
            [target(by_run("dppo_episode_length_steps"), "{{run}}")], axis_label="steps", minimum=0)),
    ]
    throughput = [
        (8, 8, timeseries_panel(
            "Env steps per second", "Rate of dppo_env_steps_total over the window, and the driver's own "
            "figure for the last iteration (dppo_env_steps_per_second).",
            targets((by_run(f"rate(dppo_env_steps_total[{RATE}])"), "{{run}} (rate)"),
                    (by_run("dppo_env_steps_per_second"), "{{run}} (last iteration)")),
            unit="suffix:steps/s", minimum=0)),
        (8, 8, timeseries_panel(
            "Episodes per second", "Rate of dppo_episodes_total: episodes finished in all actors.",
            [target(by_run(f"rate(dppo_episodes_total[{RATE}])"), "{{run}}")],
            unit="suffix:episodes/s", minimum=0)),
        (8, 8, timeseries_panel(
            "Segments per second by actor", "Rate of dppo_actor_segments_total: a slow or stuck actor "
            "stands out here.",
            [target(by_run(f"rate(dppo_actor_segments_total[{RATE}])"), "{{run}} actor {{actor}}")],
            unit="suffix:segments/s", minimum=0)),
    ]
    phases = [
        (12, 8, timeseries_panel(
            "Iteration phase duration (mean)", "Mean seconds per iteration spent in each phase: sync (weights "
            "into the object store), sample (slowest actor's sampling), wait (rest of the gather), update (GAE "
            "and SGD), checkpoint (only when one is written); and, parts of sample, env (stepping the envs) and "
            "inference (the policy's forward pass in the actor, or the wait for the inference service).",
            [target(by_run(mean_of("dppo_iteration_phase_seconds")), "{{run}} {{phase}}")], unit="s", minimum=0)),
        (12, 8, timeseries_panel(
            "Iteration duration", "Mean and p90 wall seconds per iteration (dppo_iteration_seconds).",
            targets((by_run(mean_of("dppo_iteration_seconds")), "{{run}} mean"),
                    (quantile(0.9, "dppo_iteration_seconds", "run"), "{{run}} p90")),
            unit="s", minimum=0)),
        (12, 8, timeseries_panel(
            "Learner update and all-reduce", "Mean seconds of each learner's update "
            "(dppo_learner_update_seconds) and of the part spent in all-reduce, peers' wait included "
            "(dppo_learner_allreduce_seconds; run.learners > 1).",
            targets((by_run(mean_of("dppo_learner_update_seconds")), "{{run}} learner {{learner}} update"),
                    (by_run(mean_of("dppo_learner_allreduce_seconds")), "{{run}} learner {{learner}} all-reduce")),
            unit="s", minimum=0)),
        (12, 8, timeseries_panel(
            "Actor sampling time share", "Fraction of wall time each actor spends sampling "
            "(rate of dppo_actor_sample_seconds_total); near 1 means the actors are the bottleneck.",
            [target(by_run(f"rate(dppo_actor_sample_seconds_total[{RATE}])"), "{{run}} actor {{actor}}")],
            unit="percentunit", minimum=0)),
        (12, 8, timeseries_panel(
            "Policy version and lag", "dppo_policy_version (weights broadcast) and dppo_policy_lag (versions "
            "between the weights a segment was sampled with and the ones trained).",
            targets((by_run("dppo_policy_version"), "{{run}} version"),
                    (by_run("dppo_policy_lag"), "{{run}} lag")), decimals=0, minimum=0)),
    ]
    ppo = [
        (8, 8, timeseries_panel("Policy loss", "Clipped-surrogate policy loss (dppo_policy_loss).",
                                [target(by_run("dppo_policy_loss"), "{{run}}")])),
        (8, 8, timeseries_panel("Value loss", "Value-function loss (dppo_value_loss).",
                                [target(by_run("dppo_value_loss"), "{{run}}")], minimum=0)),
        (8, 8, timeseries_panel("Entropy", "Mean policy entropy in nats (dppo_entropy); falls as the policy "
                                "becomes deterministic.",
                                [target(by_run("dppo_entropy"), "{{run}}")], axis_label="nats")),
        (8, 8, timeseries_panel("Approx KL", "Approximate KL old -> new policy per update (dppo_approx_kl); "
                                "spikes mean too large steps.",
                                [target(by_run("dppo_approx_kl"), "{{run}}")], minimum=0)),
        (8, 8, timeseries_panel("Clip fraction", "Fraction of samples whose ratio was clipped (dppo_clip_fraction).",
                                [target(by_run("dppo_clip_fraction"), "{{run}}")], unit="percentunit", minimum=0)),
        (8, 8, timeseries_panel("Explained variance", "1 - Var(returns - values) / Var(returns) "
                                "(dppo_explained_variance); near 1 is a good critic.",
                                [target(by_run("dppo_explained_variance"), "{{run}}")])),
        (12, 8, timeseries_panel("Learning rate", "Adam learning rate of the last update (dppo_learning_rate).",
                                 [target(by_run("dppo_learning_rate"), "{{run}}")], unit="sci", minimum=0)),
        (12, 8, timeseries_panel("Gradient norm", "Global gradient norm before clipping (dppo_grad_norm).",
                                 [target(by_run("dppo_grad_norm"), "{{run}}")], minimum=0)),
    ]
    restarts = by_run("dppo_actor_restarts_total")
    dropped = by_run("dppo_segments_dropped_total")
    health = [
        (4, 8, stat_panel(
            "Actors missing", "Degraded when above 0: actors the run asks for that are not alive "
            "(dppo_actors_desired - dppo_actors_alive). Rounds go on with the actors alive; the missing ones are "
            "pending replacements (lost with a node or crashed) waiting for the cluster to place them.",
            by_run("dppo_actors_desired - dppo_actors_alive"), decimals=0, alarm_at=1)),
        (8, 8, timeseries_panel(
            "Actors alive, pending, desired", "dppo_actors_alive against dppo_actors_desired, and the "
            "replacements waiting to be placed and started (dppo_actors_pending).",
            targets((by_run("dppo_actors_alive"), "{{run}} alive"),
                    (by_run("dppo_actors_pending"), "{{run}} pending"),
                    (by_run("dppo_actors_desired"), "{{run}} desired")), decimals=0, minimum=0)),
        (6, 8, timeseries_panel(
            "Actor losses by cause", "Actors lost with their node (preempted, drained, gone) and actor processes "
            "that crashed on a live node (only these spend faults.max_actor_restarts), total per run "
            "(dppo_actor_losses_total).",
            [target(f"sum by (run, cause) ({by_run('dppo_actor_losses_total')})", "{{run}} {{cause}}")],
            decimals=0, minimum=0)),
        (6, 8, timeseries_panel(
            "Actor restarts, learner restarts", "Actors replaced after a loss and learner groups restarted after "
            "a learner died, total per run (dppo_actor_restarts_total, dppo_learner_restarts_total; 0 until the "
            "first restart).",
            targets((f"sum by (run) ({restarts}) or on(run) {zero_per_run()}", "{{run}} actors"),
                    (f"sum by (run) ({by_run('dppo_learner_restarts_total')}) or on(run) {zero_per_run()}",
                     "{{run}} learners")), decimals=0, minimum=0)),
        (6, 8, timeseries_panel(
            "Checkpoints written", "Checkpoints written (dppo_checkpoints_written_total).",
            [target(by_run("dppo_checkpoints_written_total"), "{{run}}")], decimals=0, minimum=0)),
        (6, 8, timeseries_panel(
            "Checkpoint size", "Size of the last checkpoint (dppo_checkpoint_size_bytes).",
            [target(by_run("dppo_checkpoint_size_bytes"), "{{run}}")], unit="bytes", minimum=0)),
        (6, 8, timeseries_panel(
            "Dropped segments and skipped updates", "Segments not trained on (dppo_segments_dropped_total, "
            "by reason) and updates skipped for NaN/Inf (dppo_updates_skipped_total).",
            targets((f"sum by (run, reason) ({dropped}) or on(run) {zero_per_run()}", "{{run}} dropped {{reason}}"),
                    (by_run("dppo_updates_skipped_total"), "{{run}} updates skipped")),
            decimals=0, minimum=0)),
        (6, 8, timeseries_panel(
            "Env failures", "Env copies that raised and were recreated alone, their episode cut there and never "
            "counted as a return, total per run (dppo_env_failures_total; 0 until the first). A flaky simulator "
            "shows here while the run looks healthy; past faults.max_env_failure_share of episodes the run stops.",
            [target(f"sum by (run) ({by_run('dppo_env_failures_total')}) or on(run) {zero_per_run()}", "{{run}}")],
            decimals=0, minimum=0)),
        (6, 8, timeseries_panel(
            "Hung processes", "Processes that missed their deadline (faults.hang_timeout_s, else max(60 s, 10x the "
            "median of that call)) and were killed and replaced: sampling actors, learners, the inference service, "
            "the evaluation actor; total per run (dppo_hangs_total). Hangs spend faults.max_hang_restarts, not the "
            "crash budgets.",
            [target(f"sum by (run) ({by_run('dppo_hangs_total')}) or on(run) {zero_per_run()}", "{{run}}")],
            decimals=0, minimum=0)),
    ]
    return [("Overview", overview), ("Learning", learning), (ENV_INFO_ROW, env_info_panels()),
            ("Throughput", throughput), ("Iteration phases", phases), ("PPO diagnostics", ppo),
            ("Actors and checkpoints", health),
            (POLICIES_ROW, policies_panels()), (SELFPLAY_ROW, selfplay_panels()), (SWEEP_ROW, sweep_panels())]


def env_info_panels() -> list[tuple[int, int, Panel]]:
    """The env's own figures (metrics.info_keys: a success flag, a distance, a cost), one curve per run and key;
    empty for a run that names none."""
    return [
        (24, 8, timeseries_panel(
            f"{ENV_INFO_PREFIX}info entries by key", "Each metrics.info_keys entry of the env's info, averaged over "
            "the episodes that ended in the last iteration (the value at each episode's end; dppo_env_info, label "
            "key). A gap: no episode that ended carried the key.",
            [target(by_run("dppo_env_info"), "{{run}} {{key}}")])),
    ]


def policies_panels() -> list[tuple[int, int, Panel]]:
    """A run of several policies (a policy map: teams, roles): each policy's curves, labelled ``policy``; empty for
    a run of one policy, whose values are the rows above."""
    def per_policy(title: str, metric: str, description: str, **options: Any) -> Panel:
        return timeseries_panel(f"{POLICIES_PREFIX}{title}", f"{description} ({metric}, one curve per policy).",
                                [target(by_run(metric), "{{run}} {{policy}}")], **options)

    return [
        (12, 8, per_policy("episode return by policy", "dppo_per_policy_episode_return_mean",
                           "Mean return of each policy's agents over their last 100 finished episodes: in a "
                           "competitive game one side's rise is the other's fall", axis_label="return")),
        (6, 8, per_policy("evaluation return by policy", "dppo_per_policy_eval_return_mean",
                          "Each policy's agents in the last evaluation (run.eval_every)", axis_label="return")),
        (6, 8, per_policy("episode length by policy", "dppo_per_policy_episode_length_steps",
                          "Mean episode length of each policy's agents", axis_label="steps", minimum=0)),
        (6, 8, per_policy("policy loss", "dppo_per_policy_policy_loss", "Each policy's clipped-surrogate loss")),
        (6, 8, per_policy("value loss", "dppo_per_policy_value_loss", "Each policy's value-function loss",
                          minimum=0)),
        (6, 8, per_policy("entropy", "dppo_per_policy_entropy", "Each policy's entropy: a policy that stops "
                          "exploring long before the others may be losing", axis_label="nats", minimum=0)),
        (6, 8, per_policy("explained variance", "dppo_per_policy_explained_variance",
                          "Each policy's explained variance of its value predictions")),
        (8, 8, timeseries_panel(
            f"{POLICIES_PREFIX}approx KL and clip fraction", "Each policy's approximate KL of the last update "
            "(dppo_per_policy_approx_kl) and share of clipped ratios (dppo_per_policy_clip_fraction).",
            targets((by_run("dppo_per_policy_approx_kl"), "{{run}} {{policy}} KL"),
                    (by_run("dppo_per_policy_clip_fraction"), "{{run}} {{policy}} clipped")), minimum=0)),
        (8, 8, per_policy("learning rate", "dppo_per_policy_learning_rate", "Each policy's Adam step size",
                          unit="sci", minimum=0)),
        (8, 8, per_policy("gradient norm", "dppo_per_policy_grad_norm", "Each policy's gradient norm before "
                          "clipping", minimum=0)),
    ]


def selfplay_panels() -> list[tuple[int, int, Panel]]:
    """A two-player game's row (self-play): the learner against its snapshot pool; empty for other envs."""
    return [
        (10, 8, timeseries_panel(
            f"{SELFPLAY_PREFIX}win, draw and loss rates", "Shares of the last iteration's games the learner won, "
            "drew and lost against its snapshot pool (dppo_selfplay_win_rate, _draw_rate, _loss_rate). Draws "
            "rising between strong players is what a solved game looks like.",
            targets((by_run("dppo_selfplay_win_rate"), "{{run}} win"),
                    (by_run("dppo_selfplay_draw_rate"), "{{run}} draw"),
                    (by_run("dppo_selfplay_loss_rate"), "{{run}} loss")), unit="percentunit", minimum=0)),
        (10, 8, timeseries_panel(
            f"{SELFPLAY_PREFIX}Elo", "The learner's Elo rating against its own snapshot pool (dppo_selfplay_elo; "
            "starts at 1000, a relative scale): it rises while the learner keeps beating newer snapshots.",
            [target(by_run("dppo_selfplay_elo"), "{{run}}")], axis_label="Elo")),
        (4, 8, stat_panel(
            f"{SELFPLAY_PREFIX}snapshots in the pool", "Frozen snapshots the opponents are drawn from "
            "(dppo_selfplay_pool_size; selfplay.pool_size at most).", by_run("dppo_selfplay_pool_size"),
            decimals=0)),
    ]


def sweep_panels() -> list[tuple[int, int, Panel]]:
    """A `dppo sweep`'s row: its driver serves every trial's run metrics with a ``trial`` label (pick the
    sweep's name in the Run variable); empty for a single run."""
    per_trial = '{trial!=""}'
    return [
        (12, 8, timeseries_panel(
            f"{SWEEP_PREFIX}episode return by trial", "dppo_episode_return_mean of each trial of the sweep "
            "(label trial): ASHA's stopped trials end early, PBT's exploits jump to another trial's curve.",
            [target(by_run(f"dppo_episode_return_mean{per_trial}"), "{{trial}}")], axis_label="return")),
        (12, 8, timeseries_panel(
            f"{SWEEP_PREFIX}trials by state", "Trials of the sweep by Tune state (dppo_sweep_trials).",
            [target(by_run("dppo_sweep_trials"), "{{state}}")], decimals=0, minimum=0)),
        (8, 8, timeseries_panel(
            f"{SWEEP_PREFIX}learning rate by trial", "dppo_learning_rate of each trial: under PBT a step is a "
            "perturbation taking effect.",
            [target(by_run(f"dppo_learning_rate{per_trial}"), "{{trial}}")], unit="sci", minimum=0)),
        (8, 8, timeseries_panel(
            f"{SWEEP_PREFIX}env steps per second by trial", "Rate of each trial's dppo_env_steps_total: the "
            "trials share the cluster.",
            [target(by_run(f"rate(dppo_env_steps_total{per_trial}[{RATE}])"), "{{trial}}")],
            unit="suffix:steps/s", minimum=0)),
        (8, 8, timeseries_panel(
            f"{SWEEP_PREFIX}restores and failures", "Trials restored from a checkpoint (PBT exploits, paused "
            "trials going on: dppo_sweep_trial_restores_total) and trials that failed "
            "(dppo_sweep_trial_failures_total).",
            targets((by_run("dppo_sweep_trial_restores_total"), "restores"),
                    (by_run("dppo_sweep_trial_failures_total"), "failures")), decimals=0, minimum=0)),
    ]


def variables() -> list[Builder[model.VariableModel]]:
    """``datasource`` (any Prometheus) and ``run`` (the runs dppo_run_info names; multi, All = any run)."""
    datasource = (dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus")
                  .hide(model.VariableHide.DONT_HIDE).regex(""))
    run = (dashboard.QueryVariable("run").label("Run").datasource(DATASOURCE)
           .query({"qryType": 1, "query": RUN_VARIABLE_QUERY, "refId": "PrometheusVariableQueryEditor-VariableQuery"})
           .hide(model.VariableHide.DONT_HIDE).refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED).regex("")
           .sort(model.VariableSort.ALPHABETICAL_ASC).multi(True).include_all(True).all_value(".*"))
    return [datasource, run]


def builder() -> dashboard.Dashboard:
    """The dashboard as the SDK's builder: rows in order, each followed by its panels (the SDK lays them out
    left to right, wrapping at the grid's 24 columns)."""
    board = (dashboard.Dashboard(TITLE).uid(UID)
             .description("Training health of dppo runs: return, throughput, iteration phases, PPO diagnostics, "
                          "actors and checkpoints. Pick runs with the Run variable (from dppo_run_info).")
             .tags(["dppo", "ppo", "ray", "reinforcement-learning"]).editable()
             .tooltip(model.DashboardCursorSync.CROSSHAIR).version(1).refresh("10s").time("now-1h", "now")
             .timezone("")  # each viewer's own setting (the SDK's default, "browser", would override it)
             .fiscal_year_start_month(0).live_now(False).links([])
             .annotation(dashboard.AnnotationQuery().built_in(1).name("Annotations & Alerts").type("dashboard")
                         .datasource(model.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
                         .enable(True).hide(True).icon_color("rgba(0, 211, 255, 1)"))
             .variables(variables()))
    for title, cells in sections():
        board.with_row(dashboard.Row(title).collapsed(False))
        for width, height, panel in cells:
            board.with_panel(panel.span(width).height(height))
    return board


def build() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model, panels numbered in layout order (the SDK leaves ids to Grafana; fixed
    ones keep links such as ``?viewPanel=N`` stable across regenerations)."""
    built = builder().build()
    for panel_id, panel in enumerate(built.panels or [], start=1):
        panel.id_val = panel_id
    return json.loads(JSONEncoder().encode(built))


def render() -> str:
    """The committed file's exact text (keys sorted, so an SDK upgrade's reordering makes no diff)."""
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel, in layout order."""
    return [(panel["title"], t["expr"]) for panel in board["panels"] for t in panel.get("targets", [])]


def sdk_mismatch() -> str | None:
    """Why the installed SDK would not reproduce the committed file (another schema), or None."""
    installed = version("grafana-foundation-sdk")
    if installed == SDK_VERSION:
        return None
    return (f"grafana-foundation-sdk {installed} is installed, the dashboard is generated with {SDK_VERSION}: "
            f"pip install 'grafana-foundation-sdk=={SDK_VERSION}' (or pip install -e '.[dev]')")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python helm/dashboard.py", description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=Path, default=DASHBOARD_PATH, help="where to write the JSON")
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when the file differs")
    args = parser.parse_args(argv)
    mismatch = sdk_mismatch()
    if mismatch is not None:
        print(mismatch, file=sys.stderr)
        return 2
    text = render()
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is out of date; run: python helm/dashboard.py", file=sys.stderr)
            return 1
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
