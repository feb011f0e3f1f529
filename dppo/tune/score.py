"""`dppo tune --change-batch`: a candidate with another batch is not the same training sooner but another training,
so speed does not judge it: the finalists (and the config's own setting) each train to the config's target return,
a `dppo train` run cut at a time limit, and the soonest there by its training seconds is the answer (as `dppo bench
score` times a run: the first iteration whose 100-episode mean return reached it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dppo.bench.runs import run_train
from dppo.bench.score import time_to_scores
from dppo.config import Config
from dppo.errors import UsageError
from dppo.run.run_dir import RunDir
from dppo.tune.search import Result


@dataclass
class ScoreRun:
    """A candidate's run to the target: training seconds and env steps when it first reached it (None: not)."""

    result: Result
    to_target_s: float | None = None
    env_steps: int | None = None
    final_return: float | None = None
    error: str | None = None


def contenders(results: list[Result], own: Result | None, finalists: int) -> list[Result]:
    """The fastest ``finalists`` trained, and the config's own setting (the answer must beat it to be one)."""
    trained = [r for r in results if r.steps_per_s > 0 and r.skipped is None][:finalists]
    return trained + ([own] if own is not None and own not in trained and own.error is None else [])


def judge(configure: Callable[[Result], Config], results: list[Result], own: Result | None, finalists: int,
          target: float, limit_s: float, out_dir: Path, address: str | None,
          say: Callable[[str], None] = print) -> list[ScoreRun]:
    """Each contender trained to ``target`` (at most ``limit_s`` seconds of training), its run dir under
    ``out_dir``; the soonest first, then those that did not get there by their final return."""
    runs = []
    for i, result in enumerate(contenders(results, own, finalists), start=1):
        config_file, run_dir = out_dir / f"{i}.yaml", out_dir / f"run-{i}"
        config_file.parent.mkdir(parents=True, exist_ok=True)
        config_file.write_text(configure(result).to_yaml())
        argv = ["--config", str(config_file), "--set", f"run.time_limit_s={limit_s:g}", "--no-tensorboard",
                "--log-format", "none", *(["--address", address] if address else [])]
        score = ScoreRun(result)
        try:
            run = run_train(argv, run_dir, timeout_s=limit_s * 3 + 300)
        except (RuntimeError, UsageError) as err:
            score.error = str(err)
        else:
            reached = time_to_scores(RunDir(run_dir).read_progress(), [target])[f"{target:g}"]
            score.final_return, score.env_steps = run["episode_return_mean"], run["env_steps"]
            if reached is not None:
                score.to_target_s, score.env_steps = reached["wall_s"], int(reached["env_steps"])
        say(f"to the target {target:g}: {result.candidate.name} " + (
            f"failed: {score.error}" if score.error else
            f"in {score.to_target_s:.1f} s of training, {score.env_steps:,} env steps" if score.to_target_s is not None
            else f"not in {limit_s:g} s (final return {score.final_return})"))
        runs.append(score)
    return sorted(runs, key=lambda s: (s.error is not None, s.to_target_s is None, s.to_target_s or 0.0,
                                       -(s.final_return if s.final_return is not None else float("-inf"))))
