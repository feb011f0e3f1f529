"""`dppo bench driver`: how the driver's cost per iteration grows with the number of actors N.

Many tiny actors (fractional CPUs, a trivial env, a few steps each) and a negligible update, so what an
iteration costs beyond the slowest actor's own sampling is the driver's: the run's real Coordinator, timed
from outside by a bench-only subclass (the loop itself is not changed). Its Ray calls go through a timing
:class:`~dppo.distributed.ray_calls.RayCalls`, and the phases it already times (progress.jsonl's ``sync_s``,
``sample_s``) are split further: the broadcast (export, ``broadcast_arg``, then N ``sample`` calls
dispatched), the gather (the ``ray.wait`` polls and the ``ray.get`` of N segments, or with ``--learners`` > 1 of
their summaries, and the bytes of what it got), the N-way batch
(concatenation and GAE), the bookkeeping, the reporting. The driver's own CPU seconds are read beside the wall
clock (on one machine the N actors share its cores: the wait for them is not the driver's cost, its CPU time is).
Actor start-up and per-actor memory are columns of their own (they bound how many actors fit). With
``--inference server`` each N runs again with the inference service computing the actors' policy, and its batch
figures (passes, rows, forward and queue seconds) are read after each iteration. The table and the docs section
are :mod:`dppo.bench.driver_report`'s.
"""

from __future__ import annotations

import argparse
import math
import pickle
import resource
import signal
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dppo.bench.common import Row, add_common_args, bench_config, check_env_id, machine, parse_counts, ray_session
from dppo.bench.driver_report import SERVED, write_report
from dppo.bench.memory import read_kib
from dppo.cli_args import fail, positive

if TYPE_CHECKING:
    from dppo.config import Config

MEMORY_MARGIN = 0.25  # of the machine's memory, left free for the driver, Ray and whatever else shares the machine
START_TIMEOUT_S = 3600.0
PIECES = ("sync", "dispatch", "wait", "get", "batch", "sgd", "bookkeeping", "report")


class Ledger:
    """Seconds and counts per piece of the current iteration, summed as the driver runs and reset per iteration."""

    def __init__(self) -> None:
        self.seconds, self.counts = self._zero()

    @staticmethod
    def _zero() -> tuple[dict[str, float], dict[str, int]]:
        return dict.fromkeys(PIECES, 0.0), {"polls": 0, "polled_refs": 0, "received_bytes": 0}

    @contextmanager
    def timing(self, piece: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[piece] += time.perf_counter() - start

    def timed(self, piece: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` with its seconds added to ``piece``."""
        def call(*args: Any, **kwargs: Any) -> Any:
            with self.timing(piece):
                return fn(*args, **kwargs)
        return call

    def take(self) -> tuple[dict[str, float], dict[str, int]]:
        """This iteration's figures; the ledger starts the next one at zero."""
        taken = self.seconds, self.counts
        self.seconds, self.counts = self._zero()
        return taken


def timed_coordinator(config: Config, run_dir: Path, ledger: Ledger,
                      on_iteration: Callable[[dict[str, Any], Path | None], None]) -> Any:
    """The run's Coordinator with its driver-side work timed into ``ledger`` (classes made here: Ray and torch
    load only when the benchmark runs)."""
    from dppo.distributed.actor_pool import ActorPool
    from dppo.distributed.membership import actor_calls
    from dppo.distributed.ray_calls import RayCalls
    from dppo.rl.batch import build_batch
    from dppo.run.coordinator import Coordinator

    class TimedCalls(RayCalls):
        """The pool's Ray calls, each ``ray.wait`` poll and ``ray.get`` timed and counted."""

        def wait(self, refs: list[Any], num_returns: int, timeout: float) -> list[Any]:
            ledger.counts["polls"] += 1
            ledger.counts["polled_refs"] += len(refs)
            with ledger.timing("wait"):
                return super().wait(refs, num_returns, timeout)

        def get(self, ref: Any) -> Any:
            with ledger.timing("get"):
                value = super().get(ref)
            ledger.counts["received_bytes"] += wire_bytes(value)
            return value

    class TimedPool(ActorPool):
        def dispatch(self, broadcast: Any) -> Any:
            with ledger.timing("dispatch"):
                return super().dispatch(broadcast)

    class TimedCoordinator(Coordinator):
        def __init__(self) -> None:
            super().__init__(config, run_dir, on_iteration=on_iteration)
            real = actor_calls(config)
            self.pool = TimedPool(config, self.reporter, lambda: self.signals.received is not None,
                                  TimedCalls(real.start))
            self.reporter.iteration = ledger.timed("report", self.reporter.iteration)  # type: ignore[method-assign]

        def start(self) -> None:
            super().start()
            (learners,) = self.learners.values()  # the benchmark's one policy
            if learners.local is None:  # learner processes (--learners): their update is not the driver's
                return
            trainer = learners.local.trainer

            def train_on(segments: list[Any], lr_clock: float, version: int) -> Any:  # Trainer.train_on, timed
                with ledger.timing("batch"):
                    batch = build_batch(segments, trainer.config.gamma, trainer.config.gae_lambda, trainer.device,
                                        trainer.value_normalizer)
                with ledger.timing("sgd"):
                    return trainer.update(batch, lr_clock, version)

            trainer.train_on = train_on  # type: ignore[method-assign]

        def _account(self, gathered: Any, stats: Any, timer: Any) -> Any:
            with ledger.timing("bookkeeping"):
                return super()._account(gathered, stats, timer)

    return TimedCoordinator()


def wire_bytes(value: Any) -> int:
    """Bytes ``value`` takes serialized as Ray moves it (pickle protocol 5, large arrays as buffers of their own)."""
    buffers: list[pickle.PickleBuffer] = []
    body = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    return len(body) + sum(buffer.raw().nbytes for buffer in buffers)


def driver_config(env_id: str, actors: int, envs_per_actor: int, segment_length: int, actor_cpus: float,
                  iterations: int, run_dir: Path, inference: str = "actor", learners: int = 1) -> Config:
    """Tiny actors and a negligible update (an 8-unit MLP, 1 epoch, one minibatch): the iteration is the driver's.
    One warm-up iteration before the timed ones; no checkpoint until the end, no evaluation; the run waits for all
    N actors at start. Bad values (an N over run.actors' limit, an odd E with the server) are a usage error here,
    before Ray starts."""
    from dppo.distributed.inference_choice import resolve_inference

    batch = actors * envs_per_actor * segment_length
    sets = ["model.hidden_sizes=[8]", "ppo.epochs=1", f"run.actor_cpus={actor_cpus}",  # one minibatch: bench_config
            f"run.total_steps={batch * (iterations + 1)}", f"run.run_dir={run_dir}",
            f"run.checkpoint_every={iterations + 2}", "run.log_format=none", "run.device=cpu", "run.eval_every=0",
            f"run.inference={inference}", f"run.learners={learners}",
            # every round with all N actors, however slow they start (one node starts a few worker processes at once)
            f"faults.actor_start_timeout_s={START_TIMEOUT_S}"]
    return resolve_inference(bench_config(env_id, envs_per_actor, segment_length, 0.0, "sync", actors=actors,
                                          sets=sets))


def actor_pids(handles: list[Any]) -> list[int]:
    import ray

    return ray.get([h.pid.remote() for h in handles])


def actor_memory_mib(pids: list[int]) -> tuple[float, float]:
    """Mean RSS and PSS (shared pages shared out) of the actors' processes, MiB."""
    rss = [read_kib(f"/proc/{p}/status", "VmRSS:") / 1024 for p in pids]
    pss = [read_kib(f"/proc/{p}/smaps_rollup", "Pss:") / 1024 for p in pids]
    return round(statistics.fmean(rss), 1), round(statistics.fmean(pss), 1)


def wait_gone(pids: list[int], timeout_s: float = 120.0) -> None:
    """Until the killed actors' processes have exited (``ray.kill`` returns first), so the next N's memory check
    sees their memory free; at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while any(Path(f"/proc/{p}").exists() for p in pids) and time.monotonic() < deadline:
        time.sleep(0.5)


def idle_actor_memory(env_id: str, envs_per_actor: int, segment_length: int) -> tuple[float, float]:
    """RSS and PSS of one idle dppo actor, its envs made: what each of N more actors costs this machine."""
    import ray

    from dppo.distributed.actor import start_actor

    config = bench_config(env_id, envs_per_actor, segment_length, 0.0, "sync")
    config.run.actor_cpus = 0.01
    handle = start_actor(config, 0, 1)
    pids: list[int] = []
    try:
        ray.get(handle.ready.remote())
        pids = actor_pids([handle])
        return actor_memory_mib(pids)
    finally:
        ray.kill(handle, no_restart=True)
        wait_gone(pids)


def poll_us(count: int, repeats: int = 50) -> float:
    """Median microseconds of one ``ray.wait(refs, num_returns=1)`` over ``count`` objects that are all ready: the
    driver's cost of one poll of the gather, which makes one per arriving segment over the refs still pending."""
    import ray

    refs = [ray.put(i) for i in range(count)]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        ray.wait(refs, num_returns=1, timeout=0)
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1e6, 1)


def gather_polls_ms(count: int) -> float:
    """Milliseconds of a gather's polls alone when it polls once per arrival over the refs still pending (its first
    version: ``count`` + ... + 1 refs, N²), every object ready in the driver's store, without actors."""
    import ray

    refs = [ray.put(i) for i in range(count)]
    start = time.perf_counter()
    for pending in range(count, 0, -1):
        ray.wait(refs[:pending], num_returns=1, timeout=0)
    return round((time.perf_counter() - start) * 1e3, 1)


def _median_ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1e3, 2)


def measure(config: Config, iterations: int) -> Row:
    """Start the run's actors (timed), run 1 + ``iterations`` iterations, and the medians of the timed ones."""
    ledger = Ledger()
    per_iteration: list[dict[str, float]] = []
    mark = {"t": time.perf_counter(), "cpu": _cpu_s()}

    def on_iteration(record: dict[str, Any], _checkpoint: Path | None) -> None:
        now, cpu = time.perf_counter(), _cpu_s()
        seconds, counts = ledger.take()
        per_iteration.append({"wall": now - mark["t"], "cpu": cpu - mark["cpu"], "sample": record["sample_s"],
                              **seconds, "sync": record["sync_s"], **counts, **served(coordinator.inference)})
        mark.update(t=time.perf_counter(), cpu=_cpu_s())  # reading the service's figures is the benchmark's time

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}  # the run installs its own
    coordinator = timed_coordinator(config, Path(config.run.run_dir or "."), ledger, on_iteration)
    pids: list[int] = []
    try:
        started = time.perf_counter()
        coordinator.start()
        startup_s = time.perf_counter() - started
        pids = actor_pids([coordinator.pool.membership.slots[i].handle for i in coordinator.pool.alive])
        rss, pss = actor_memory_mib(pids)
        coordinator.run_dir.path.mkdir(parents=True, exist_ok=True)
        ledger.take()
        mark.update(t=time.perf_counter(), cpu=_cpu_s())
        coordinator.run()
    finally:
        coordinator.shutdown()
        wait_gone(pids)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    timed = per_iteration[1:]  # the first iteration warms up (first weights, first calls)
    if not timed:
        raise RuntimeError("the run ended before its timed iterations")  # total_steps is set so it does not
    return {**summarize(config.run.actors, timed, startup_s, rss, pss), "inference": config.run.inference,
            "learners": config.run.learners}


def served(inference: Any) -> dict[str, float]:
    """This iteration's inference-service figures, per forward pass; none with the actors' own inference (or when
    the service did not answer)."""
    stats = {} if inference is None else inference.batch_stats()
    if not stats.get("batches"):
        return {"inference_batches": 0} if stats else {}
    return {"inference_batches": stats["batches"], "inference_rows": stats["rows_mean"],
            "inference_forward_ms": stats["forward_s_median"] * 1e3,
            "inference_queue_ms": stats["queue_s_median"] * 1e3}


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # every thread of the driver, Ray's core worker's included
    return usage.ru_utime + usage.ru_stime


def summarize(actors: int, timed: list[dict[str, float]], startup_s: float, rss: float, pss: float) -> Row:
    """One row: medians over the timed iterations; overhead = iteration - the slowest actor's sampling."""
    def med(key: str) -> float:
        return _median_ms([it[key] for it in timed])

    overhead = _median_ms([it["wall"] - it["sample"] for it in timed])
    row: Row = {
        "actors": actors, "iterations": len(timed), "startup_s": round(startup_s, 2),
        "iteration_ms": med("wall"), "sample_ms": med("sample"), "overhead_ms": overhead,
        "overhead_per_actor_ms": round(overhead / actors, 3), "driver_cpu_ms": med("cpu"),
        "broadcast_ms": _median_ms([it["sync"] + it["dispatch"] for it in timed]),
        "gather_wait_ms": med("wait"), "gather_get_ms": med("get"),
        "polls": statistics.median([it["polls"] for it in timed]),
        "polled_refs": statistics.median([it["polled_refs"] for it in timed]),
        "received_kib_per_actor": round(statistics.median([it["received_bytes"] for it in timed]) / actors / 1024, 3),
        "batch_ms": med("batch"), "sgd_ms": med("sgd"), "bookkeeping_ms": med("bookkeeping"),
        "report_ms": med("report"),
        "other_ms": _median_ms([it["wall"] - sum(it[p] for p in PIECES) for it in timed]),
        "actor_rss_mib": rss, "actor_pss_mib": pss,
    }
    for key in SERVED:
        values = [it[key] for it in timed if key in it]  # server rows only
        if values:
            row[key] = round(statistics.median(values), 3)
    return row


def available_gib() -> float:
    return read_kib("/proc/meminfo", "MemAvailable:") / 1024**2


def total_gib() -> float:
    return read_kib("/proc/meminfo", "MemTotal:") / 1024**2


def bench_driver(counts: list[int], env_id: str = "CartPole-v1", envs_per_actor: int = 1, segment_length: int = 8,
                 actor_cpus: float = 0.01, iterations: int = 20, address: str | None = None,
                 inference: tuple[str, ...] = ("actor",), log: Callable[[str], None] = print, learners: int = 1
                 ) -> tuple[list[Row], dict[str, float]]:
    """One row per N and ``inference`` mode (an N whose actors would not fit this machine's memory gets a row that
    says so instead); one idle actor's memory and the polls of a 1,000-segment gather."""
    rows: list[Row] = []
    cpus = max(2, math.ceil(max(counts) * actor_cpus + (learners if learners > 1 else 0)))  # a CPU per learner
    with ray_session(address, cpus):
        rss, pss = idle_actor_memory(env_id, envs_per_actor, segment_length)
        idle = {"rss_mib": rss, "pss_mib": pss, "polls_1000_ms": gather_polls_ms(1000)}
        log(f"one idle actor: RSS {rss:.0f} MiB, PSS {pss:.0f} MiB")
        per_actor = pss  # the largest PSS an actor has had so far (a sampling actor's exceeds an idle one's)
        for n, mode in ((n, mode) for n in counts for mode in inference):
            needed, free, kept = n * per_actor / 1024, available_gib(), MEMORY_MARGIN * total_gib()
            if needed > free - kept:
                rows.append({"actors": n, "inference": mode, "note": f"not run: {n} x {per_actor:.0f} MiB PSS = "
                             f"{needed:.1f} GiB, {free:.1f} GiB available less {kept:.1f} GiB kept free"})
                log(rows[-1]["note"])
                continue
            with tempfile.TemporaryDirectory(prefix="dppo-bench-driver-") as tmp:
                config = driver_config(env_id, n, envs_per_actor, segment_length, actor_cpus, iterations,
                                       Path(tmp) / "run", mode, learners)
                rows.append({**measure(config, iterations), "poll_us": poll_us(n)})
            per_actor = max(per_actor, rows[-1]["actor_pss_mib"])
            log(f"N={n}, inference {mode}: overhead {rows[-1]['overhead_ms']} ms, "
                f"start-up {rows[-1]['startup_s']} s")
    return rows, idle


def above_zero(text: str) -> float:
    """--actor-cpus: a float > 0 (Ray places an actor that reserves no CPU anywhere, which is not what is timed)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--actor-cpus {text!r} is not a number, e.g. 0.01") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"--actor-cpus must be > 0, e.g. 0.01; got {text}")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    """Add `dppo bench driver`."""
    parser = sub.add_parser("driver", help="how the driver's cost per iteration grows with the number of actors")
    parser.add_argument("--actors", default="16,32,64,128", help="comma-separated N values (default 16,32,64,128)")
    parser.add_argument("--iterations", type=positive(int, "--iterations"), default=20,
                        help="timed iterations per N, after one warm-up iteration (default 20)")
    parser.add_argument("--env", default="CartPole-v1", help="gymnasium env id (default CartPole-v1)")
    parser.add_argument("--envs-per-actor", type=positive(int, "--envs-per-actor"), default=1, help="E (default 1)")
    parser.add_argument("--segment-length", type=positive(int, "--segment-length"), default=8,
                        help="T (default 8)")
    parser.add_argument("--actor-cpus", type=above_zero, default=0.01,
                        help="Ray CPUs each actor reserves (default 0.01: all fit on one machine)")
    parser.add_argument("--learners", type=positive(int, "--learners"), default=1,
                        help="run.learners: above 1 the learners are processes that fetch the segments and the "
                             "driver reads their summaries only (default 1: the update in the driver)")
    parser.add_argument("--inference", default="actor",
                        help="comma-separated: actor (each actor's own forward pass), server (the inference service "
                             "batching every actor's, its batch figures as columns; run.inference) (default actor)")
    add_common_args(parser)
    parser.set_defaults(func=cmd_driver)


def cmd_driver(args: argparse.Namespace) -> int:
    counts = parse_counts(args.actors, "--actors")
    modes = tuple(m.strip() for m in args.inference.split(","))
    if not modes or any(m not in ("actor", "server") for m in modes):
        fail(f"--inference takes actor and/or server, comma-separated, not {args.inference!r}")
    env_id = check_env_id(args.env)
    for mode in modes:  # bad input is found before anything starts
        driver_config(env_id, max(counts), args.envs_per_actor, args.segment_length, args.actor_cpus,
                      args.iterations, Path("unused"), mode, args.learners)
    info = machine()
    rows, idle = bench_driver(counts, env_id, args.envs_per_actor, args.segment_length, args.actor_cpus,
                              args.iterations, args.address, modes, learners=args.learners)
    write_report(args, rows, idle, info)
    return 0
