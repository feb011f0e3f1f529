"""`dppo tune`: the fastest settings for an env, measured here (:mod:`dppo.tune`). By default each setting keeps the
config's batch and updates per sample (the same training, sooner); with ``--change-batch`` others too, judged by
time to the config's target return (:mod:`dppo.tune.score`). It prints the table behind them, the `dppo train` line
and a config file that holds them (in the user's cache dir unless ``--out``), and saves them for this machine, where
``run.inference: auto`` follows them."""

from __future__ import annotations

import argparse
import os
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dppo.cli_args import fail, import_from_cwd, positive

if TYPE_CHECKING:
    from dppo.config import Config
    from dppo.tune.grid import Candidate
    from dppo.tune.score import ScoreRun
    from dppo.tune.search import Result

COLUMNS = ["candidate", "batch", "screened_steps_per_s", "train_steps_per_s", "vs_config", "round_s", "sample_s",
           "update_s", "iterations", "rss_mib", "max_process_rss_mib", "gpu_mib", "measured_s", "status"]


def register(sub: argparse._SubParsersAction) -> None:
    tune = sub.add_parser(
        "tune", help="measure which settings train an env fastest on this machine or cluster",
        description="Trains the env briefly with each setting of the options (actors, envs per actor, where the "
        "policy runs: in the actors, in two halves, on a GPU share, in the inference service): each screened "
        "(its sampling rounds timed, an update timed per batch size), then the fastest few predicted trained, "
        "within --minutes; prints the table, the fastest settings as --set lines and a config "
        "file, and saves them for this machine (run.inference: auto follows them).")
    tune.add_argument("--env", help="registered env id (its preset), when no --config")
    tune.add_argument("--config", help="YAML config to start from (its settings are the first candidate)")
    tune.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                      help="a config key for every candidate (repeatable)")
    tune.add_argument("--minutes", type=positive(float, "--minutes"), default=5.0,
                      help="the time budget, start-ups included (default 5)")
    tune.add_argument("--actors", help="comma-separated actor counts (default 1, 2, 4, ... up to the cluster's CPUs)")
    tune.add_argument("--envs-per-actor", help="comma-separated (default: the config's, halved and doubled)")
    tune.add_argument("--segment-lengths", help="comma-separated (default: the config's only; it changes learning)")
    tune.add_argument("--change-batch", action="store_true",
                      help="also settings whose batch (actors x envs x T) is not the config's: another training, "
                      "so the finalists and the config's own then train to its target return and the soonest there "
                      "is the answer (default: every setting keeps the batch and its updates per sample)")
    tune.add_argument("--score-minutes", type=positive(float, "--score-minutes"), default=5.0,
                      help="with --change-batch: minutes of training each run to the target return gets (default 5)")
    tune.add_argument("--placements", help="comma-separated, of actor, halves, gpu, gpu-halves, server "
                      "(default: every one the config and the cluster allow)")
    tune.add_argument("--actor-cpus", help="comma-separated CPUs per actor, also ale-py's threads (default: the "
                      "config's)")
    tune.add_argument("--finalists", type=positive(int, "--finalists"), default=3,
                      help="candidates trained again for the rest of the budget (default 3)")
    tune.add_argument("--max-rss-mib", type=positive(float, "--max-rss-mib"),
                      help="leave out settings whose processes hold more (summed RSS; default 80%% of memory)")
    tune.add_argument("--max-gpu-mib", type=positive(float, "--max-gpu-mib"),
                      help="leave out settings whose processes hold more GPU memory on this machine (summed, read "
                      "by nvidia-smi; default 90%% of the smallest GPU's)")
    tune.add_argument("--out", help="the config file of the fastest settings (default tune-<env>.yaml in the user's "
                      "cache dir, ~/.cache/dppo/tune or DPPO_TUNE_DIR)")
    tune.add_argument("--no-save", dest="save", action="store_false",
                      help="do not keep the result for run.inference: auto on this machine")
    tune.add_argument("--full-grid", type=positive(float, "--full-grid"), metavar="SECONDS",
                      help="train every candidate SECONDS instead, no budget (the reference a budgeted tune is "
                      "checked against)")
    tune.add_argument("--passes", type=positive(int, "--passes"), default=1,
                      help="with --full-grid: train every candidate this many times, in turn (a shared machine's "
                      "load drifts; default 1)")
    tune.add_argument("--only", metavar="NAMES", help="comma-separated candidates as the table names them (\"2x4 "
                      "T128 actor\"): measure just these, e.g. two settings head to head")
    tune.add_argument("--address", help="Ray cluster to join (default: RAY_ADDRESS, else a local Ray)")
    tune.add_argument("--json", metavar="FILE", help="write the rows as a JSON list to FILE")
    tune.add_argument("--write-docs", nargs="?", const="docs/benchmarks.md", metavar="FILE",
                      help="replace this tune's section of FILE (default docs/benchmarks.md)")
    tune.add_argument("--section", help="name of the docs section to replace (default: from the env)")
    tune.set_defaults(func=cmd_tune, bench_command="tune", program=["dppo"], typed=None)


def numbers(text: str | None, kind: type, flag: str) -> list[Any] | None:
    """A comma-separated list of positive numbers (None: not given); bad input is one line."""
    if text is None:
        return None
    try:
        values = [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or any(v <= 0 for v in values):
        fail(f"{flag} takes positive numbers, comma-separated, not {text!r}")
    return values


def cmd_tune(args: argparse.Namespace) -> int:
    import_from_cwd()
    if "tune" in sys.argv:  # the command line as typed, for the docs section
        args.typed = sys.argv[sys.argv.index("tune"):]
    from dppo.config import load_config
    from dppo.envs.checks import check_env
    from dppo.envs.make import with_agents
    from dppo.tune.grid import PLACEMENTS, grid, minibatches_per_epoch

    for flag, value in (("--minutes", args.minutes), ("--full-grid", args.full_grid),
                        ("--max-rss-mib", args.max_rss_mib), ("--max-gpu-mib", args.max_gpu_mib)):
        if value is not None and value <= 0:
            fail(f"{flag} must be above 0, not {value:g}")
    if args.passes > 1 and not args.full_grid:
        fail("--passes is for --full-grid (the budget decides how often a finalist is trained)")
    if bool(args.env) == bool(args.config):
        fail("dppo tune needs the env: pass --env ID (its preset) or --config FILE")
    places = None if args.placements is None else [p.strip() for p in args.placements.split(",") if p.strip()]
    if places is not None and (not places or set(places) - set(PLACEMENTS)):
        fail(f"--placements takes {', '.join(PLACEMENTS)}, comma-separated, not {args.placements!r}")
    options = {"actors": numbers(args.actors, int, "--actors"), "envs": numbers(args.envs_per_actor, int,
               "--envs-per-actor"), "segment_lengths": numbers(args.segment_lengths, int, "--segment-lengths"),
               "actor_cpus": numbers(args.actor_cpus, float, "--actor-cpus"), "places": places,
               "change_batch": args.change_batch}
    overrides = {"env.id": args.env, "run.address": args.address}
    base = load_config(args.config, overrides, args.sets)  # bad config: one line, exit 2
    if args.change_batch and base.run.target_return is None:
        fail("--change-batch judges settings by time to the config's target return, and it has none; pass --set "
             "run.target_return=R")
    check_env(with_agents(base))  # the env can be made, reset and stepped, before anything is measured
    minibatches = minibatches_per_epoch(base)

    def configure(candidate: Candidate) -> Config:
        return load_config(args.config, overrides, [*args.sets, *candidate.sets(minibatches)])

    out = Path(args.out) if args.out else default_out(base.env.name)
    if out.exists() and out.is_dir():
        fail(f"--out {str(out)!r} is a directory; name a file")
    import ray

    from dppo.bench.memory import smallest_gpu_mib
    from dppo.distributed.cluster import connect_ray
    from dppo.tune.search import search

    os.environ.setdefault("RAY_IGNORE_UNHANDLED_ERRORS", "1")
    connect_ray(base)
    try:
        cpus, gpus = cluster_size()
        candidates = grid(base, cpus, gpus, **options)
        if args.only is not None:
            candidates = only(candidates, args.only)
        if not candidates:
            batch = f"{base.run.actors} x {base.env.num_envs} x {base.ppo.segment_length} = {base.batch_size:,}"
            fail("no candidate fits these options on this cluster (each actor's CPUs times the actors must fit "
                 f"its {cpus:g} CPUs" + ("" if args.change_batch else f", and actors x envs x T must keep the "
                                         f"config's batch, {batch}") + "); widen --actors or --actor-cpus"
                 + ("" if args.change_batch else ", or pass --change-batch"))
        budget = args.minutes * 60
        max_rss = args.max_rss_mib or 0.8 * total_memory_mib()
        max_gpu = args.max_gpu_mib or (0.9 * gpu if (gpu := smallest_gpu_mib()) else None)
        print(f"tune: {base.env.name}, {len(candidates)} candidates on {cpus:g} CPUs"
              + (f" and {gpus:g} GPUs" if gpus else "") + (f", {args.full_grid:g} s each" if args.full_grid
                                                             else f", {args.minutes:g} minutes"), flush=True)
        results = search(configure, candidates, budget, args.finalists, max_rss, full_seconds=args.full_grid,
                         max_gpu_mib=max_gpu, passes=args.passes)
        scores = to_target(args, base, configure, results, out) if args.change_batch else None
    finally:
        ray.shutdown()
    return report(args, base, configure, results, out, minibatches, scores)


def default_out(env_name: str) -> Path:
    """The config file's default place: the user's cache dir, beside the result kept for this machine."""
    from dppo.config.tuned import tune_dir

    return tune_dir() / f"tune-{env_name.replace('/', '_').replace(':', '_')}.yaml"


def to_target(args: argparse.Namespace, base: Config, configure: Any, results: list[Result], out: Path
              ) -> list[ScoreRun]:
    """--change-batch: the finalists and the config's own trained to its target return, soonest first; their runs
    beside the config file (``<out>.runs/``)."""
    import ray

    from dppo.tune.score import judge

    target = base.run.target_return
    assert target is not None  # checked with the options
    print(f"tune: judging by time to the target return {target:g} (at most {args.score_minutes:g} min each)",
          flush=True)
    return judge(lambda r: configure(r.candidate), results, own_result(base, results), args.finalists, target,
                 args.score_minutes * 60, out.with_suffix(".runs"), ray.get_runtime_context().gcs_address)


def own_result(base: Config, results: list[Result]) -> Result | None:
    """The result of the config's own setting, when it is a candidate."""
    from dppo.tune.grid import placement_of

    return next((r for r in results if r.candidate.placement == placement_of(base)
                 and (r.candidate.actors, r.candidate.envs_per_actor, r.candidate.segment_length)
                 == (base.run.actors, base.env.num_envs, base.ppo.segment_length)), None)


def only(candidates: list[Candidate], names: str) -> list[Candidate]:
    """The candidates ``names`` (comma-separated, as the table names them), in that order; one the options and the
    cluster do not allow is bad input."""
    by_name = {c.name: c for c in candidates}
    wanted = [" ".join(name.split()) for name in names.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in by_name]
    if unknown or not wanted:
        fail(f"--only: {', '.join(repr(n) for n in unknown) or 'no name'} is not a candidate here; name them as the "
             f"table does, e.g. {next(iter(by_name), '2x4 T128 actor')!r}")
    return [by_name[name] for name in dict.fromkeys(wanted)]


def cluster_size() -> tuple[float, float]:
    """The cluster's CPUs, and the most GPUs any one node has (a share must fit on one node)."""
    import ray

    cpus = ray.cluster_resources().get("CPU", 1.0)
    gpus = max((node["Resources"].get("GPU", 0.0) for node in ray.nodes() if node["Alive"]), default=0.0)
    return cpus, gpus


def total_memory_mib() -> float:
    from dppo.bench.memory import read_kib

    return read_kib("/proc/meminfo", "MemTotal:") / 1024 or float("inf")


def report(args: argparse.Namespace, base: Config, configure: Any, results: list[Result], out: Path,
           minibatches: int, scores: list[ScoreRun] | None) -> int:
    """The table; the fastest settings (with --change-batch: the soonest to the target) as --set lines and a config
    file; saved for this machine."""
    from dppo.bench.docs import emit
    from dppo.config.tuned import save

    own = own_result(base, results)
    to_target_s = {id(s.result): s.to_target_s for s in scores or []}
    rows = [row(r, own) | ({"to_target_s": to_target_s.get(id(r))} if scores is not None else {}) for r in results]
    best = next((r for r in results if r.skipped is None and r.steps_per_s > 0), None)
    if scores is not None:
        best = next((s.result for s in scores if s.to_target_s is not None), None)
        if best is None:
            print(f"dppo: error: no setting reached the target return {base.run.target_return:g} within "
                  f"--score-minutes {args.score_minutes:g}; raise it, or tune without --change-batch",
                  file=sys.stderr, flush=True)
    times = f", {args.passes} times in turn" if args.passes > 1 else ""
    how = (f"every candidate trained {args.full_grid:g} s (after a warm-up iteration){times} by the Coordinator "
           "`dppo train` runs" if args.full_grid else "each candidate screened (started by the Coordinator `dppo "
           "train` runs, a sampling round to warm up, then timed rounds, at least two and as many as a second holds, "
           "and updates timed once per batch size the same way), nearest the fastest predicted first; the fastest "
           "few predicted then trained for the rest of the budget, in turn (twice over when start-ups are short)")
    note = (f"`dppo tune`: {how}; `screened_steps_per_s`: the training speed a screen predicts (a round's env steps "
            "over its `round_s` and its batch's update; a batch whose update was not timed: the nearest batch's, "
            "scaled); `train_steps_per_s`: env steps per second of training measured (the timed iterations, "
            "sampling and update); `vs_config`: over the config's own setting (trained over trained, else "
            "screened over screened); `round_s`: a screen's median round (weights out, segments in); `sample_s`, "
            "`update_s`: medians per iteration of training (update_s of one only screened: its timed update); "
            "`rss_mib`: the process tree's peak summed RSS (Ray's processes included); `gpu_mib`: the peak GPU "
            "memory its processes held on this machine (nvidia-smi; - without a GPU); `measured_s`: every look, "
            "start-ups included.")
    key = args.section or f"tune-{base.env.name.split('/')[-1]}" + ("-full-grid" if args.full_grid else "")
    from dppo.bench.common import machine

    title = f"dppo tune, {base.env.name}" + (f", every candidate {args.full_grid:g} s{times}" if args.full_grid
                                             else f", {args.minutes:g} minutes")
    emit(args, rows, COLUMNS + (["to_target_s"] if scores is not None else []), key, title, note, machine())
    if best is None:
        if scores is None:
            print("dppo: error: no candidate could be measured (each row says why)", file=sys.stderr, flush=True)
        return 1
    chosen = configure(best.candidate)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(chosen.to_yaml())
    sets = " ".join(f"--set {line}" for line in best.candidate.sets(minibatches))
    env = f"--config {args.config}" if args.config else f"--env {base.env.name}"
    if scores is not None:
        first = next(s for s in scores if s.result is best)
        mine = next((s for s in scores if s.result is own), None)
        print(f"soonest to the target return {base.run.target_return:g}: {best.candidate.name}, in "
              f"{first.to_target_s:.1f} s of training" + ("" if mine is None or mine is first else
                                                           " (the config's own: " + (f"{mine.to_target_s:.1f} s)"
                                                           if mine.to_target_s is not None else "not reached)")))
    else:
        print(f"fastest: {best.candidate.name}, {best.steps_per_s:,.0f} env steps/s of training" + versus(best, own))
    train = " ".join(["dppo train", env, *(f"--set {line}" for line in args.sets), sets])
    print(f"  dppo train --config {out}\n  {train}", flush=True)
    if args.save:
        at = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        path = save(base.env.name, {"at": at, "candidate": best.candidate.name, "config": str(out.resolve()),
                                    "settings": dict(line.split("=", 1) for line in best.candidate.sets(None)),
                                    "train_steps_per_s": round(best.steps_per_s, 1), "rows": rows})
        print(f"saved for run.inference: auto on this machine: {path}", flush=True)
    return 0


def versus(best: Result, own: Result | None) -> str:
    """How the answer compares with the config's own setting: by training when both trained, else as screened."""
    if own is None or own is best:
        return ""
    if own.steps_per_s:
        return f" ({best.steps_per_s / own.steps_per_s:.2f}x the config's own)"
    return f" ({best.predicted / own.predicted:.2f}x the config's own, as screened)" if own.predicted else ""


def row(result: Result, own: Result | None) -> dict[str, Any]:
    trained, screened = result.trained, result.screened
    figures: dict[str, Any] = {}
    if screened is not None and not screened.error:
        figures.update(round_s=round(screened.round_median_s, 3), update_s=screened.update_s and
                       round(screened.update_s, 3), rss_mib=round(screened.rss_mib),
                       max_process_rss_mib=round(screened.process_rss_mib),
                       gpu_mib=None if screened.gpu_mib is None else round(screened.gpu_mib))
    if trained is not None and not trained.error:
        measured = trained.row()
        for key in ("rss_mib", "max_process_rss_mib", "gpu_mib"):
            measured[key] = max((v for v in (measured[key], figures.get(key)) if v is not None), default=None)
        figures.update(measured)
    looks = [look.wall_s for look in (screened, trained) if look is not None]
    figures["measured_s"] = round(sum(looks), 1) if looks else None
    ratio = None
    if own is not None and own.steps_per_s and result.steps_per_s:
        ratio = round(result.steps_per_s / own.steps_per_s, 3)
    elif own is not None and own.predicted and result.predicted:
        ratio = round(result.predicted / own.predicted, 3)
    return {"candidate": result.candidate.name, "batch": result.candidate.batch,
            "screened_steps_per_s": round(result.predicted, 1) if result.predicted else None, **figures,
            "vs_config": ratio, "status": result.status}
