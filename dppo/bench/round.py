"""`dppo bench round`: where one sampling round's time goes, with one actor and in-process.

A round is what a run's driver does per iteration before the update: export the weights and hand them to
the actor (``broadcast_arg``), call ``sample``, wait for the Segment and read it. The part that is not the
actor's own sampling (``Segment.sample_seconds``) is the round's overhead; only segments long enough to
dwarf it hide it. Beside the per-round timings the command measures the pieces the overhead is made of:
an actor call that does nothing (Ray's floor here), the serialization of a Segment and of a broadcast
(bytes and out-of-band buffers, which Ray ships one by one), and an actor's weight load. Every Ray round
is paired with an in-process sample just before it, so the efficiency compares the two under one load.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dppo.bench.common import (
    Row,
    add_common_args,
    bench_config,
    check_env_id,
    machine,
    parse_counts,
    ray_session,
    sampling_actors,
    torch_threads,
)
from dppo.bench.docs import emit
from dppo.cli_args import positive

if TYPE_CHECKING:
    from dppo.config import Config


def _median_ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1e3, 3)


def _timed_ms(fn: Callable[[int], Any], repeats: int) -> float:
    """Median milliseconds of ``fn(i)`` over ``repeats`` calls (after one untimed call)."""
    fn(-1)
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - start)
    return _median_ms(times)


def wire_cost(value: Any, repeats: int = 200) -> Row:
    """Bytes, out-of-band buffers and serialize + deserialize time of ``value`` as Ray pickles it
    (cloudpickle, protocol 5: every contiguous numpy array becomes its own buffer)."""
    from ray import cloudpickle

    buffers: list[Any] = []
    data = cloudpickle.dumps(value, protocol=5, buffer_callback=buffers.append)

    def round_trip(_: int) -> None:
        found: list[Any] = []
        cloudpickle.loads(cloudpickle.dumps(value, protocol=5, buffer_callback=found.append), buffers=found)

    size = len(data) + sum(memoryview(b).nbytes for b in buffers)
    return {"bytes": size, "buffers": len(buffers), "serde_ms": _timed_ms(round_trip, repeats)}


def _paired_rounds(config: Config, iterations: int) -> tuple[Row, Any, Any]:
    """Per-round timings of one actor sampling as a run's driver does it, each round paired with one
    in-process sample just before it, so both halves of the ratio see the same load of this shared machine
    (measured one after the other, they need not). Also returns a Segment and a broadcast for their wire
    costs."""
    import ray

    from dppo.distributed.broadcast import Broadcast, broadcast_arg
    from dppo.rl.agent import export_weights
    from dppo.rl.build import build_model
    from dppo.rl.sampler import Sampler

    sampler = Sampler(config)
    model = build_model(sampler.envs.single_observation_space, sampler.envs.single_action_space, config.model)
    weights = export_weights(model)  # the model is never updated here: one export serves every load below
    sampler.set_weights(weights, 0)  # weights before the first step, as in an actor
    try:
        with sampling_actors(config, 1) as (actor,):
            ray.get(actor.ready.remote())
            call_ms = _timed_ms(lambda _: ray.get(actor.ready.remote()), max(iterations, 50))
            timings: dict[str, list[float]] = {
                k: [] for k in ("in_process", "broadcast", "submit", "round", "sample", "overhead")}
            segment = broadcast = None
            for version in range(-1, iterations):  # version -1: the warm-up round, not timed
                t_in = time.perf_counter()
                sampler.sample()
                t0 = time.perf_counter()
                broadcast = Broadcast(export_weights(model), version + 1, None, None)
                arg = broadcast_arg(broadcast)
                t1 = time.perf_counter()
                ref = actor.sample.remote(arg)
                t2 = time.perf_counter()
                ray.wait([ref], num_returns=1)
                segment = ray.get(ref)
                t3 = time.perf_counter()
                if version >= 0:
                    for key, value in (("in_process", t0 - t_in), ("broadcast", t1 - t0), ("submit", t2 - t1),
                                       ("round", t3 - t0), ("sample", segment.sample_seconds),
                                       ("overhead", t3 - t0 - segment.sample_seconds)):
                        timings[key].append(value)
            # an actor's weight load (its sampler's torch model, which an MLP actor never builds, left alone)
            load_ms = _timed_ms(lambda i: sampler.set_weights(weights, 1_000 + i), max(iterations, 50))
    finally:
        sampler.close()
    row = {f"{key}_ms": _median_ms(values) for key, values in timings.items()}
    row["actor_call_ms"], row["weight_load_ms"] = call_ms, load_ms
    return row, segment, broadcast


def bench_round(segment_lengths: list[int], env_id: str = "CartPole-v1", envs_per_actor: int = 8,
                iterations: int = 50, address: str | None = None) -> list[Row]:
    """One row per segment length T: the in-process round, the Ray round and its overhead with its pieces."""
    rows: list[Row] = []
    with ray_session(address, 1), torch_threads(1):
        for steps in segment_lengths:
            config = bench_config(env_id, envs_per_actor, steps, 0.0, "sync")
            timings, segment, broadcast = _paired_rounds(config, iterations)
            seg_wire, cast_wire = wire_cost(segment), wire_cost(broadcast)
            rows.append({
                "segment_length": steps, "envs_per_actor": envs_per_actor, **timings,
                "efficiency": round(timings["in_process_ms"] / timings["round_ms"], 3),
                "segment_kib": round(seg_wire["bytes"] / 1024, 1), "segment_buffers": seg_wire["buffers"],
                "segment_serde_ms": seg_wire["serde_ms"], "broadcast_kib": round(cast_wire["bytes"] / 1024, 1),
                "broadcast_buffers": cast_wire["buffers"], "broadcast_serde_ms": cast_wire["serde_ms"],
            })
    return rows


def register(sub: argparse._SubParsersAction) -> None:
    """Add `dppo bench round`."""
    parser = sub.add_parser("round", help="where a sampling round's time goes (1 actor against in-process)")
    parser.add_argument("--segment-lengths", default="1,64,128", help="comma-separated T values (default 1,64,128)")
    parser.add_argument("--env", default="CartPole-v1", help="gymnasium env id (default CartPole-v1)")
    parser.add_argument("--envs-per-actor", type=positive(int, "--envs-per-actor"), default=8, help="E (default 8)")
    parser.add_argument("--iterations", type=positive(int, "--iterations"), default=50,
                        help="timed rounds per row, after one warm-up round (default 50)")
    add_common_args(parser)
    parser.set_defaults(func=cmd_round)


def cmd_round(args: argparse.Namespace) -> int:
    lengths = parse_counts(args.segment_lengths, "--segment-lengths")
    info = machine()
    rows = bench_round(lengths, check_env_id(args.env), args.envs_per_actor, args.iterations, args.address)
    note = ("One actor, CPU-bound, medians over the timed rounds (ms). `in_process_ms`: dppo's Sampler without "
            "Ray, one sample just before each Ray round (paired, so both see the same load); `round_ms`: the "
            "driver's round with one Ray actor, from exporting the weights to the Segment in hand, made of "
            "`broadcast_ms` (export the weights, hand them over with `broadcast_arg`), "
            "`submit_ms` (the `sample` call) and the wait; `sample_ms`: the actor's own sampling "
            "(Segment.sample_seconds); `overhead_ms` = round - sample; `efficiency` = in_process / round. "
            "The pieces: `actor_call_ms` is an actor call that does nothing (Ray's floor here); "
            "`weight_load_ms` an actor loading a new weight version; `*_kib`, `*_buffers`, `*_serde_ms`: size, "
            "out-of-band buffers (Ray ships each one separately) and serialize + deserialize time of the Segment "
            "and of the broadcast, pickled as Ray pickles them.")
    columns = ["segment_length", "envs_per_actor", "in_process_ms", "round_ms", "efficiency", "sample_ms",
               "overhead_ms", "broadcast_ms", "submit_ms", "actor_call_ms", "weight_load_ms", "segment_kib",
               "segment_buffers", "segment_serde_ms", "broadcast_kib", "broadcast_buffers", "broadcast_serde_ms"]
    key = args.section or f"round-{args.env.split('/')[-1]}"
    emit(args, rows, columns, key, f"Sampling round breakdown, {args.env}, 1 actor", note, info)
    return 0
