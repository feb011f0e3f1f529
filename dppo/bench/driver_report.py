"""`dppo bench driver`'s table and its section of docs/benchmarks.md: the columns and the note that says what each
means, what this machine could not show and what breaks first at 1,000 actors (kept apart from the measuring in
:mod:`dppo.bench.driver_scaling`, so each stays one page)."""

from __future__ import annotations

import argparse
from typing import Any

from dppo.bench.common import Row
from dppo.bench.docs import emit

COLUMNS = ["actors", "inference", "learners", "startup_s", "iteration_ms", "sample_ms", "overhead_ms",
           "overhead_per_actor_ms", "driver_cpu_ms", "broadcast_ms", "gather_wait_ms", "gather_get_ms",
           "received_kib_per_actor", "polls", "polled_refs", "poll_us",
           "batch_ms", "sgd_ms", "bookkeeping_ms", "report_ms", "other_ms", "actor_rss_mib", "actor_pss_mib"]
SERVED = ["inference_batches", "inference_rows", "inference_forward_ms", "inference_queue_ms"]  # server rows only

NOTE = (
    "N tiny actors ({envs} x {steps} steps of {env} each, `run.actor_cpus={cpus:g}`) on one machine and a negligible "
    "update (an 8-unit MLP, after the CNN for image observations; 1 epoch, one minibatch), driven by the run's own "
    "Coordinator with its driver-side "
    "work timed from outside; medians over the timed iterations, after one warm-up. `overhead_ms` = the iteration's "
    "wall time - the slowest actor's own sampling (`sample_ms`); `driver_cpu_ms`: the driver process's CPU time "
    "per iteration (all its threads, Ray's included). The pieces: `broadcast_ms` (export the weights, "
    "`broadcast_arg`, dispatch N `sample` calls), `gather_wait_ms` (the `ray.wait` polls, `polls` of them over "
    "`polled_refs` refs in all: the actors' sampling and their calls' transport are inside it; `poll_us` is one "
    "such poll over N ready refs, measured alone), `gather_get_ms` "
    "(`ray.get` of the N segments; with `learners` > 1, processes of their own that fetch the segments, of their "
    "summaries only), `received_kib_per_actor` (the bytes of what those `ray.get`s returned, serialized as Ray "
    "moves them, per actor per iteration: what crosses into the driver's process), `batch_ms` (the N-way "
    "concatenation and GAE), `sgd_ms` (the tiny update), "
    "`bookkeeping_ms` (counters and the progress record), `report_ms` (progress.jsonl, metrics, TensorBoard, "
    "log), `other_ms` the rest of the loop. `startup_s`: the learner and N actors started and their envs made. "
    "One idle actor takes {rss_mib:.0f} MiB RSS, {pss_mib:.0f} MiB PSS here; an N whose actors would not fit this "
    "machine's free memory (less a quarter of it, kept for the rest of a shared machine) is not run (the row "
    "says so, with the figures).\n\n"
    "**`inference`**: `actor` rows compute the policy in each actor (`run.inference=actor`); `server` rows are the "
    "same run with `run.inference=server`: the policy computed by the inference service, one Ray actor on the CPU "
    "beside the driver (it reserves no CPU), which batches the actors' requests (one per actor per env step, per "
    "half of its envs when E > 1) until all N are in or {wait_ms:g} ms after the first. Its figures are read from "
    "the service after each iteration, outside the timings: `inference_batches` forward passes per iteration, "
    "`inference_rows` rows per pass (N when every actor's request came within the wait), `inference_forward_ms` "
    "one pass, `inference_queue_ms` how long a pass's first request waited in the service before the pass ran "
    "(the batching latency, per pass: the medians of each iteration's medians). When every actor's request comes "
    "within the wait, an iteration is T + 1 passes of N rows per half (T steps and the last observations' values); "
    "more passes of fewer rows mean the requests came further apart than the wait (here: N actors queued on "
    "{cores} cores), and every env step then costs an actor up to the wait. In `server` rows `broadcast_ms` "
    "includes loading the weights into the service, and every env step is a round trip actor -> service -> actor, "
    "so `sample_ms` holds T x (the call's transport, the queue wait and the pass).\n\n"
    "**On this machine the N actors share its {cores} cores with the driver** (and the service), so "
    "`gather_wait_ms` holds N actors' call handling (deserialize the broadcast, sample, serialize the segment) "
    "queued on {cores} cores: that part grows with N here and is spread over N cores on a cluster; "
    "`driver_cpu_ms` is what the driver itself spends.\n\n"
    "**What grows with N, and what breaks first at 1,000 actors on KubeRay** (on paper, but for the one figure "
    "measured here): per iteration the driver makes N `sample` calls, polls `ray.wait` for the segments (after "
    "each arrival one more poll takes every segment ready by then; the gather's first version polled once per "
    "arriving segment over the refs still pending, N(N+1)/2 ref checks per round: alone, the 1,000 polls of a "
    "1,000-segment gather with every object ready took {polls_1000_ms:.0f} ms of the driver here), fetches and "
    "deserializes N segments into its one process (`ray.get`: every env step of the round crosses into the "
    "driver), concatenates them, and reports. At start the GCS registers N actors and the raylets start N worker "
    "processes, a few at a time per node (`startup_s`); on KubeRay 1,000 one-CPU actors are 1,000 / (cores per "
    "pod) worker pods, each a raylet reporting to the head's GCS. What breaks first is the driver's one process, "
    "which receives every segment: with Atari-sized segments (8 envs x 128 steps of 84x84x4 uint8 frames, about "
    "28 MiB each) 1,000 actors put about 27 GiB through it per iteration, far more than one process deserializes "
    "in the 0.5 s budget. Next come the head's GCS (the actor table, N object-ownership records per round, the "
    "raylets' reports) and the head node's object store, which receives every segment the driver gets. How the "
    "design answers it: with `run.learners` > 1 the learners get the segments by reference, and each actor returns a "
    "summary of its segment beside it (episode returns, NaN flag, sample seconds, normalizer statistics, faults), "
    "which is all the driver reads: the `received_kib_per_actor` of the `learners` > 1 rows, whatever the "
    "segment's size (issue 56). Fewer, bigger actors (more envs "
    "each, ale-py's vector env) keep N in the hundreds for the same env steps; a hierarchical gather (a "
    "sub-driver per node group) bounds what any one process receives; the inference service (issue 35) moves "
    "the policy's forward pass off the actors, so each is lighter and holds more envs, at the cost of one "
    "service call per env step (the `server` rows), and one service is itself one process that every actor's "
    "requests reach: at 1,000 actors it wants a service per node group, as the gather does."
)


def write_report(args: argparse.Namespace, rows: list[Row], idle: dict[str, float], info: dict[str, Any]) -> None:
    """The table on stdout, ``--json`` and ``--write-docs`` (the served columns only when a row has them)."""
    from dppo.distributed.inference import BATCH_WAIT_S

    note = NOTE.format(envs=args.envs_per_actor, steps=args.segment_length, env=args.env, cpus=args.actor_cpus,
                       cores=info["cpus"], wait_ms=BATCH_WAIT_S * 1e3, **idle)
    columns = COLUMNS + [c for c in SERVED if any(c in r for r in rows)] + (["note"] if any("note" in r for r in rows)
                                                                           else [])
    key = args.section or f"driver-{args.env.split('/')[-1]}"
    emit(args, rows, columns, key, f"Driver cost against the number of actors, {args.env}", note, info)
