"""Every Prometheus metric of dppo, defined once.

The driver of a run (the process ``dppo train`` runs in; its Reporter) owns one :class:`Metrics` (its own
registry, so tests can make several) and calls :meth:`Metrics.record_iteration` with the same record it
writes to ``progress.jsonl``, so the two always agree. Names follow Prometheus conventions: ``dppo_``
prefix, base units, ``_total`` on counters, ``_seconds`` on durations; labels are low-cardinality (``phase``,
``actor``, ``reason``, ``learner``: a rank below run.learners; ``policy``: a policy of the run's policy map).
``learner`` always means one of the L learners of
the group, never the driver.
"""

from __future__ import annotations

import errno
import socket
import time
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from dppo.errors import UsageError

INFO_PREFIX = "info/"  # progress keys of the env's own figures (metrics.info_keys) -> dppo_env_info{key=...}
PHASES = ("sample", "wait", "update", "sync", "checkpoint", "env", "inference")  # env, inference: parts of sample
RETURN_BUCKETS = (-1000, -500, -250, -100, -50, 0, 50, 100, 200, 300, 400, 475, 500, 1000, 2000, 5000)
PHASE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

# Diagnostics copied straight from the progress record into gauges: record key -> (name, help).
DIAGNOSTIC_GAUGES: dict[str, tuple[str, str]] = {
    "policy_loss": ("dppo_policy_loss", "Clipped-surrogate policy loss of the last update (mean over minibatches)."),
    "value_loss": ("dppo_value_loss", "Value-function loss of the last update (mean over minibatches)."),
    "entropy": ("dppo_entropy", "Mean policy entropy in nats over the last update's minibatches."),
    "approx_kl": ("dppo_approx_kl", "Approximate KL divergence old->new policy of the last update."),
    "clip_fraction": ("dppo_clip_fraction", "Fraction of samples whose probability ratio was clipped."),
    "explained_variance": ("dppo_explained_variance", "Explained variance of the value predictions."),
    "learning_rate": ("dppo_learning_rate", "Adam learning rate used by the last update."),
    "grad_norm": ("dppo_grad_norm", "Global gradient norm before clipping (mean over minibatches)."),
    "policy_version": ("dppo_policy_version", "Version of the weights broadcast to the actors."),
    "episode_return_mean": ("dppo_episode_return_mean", "Mean return of the last 100 finished episodes."),
    "eval_return_mean": ("dppo_eval_return_mean", "Mean return of the last evaluation (run.eval_every)."),
    "episode_length_mean": ("dppo_episode_length_steps", "Mean length in steps of the last 100 finished episodes."),
    "steps_per_s": ("dppo_env_steps_per_second", "Env steps per second over the last iteration."),
    "iteration": ("dppo_iteration", "Iterations completed."),
    "policy_lag": ("dppo_policy_lag", "Versions between the weights a segment was sampled with and the trained ones."),
    "selfplay_win_rate": ("dppo_selfplay_win_rate", "Self-play: the learner's share of the last iteration's games "
                          "won against its opponents (the snapshot pool; the random player before the first pool "
                          "reaches an actor)."),
    "selfplay_draw_rate": ("dppo_selfplay_draw_rate", "Self-play: share of the last iteration's games drawn."),
    "selfplay_loss_rate": ("dppo_selfplay_loss_rate", "Self-play: share of the last iteration's games lost."),
    "selfplay_elo": ("dppo_selfplay_elo", "Self-play: the learner's Elo rating against its snapshot pool."),
    "selfplay_pool_size": ("dppo_selfplay_pool_size", "Self-play: frozen snapshots in the opponent pool."),
}

# A run of several policies (a policy map): each policy's record keys (POLICY/key) -> gauges labelled ``policy``.
PER_POLICY_GAUGES: dict[str, tuple[str, str]] = {
    "episode_return_mean": ("dppo_per_policy_episode_return_mean", "A policy's agents: mean return of their last "
                            "100 finished episodes (a run of several policies)."),
    "episode_length_mean": ("dppo_per_policy_episode_length_steps", "A policy's agents: mean length in steps of "
                            "their last 100 finished episodes."),
    "eval_return_mean": ("dppo_per_policy_eval_return_mean", "A policy's agents: mean return in the last "
                         "evaluation (run.eval_every)."),
    **{key: (f"dppo_per_policy_{name.removeprefix('dppo_')}", f"A policy's update: {text[0].lower()}{text[1:]}")
       for key, (name, text) in DIAGNOSTIC_GAUGES.items()
       if key in ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "explained_variance",
                  "learning_rate", "grad_norm")},
}


def check_port(host: str, port: int) -> None:
    """The metrics server can listen on host:port (checked before anything is written; the port is let go at
    once, so a program may take it before the server binds it: `Exporter.serve` then says the same line)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the HTTP server binds it
        try:
            probe.bind((host, port))
        except OSError as err:
            raise unusable_port(host, port, err) from None


def unusable_port(host: str, port: int, err: OSError) -> UsageError:
    """The one line for a metrics port that cannot be bound: why, and what to pass instead."""
    why = {errno.EADDRINUSE: "something on this machine holds it", errno.EACCES: "permission denied",
           errno.EADDRNOTAVAIL: f"{host} is not an address of this machine"}.get(err.errno or 0, err.strerror)
    return UsageError(f"the metrics port {port} on {host} cannot be used ({why}); pass another --metrics-port "
                      "(metrics.port), or 0 to serve no metrics")


class Exporter:
    """A registry served over HTTP in a daemon thread: a run's metrics (from its driver), or a sweep's."""

    registry: CollectorRegistry
    _server: Any = None

    def serve(self, port: int, host: str = "0.0.0.0") -> int:
        """Start the HTTP exporter; returns the bound port (useful with port 0 in tests)."""
        try:
            self._server, _thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as err:  # taken since check_port (a port in the ephemeral range can be any connection's)
            raise unusable_port(host, port, err) from None
        return int(self._server.server_port)

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class Metrics(Exporter):
    """A run's metrics, served by its driver, and (optionally) the HTTP server that exposes them."""

    def __init__(self, env_id: str, run_name: str) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.env_steps = Counter("dppo_env_steps", "Env steps collected by all actors.", registry=r)
        self.episodes = Counter("dppo_episodes", "Episodes finished in all actors.", registry=r)
        self.episode_return = Histogram(
            "dppo_episode_return", "Returns of finished training episodes.", buckets=RETURN_BUCKETS, registry=r
        )
        self.phase_seconds = Histogram(
            "dppo_iteration_phase_seconds", "Seconds each phase of an iteration took (env and inference: parts of "
            "sample).", ["phase"],
            buckets=PHASE_BUCKETS, registry=r,
        )
        self.iteration_seconds = Histogram(
            "dppo_iteration_seconds", "Wall seconds per iteration.", buckets=PHASE_BUCKETS, registry=r
        )
        self.diagnostics = {
            key: Gauge(name, help_text, registry=r) for key, (name, help_text) in DIAGNOSTIC_GAUGES.items()
        }
        self.policy_lag = self.diagnostics["policy_lag"]
        self.per_policy = {key: Gauge(name, help_text, ["policy"], registry=r)
                           for key, (name, help_text) in PER_POLICY_GAUGES.items()}
        self.actors_alive = Gauge("dppo_actors_alive", "Actors currently alive.", registry=r)
        self.actors_desired = Gauge("dppo_actors_desired", "Actors the run asks for.", registry=r)
        self.actors_pending = Gauge(
            "dppo_actors_pending", "Replacements of lost actors waiting for the cluster to place and start them.",
            registry=r)
        self.actor_losses = Counter(
            "dppo_actor_losses", "Actors lost, by cause: node (their node went away), crash (the process died) or "
            "hang (it missed its deadline and was killed).", ["cause"], registry=r)
        for cause in ("node", "crash", "hang"):  # a fixed set: every series exists (at 0) from the start
            self.actor_losses.labels(cause=cause)
        self.hangs = Counter(
            "dppo_hangs", "Processes that missed their deadline (faults.hang_timeout_s, or 10x the median of their "
            "call), killed and replaced: actors, learners, the inference service, the evaluation actor.", registry=r)
        self.actor_restarts = Counter(
            "dppo_actor_restarts", "Actors replaced after a failure.", ["actor"], registry=r
        )
        self.learner_update_seconds = Histogram(
            "dppo_learner_update_seconds", "Seconds of each learner's PPO update (label: rank < run.learners).",
            ["learner"], buckets=PHASE_BUCKETS, registry=r,
        )
        self.learner_allreduce_seconds = Histogram(
            "dppo_learner_allreduce_seconds", "Seconds of each learner's update spent in all-reduce, waiting "
            "for its peers included.", ["learner"], buckets=PHASE_BUCKETS, registry=r,
        )
        self.learner_restarts = Counter(
            "dppo_learner_restarts", "Learner groups restarted after a learner died.", registry=r
        )
        self.actor_segments = Counter(
            "dppo_actor_segments", "Segments received from each actor (several policies' together: one).", ["actor"],
            registry=r
        )
        self.actor_sample_seconds = Counter(
            "dppo_actor_sample_seconds", "Seconds each actor spent sampling.", ["actor"], registry=r
        )
        self.env_failures = Counter(
            "dppo_env_failures", "Env copies that raised and were recreated alone, their episode cut there (never "
            "counted as a return), by actor.", ["actor"], registry=r
        )
        self.segments_dropped = Counter(
            "dppo_segments_dropped", "Segments not trained on, by reason.", ["reason"], registry=r
        )
        self.updates_skipped = Counter(
            "dppo_updates_skipped", "Updates skipped because the loss or a gradient was NaN/Inf.", registry=r
        )
        self.checkpoints = Counter("dppo_checkpoints_written", "Checkpoints written.", registry=r)
        self.checkpoint_bytes = Gauge("dppo_checkpoint_size_bytes", "Size of the last checkpoint.", registry=r)
        self.env_info = Gauge("dppo_env_info", "The env's own figures (metrics.info_keys): a key's mean over the "
                              "episodes that ended in the last iteration (no series while none carried it).", ["key"],
                              registry=r)
        self.run_info = Gauge("dppo_run_info", "Constant 1, labelled with the run's env id and name.",
                              ["env", "run"], registry=r)
        self.run_info.labels(env=env_id, run=run_name).set(1)
        self.start_time = Gauge("dppo_start_time_seconds", "Unix time the run started.", registry=r)
        self.start_time.set(time.time())

    def record_iteration(
        self, record: dict[str, Any], new_episode_returns: Iterable[float], phases: dict[str, float]
    ) -> None:
        """Update every iteration metric from the progress record that goes to progress.jsonl."""
        returns = list(new_episode_returns)
        self.env_steps.inc(record["env_steps_delta"])
        self.episodes.inc(len(returns))
        for value in returns:
            self.episode_return.observe(value)
        for phase, seconds in phases.items():
            self.phase_seconds.labels(phase=phase).observe(seconds)
        self.iteration_seconds.observe(record["iteration_s"])
        self.set_gauges(record)

    def set_gauges(self, record: dict[str, Any]) -> None:
        """The gauges of the keys ``record`` has: a progress record, or an evaluation's keys at the run's end."""
        for key, gauge in self.diagnostics.items():
            value = record.get(key)
            if value is not None:
                gauge.set(value)
        for key, value in record.items():
            if key.startswith(INFO_PREFIX):
                self.set_env_info(key.removeprefix(INFO_PREFIX), value)
                continue
            policy, _, inner = key.rpartition("/")
            if policy and inner in self.per_policy and value is not None:
                self.per_policy[inner].labels(policy=policy).set(value)

    def set_env_info(self, key: str, value: float | None) -> None:
        """An iteration where no ended episode carried the key has no value: its series goes (not 0, not stale;
        removing a series that is not there does nothing)."""
        if value is not None:
            self.env_info.labels(key=key).set(value)
        else:
            self.env_info.remove(key)

    def init_actors(self, count: int) -> None:
        """Create each actor's labelled series at 0, so increase() sees the first restart."""
        for actor in range(count):
            for counter in (self.actor_restarts, self.actor_segments, self.actor_sample_seconds, self.env_failures):
                counter.labels(actor=str(actor))
        for reason in ("late", "nonfinite"):
            self.segments_dropped.labels(reason=reason)

    def record_actor(self, actor: int, sample_seconds: float) -> None:
        label = str(actor)
        self.actor_segments.labels(actor=label).inc()
        self.actor_sample_seconds.labels(actor=label).inc(sample_seconds)
