"""`dppo sweep`: many dppo runs on one Ray cluster, searched and scheduled by Ray Tune (:mod:`dppo.sweep`)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dppo.cli_args import fail, import_from_cwd


def register(sub: argparse._SubParsersAction) -> None:
    sw = sub.add_parser("sweep", help="many trainings at once with Ray Tune: search, ASHA, population-based training",
                        description="Runs the trials of a sweep file (see docs/sweeps.md), each a full dppo "
                        "run in <out-dir>/trials/<trial>, and writes trials.csv, trials.md, trials.png and "
                        "best-config.yaml into <out-dir>.")
    sw.add_argument("--config", required=True, help="the sweep file (YAML)")
    sw.add_argument("--out-dir", type=Path, help="the sweep directory (default runs/<name>-<timestamp>)")
    sw.add_argument("--resume", action="store_true", help="continue the sweep in --out-dir: finished trials are kept")
    sw.add_argument("--auto-resume", action="store_true",
                    help="continue the sweep in --out-dir if there is one, else start it (a retried Kubernetes job)")
    sw.add_argument("--metrics-port", type=int, help="serve every trial's metrics (label trial) on this port "
                    "(the sweep file's metrics.port; 0: off)")
    sw.add_argument("--address", help="Ray cluster to join (default: RAY_ADDRESS, else a local Ray)")
    sw.set_defaults(func=cmd_sweep)


def cmd_sweep(args: argparse.Namespace) -> int:
    import_from_cwd()
    from dppo.sweep.spec import load_sweep

    sweep = load_sweep(args.config, args.metrics_port)  # every problem: one line, exit 2, nothing written
    if (args.resume or args.auto_resume) and args.out_dir is None:
        fail("--resume and --auto-resume need the sweep to continue: pass --out-dir DIR")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    sweep_dir = (args.out_dir or Path("runs") / f"{sweep.spec.name}-{stamp}").resolve()
    resume = args.resume or (args.auto_resume and (sweep_dir / "tune").is_dir())
    if resume and not (sweep_dir / "tune").is_dir():
        fail(f"--resume: no sweep in {str(sweep_dir)!r}; start it without --resume")
    if not resume and (sweep_dir / "tune").exists():
        fail(f"{str(sweep_dir)!r} already holds a sweep; pass --resume to continue it or another --out-dir")
    metrics = sweep.spec.metrics
    from dppo.envs.checks import check_env
    from dppo.run.metrics import check_port

    if metrics.port:
        check_port(metrics.host, metrics.port)
    from dppo.envs.make import with_agents

    base = with_agents(sweep.trial_config({}))
    spaces = check_env(base)  # the env can be made, reset and stepped, before any trial starts
    from dppo.rl.build import check_own_network

    check_own_network(base.model, spaces.values())
    os.environ.setdefault("RAY_IGNORE_UNHANDLED_ERRORS", "1")
    from dppo.distributed.cluster import connect_ray
    from dppo.sweep.capacity import concurrency_note, trial_needs
    from dppo.sweep.metrics import TrialMetrics
    from dppo.sweep.trainable import trial_bundles

    joined = args.address or base.run.address or os.environ.get("RAY_ADDRESS")
    base.run.address = args.address or base.run.address
    bundles = trial_bundles(sweep)
    connect_ray(base, min_cpus=trial_needs(bundles).get("CPU", 0.0))  # a local Ray fits one trial at least
    import ray

    note = concurrency_note(sweep, bundles, ray.cluster_resources(), local=not joined)
    if note:
        print(note, file=sys.stderr, flush=True)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    if base.run.tensorboard:  # where the curves are (not Tune's state folder, <out-dir>/tune)
        print(f"each trial's TensorBoard curves: tensorboard --logdir {sweep_dir / 'trials'}", file=sys.stderr,
              flush=True)
    served = TrialMetrics(sweep.spec.name, base.env.name)
    if metrics.port:
        port = served.serve(metrics.port, metrics.host)
        print(f"sweep metrics on http://{metrics.host}:{port}/metrics", file=sys.stderr, flush=True)
    try:
        grid = run_tuner(sweep, sweep_dir, resume, served)
        from dppo.sweep.results import trial_rows, write_results

        rows = trial_rows(sweep_dir, grid, sweep.spec.metric)
        best = write_results(sweep, sweep_dir, rows)
        failed = [r for r in rows if r["state"] == "ERROR"]
        from dppo.run.logs import counted

        print(f"sweep {sweep.spec.name!r}: {counted(len(rows), 'trial')}, {len(failed)} failed -> "
              f"{sweep_dir / 'trials.md'}"
              + (f"; best config {best}" if best else ""), flush=True)
        if metrics.port and metrics.linger_s > 0:
            time.sleep(metrics.linger_s)  # let Prometheus scrape the final values
    finally:
        served.shutdown()
    return 0


def run_tuner(sweep: Any, sweep_dir: Path, resume: bool, metrics: Any) -> Any:
    """Tune's Tuner over the trials (restored from sweep_dir/tune with --resume); ``metrics``: the TrialMetrics
    callback (a restored sweep gets it back from its pickled run config, see TrialMetrics.__reduce__)."""
    from ray import tune

    from dppo.sweep.events import TrialEvents, silence_tune
    from dppo.sweep.schedulers import make_scheduler
    from dppo.sweep.trainable import run_trial, trial_resources

    silence_tune()

    trainable = tune.with_resources(tune.with_parameters(run_trial, sweep=sweep, sweep_dir=str(sweep_dir)),
                                    trial_resources(sweep))
    if resume:
        return tune.Tuner.restore(str(sweep_dir / "tune"), trainable, resume_unfinished=True,
                                  restart_errored=False).fit()
    spec = sweep.spec
    tuner = tune.Tuner(
        trainable, param_space={k: d.tune_domain() for k, d in sweep.space.items()},
        tune_config=tune.TuneConfig(metric=spec.metric, mode="max", num_samples=spec.trials,
                                    max_concurrent_trials=spec.concurrent, scheduler=make_scheduler(sweep)),
        run_config=tune.RunConfig(name="tune", storage_path=str(sweep_dir), verbose=0,
                                  callbacks=[TrialEvents(), metrics],
                                  failure_config=tune.FailureConfig(max_failures=0)))
    return tuner.fit()
