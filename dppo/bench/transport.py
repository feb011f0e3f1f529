"""`dppo bench transport`: what one request to the inference service costs an actor, end to end, through the
same-node shared-memory transport against a Ray call, in the same run, with 1 to N actors asking at once.

The model is all but a no-op (CartPole's 4 numbers through an 8-unit MLP, its forward pass reported beside), so the
round trip is the transport's: what a sampling actor pays per env step per half before any network runs (issue 42:
a Ray call per step fed a GPU at 0.46x of the actors' own CPUs).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from dppo.bench.common import Row, add_common_args, machine, parse_counts, ray_session
from dppo.bench.docs import emit
from dppo.cli_args import positive

ENV_ID = "CartPole-v1"
WARMUP = 200  # requests before the timed ones (connections, first batches)
MODES = {"shared memory": "shm", "ray call": "ray"}


class Asker:
    """A client in a process of its own, as a sampling actor is: ``requests`` round trips, one at a time."""

    def __init__(self, rows: int) -> None:
        import gymnasium as gym
        import numpy as np

        from dppo.config import ModelConfig
        from dppo.rl.spaces import check_spaces

        env = gym.make(ENV_ID)
        self.model = ModelConfig(hidden_sizes=[8])
        self.specs = check_spaces(env.observation_space, env.action_space, self.model)
        self.rows = rows
        obs = np.random.default_rng(0).normal(size=(rows, 4)).astype(np.float32)
        self.obs = self.specs[0].encode(obs)

    def run(self, mode: str, service: Any, endpoint: Any, requests: int) -> list[float]:
        """Seconds of each timed round trip."""
        from dppo.distributed.inference_client import RayCallClient
        from dppo.rl.policy import Request
        from dppo.transport.client import ShmClient
        from dppo.transport.protocol import Layout

        client = (ShmClient(endpoint, Layout(*self.specs, self.model, self.rows)) if mode == "shm"
                  else RayCallClient(service))
        request = Request(0, self.obs)
        seconds = []
        try:
            for i in range(WARMUP + requests):
                start = time.perf_counter()
                client.result(client.submit(request))
                if i >= WARMUP:
                    seconds.append(time.perf_counter() - start)
        finally:
            if isinstance(client, ShmClient):
                client.close()
        return seconds


def bench_transport(client_counts: list[int], requests: int = 2000, rows: int = 4, address: str | None = None
                    ) -> list[Row]:
    """One row per transport and client count: each round trip's median and mean in ms, the service's batches."""
    import gymnasium as gym
    import ray

    from dppo.config import load_config
    from dppo.distributed.service_supervisor import start_service
    from dppo.rl.agent import export_weights
    from dppo.rl.build import build_model

    rows_out: list[Row] = []
    env = gym.make(ENV_ID)
    with ray_session(address, max(client_counts) + 1):
        remote_asker = ray.remote(num_cpus=0)(Asker)
        for count in client_counts:
            config = load_config(overrides={"env.id": ENV_ID, "run.actors": count,
                                            "model.hidden_sizes": [8]})  # run.actors: the requests a batch expects
            service = start_service(config, env.observation_space, env.action_space, "cpu")
            askers = [remote_asker.remote(rows) for _ in range(count)]
            try:
                endpoint = ray.get(service.ready.remote())
                ray.get(service.load.remote(export_weights(build_model(env.observation_space, env.action_space,
                                                                       config.model)), 0))
                ray_ms = None
                for label, mode in MODES.items():
                    ray.get(service.stats.remote())  # figures of this mode only
                    times = [s for part in ray.get([a.run.remote(mode, service, endpoint, requests) for a in askers])
                             for s in part]
                    figures = ray.get(service.stats.remote())
                    median_ms = statistics.median(times) * 1000
                    if mode == "ray":
                        ray_ms = median_ms
                    rows_out.append({"transport": label, "clients": count, "rows": rows, "requests": len(times),
                                     "round_trip_ms_median": round(median_ms, 4),
                                     "round_trip_ms_mean": round(statistics.fmean(times) * 1000, 4),
                                     "round_trip_ms_p90": round(statistics.quantiles(times, n=10)[-1] * 1000, 4),
                                     "requests_per_batch": round(figures["rows_mean"] / rows, 2),
                                     "forward_ms_median": round(figures["forward_s_median"] * 1000, 4)})
                for row in rows_out[-len(MODES):]:
                    row["of_ray_call"] = round(row["round_trip_ms_median"] / ray_ms, 3) if ray_ms else None
            finally:
                for asker in askers:
                    ray.kill(asker)
                ray.get(service.close.remote())
                ray.kill(service)
    return rows_out


def register(sub: argparse._SubParsersAction) -> None:
    """Add `dppo bench transport`."""
    parser = sub.add_parser("transport", help="an actor's round trip to the inference service: shared memory "
                                              "against a Ray call")
    parser.add_argument("--clients", default="1,2,4", help="comma-separated counts of actors asking at once "
                                                         "(default 1,2,4)")
    parser.add_argument("--requests", type=positive(int, "--requests"), default=2000,
                        help="timed round trips per client and transport (default 2000)")
    parser.add_argument("--rows", type=positive(int, "--rows"), default=4,
                        help="envs per request: an actor's half of its envs (default 4)")
    add_common_args(parser)
    parser.set_defaults(func=cmd_transport)


def cmd_transport(args: argparse.Namespace) -> int:
    counts = parse_counts(args.clients, "--clients")
    info = machine()
    rows = bench_transport(counts, args.requests, args.rows, args.address)
    note = ("The time a sampling actor waits for one request to the inference service (run.inference=server): the "
            "observations of `rows` envs out, the networks' outputs back. `shared memory`: actors on the service's "
            "node (dppo/transport/protocol.py: the data in a segment per actor, a 20-byte message each way "
            "on a Unix socket); `ray call`: an actor on another node (one Ray actor call per request). Each client "
            "is a Ray actor of its own asking one request at a time; the service batches the requests of all "
            "`clients` (one forward pass once every client's request is in, or 2 ms after the first). The model "
            "is CartPole's 8-unit MLP, all but a no-op (`forward_ms_median`: its forward pass per batch); "
            "`of_ray_call`: the median round trip over the Ray call's in the same run. Target (issue 42): "
            "<= 0.25 ms through shared memory.")
    columns = ["transport", "clients", "rows", "requests", "round_trip_ms_median", "round_trip_ms_mean",
               "round_trip_ms_p90", "of_ray_call", "requests_per_batch", "forward_ms_median"]
    emit(args, rows, columns, args.section or "transport", "Inference transport: an actor's round trip, shared "
         "memory against a Ray call", note, info)
    return 0
