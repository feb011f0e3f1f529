"""The coordinator: the driver of one training run. ``Coordinator.run`` is the whole PPO iteration on one page.

Each iteration: broadcast the weights and normalizer statistics once; every actor samples and the segments
are gathered as they arrive (dead actors replaced); the learner group updates; the record goes to every
sink; a checkpoint every ``run.checkpoint_every`` iterations. Each phase is timed by name. The pieces it
drives live beside it: the actors (:mod:`dppo.distributed.actor_pool`), the learners
(:mod:`dppo.distributed.learner_group`), the run's state (:mod:`dppo.run.state`), its files
(:mod:`dppo.run.run_dir`) and its sinks (:mod:`dppo.run.reporting`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dppo.config import Config
from dppo.distributed.actor_pool import ActorPool, Gathered, Round, Stop
from dppo.distributed.broadcast import Broadcast, PolicyBroadcasts, SnapshotRefs, broadcast_arg
from dppo.distributed.deadlines import Hangs
from dppo.distributed.evaluation import FINISH_WAIT_S, EvalResult, Evaluation, EvaluationStopped
from dppo.distributed.inference_choice import choose_inference, resolve_inference
from dppo.distributed.learner_group import LearnerDied, LearnerGroup, LearnerHung
from dppo.distributed.membership import actor_calls
from dppo.distributed.restarts import RestartBudget
from dppo.distributed.service_supervisor import ServiceHung, ServiceSupervisor, lost_service
from dppo.envs.make import check_self_play, env_spec, with_agents
from dppo.errors import RunFailure
from dppo.rl.build import build_model
from dppo.rl.ppo import TrainStats
from dppo.rl.sampler import EnvFailure
from dppo.rl.segment import Segment
from dppo.run.callbacks import Callback, Callbacks, resolve_callbacks
from dppo.run.checkpoint import CheckpointStore, compose, compose_best, policy_entry
from dppo.run.league import League
from dppo.run.logs import counted
from dppo.run.reporting import Reporter, progress_record, sampling_phases
from dppo.run.run_dir import RunDir, strict_json
from dppo.run.signals import StopSignals
from dppo.run.state import RunState
from dppo.run.timing import PhaseTimer
from dppo.run.trained import load_weights


class Coordinator:
    """The driver of a run: owns the run's state, files and sinks, and drives the actors and the learners."""

    def __init__(self, config: Config, run_dir: Path, resume: dict[str, Any] | None = None,
                 on_iteration: Callable[[dict[str, Any], Path | None], None] | None = None,
                 callbacks: list[Callback] | None = None) -> None:
        """``on_iteration``: called with each progress record and the checkpoint written that iteration, if any
        (a sweep's trial reports both to Ray Tune); ``callbacks``: the user's, after run.callbacks' (dppo.train)."""
        config = self.config = with_agents(config)  # many agents: the batch counts each copy's agents
        self.on_iteration = on_iteration
        self.callbacks = Callbacks(resolve_callbacks(config, callbacks), config)
        self.stop_asked: str | None = None  # a callback's stop reason
        self.record_extra: dict[str, Any] = {}  # keys added to every progress record (a sweep's hyperparameters)
        torch.set_num_threads(config.run.learner_threads)  # before the model: its orthogonal init uses them
        torch.manual_seed(config.run.seed)  # the initial weights
        np.random.seed(config.run.seed)
        self.spec = env_spec(config)  # the env's kind, each policy's spaces, columns: what every actor is shipped
        self.models = {name: build_model(*spaces, config.model) for name, spaces in self.spec.spaces.items()}
        self.inference_reason = choose_inference(config)[1]  # how auto was decided (the ready line says it)
        config = self.config = resolve_inference(config)
        self.state = RunState(config, {name: model.obs_spec.vector_dim for name, model in self.models.items()})
        if self.spec.kind == "turn_based":
            check_self_play(config)
            self.state.league = League(config.selfplay)
        self.trainer_states: dict[str, Any] = dict.fromkeys(self.models)
        self.record: dict[str, Any] | None = None  # the last iteration's progress record, kept in its checkpoint
        if resume is not None:
            self.record = resume.get("progress")
            self.state.restore(resume)
            for name, model in self.models.items():
                entry = policy_entry(resume, name)
                self.trainer_states[name] = entry["trainer"]
                load_weights(model, entry)
        self.run_dir = RunDir(run_dir)
        self.store = CheckpointStore(self.run_dir.checkpoints, config.run.keep_checkpoints)
        self.reporter = Reporter(config, self.run_dir)
        self.signals = StopSignals()
        self.hangs = Hangs(config.faults, self.reporter)  # every wait's deadline; a hung process said and replaced
        self.pool = ActorPool(config, self.reporter, lambda: self.signals.received is not None,
                              actor_calls(config, self.spec), self.hangs)
        self.learners: dict[str, LearnerGroup] = {}  # each policy's
        self.inference: ServiceSupervisor | None = None  # the policy-inference service (run.inference=server)
        self.snapshot_refs = SnapshotRefs()  # self-play: each snapshot in the object store once
        self.evaluation = Evaluation(config, hangs=self.hangs, say=self.reporter.message)
        faults = config.faults
        self.learner_restarts = RestartBudget("learner", faults.max_learner_restarts, faults.restart_window_s)
        self.startup_s: dict[str, float] = {}  # start-up phases (set by `dppo train`), into summary.json
        self.first_iteration_s: float | None = None

    def start(self) -> None:
        """Start the learners and the actors; every actor has made its envs when this returns, so an env that
        cannot be made anywhere is bad input before anything is written."""
        self.learners = {name: LearnerGroup(self.config, *self.spec.spaces[name], model, self.trainer_states[name],
                                            self.hangs) for name, model in self.models.items()}
        if self.config.run.inference == "server":  # beside the learner, on its device (one policy)
            (name, learners), = self.learners.items()
            self.inference = ServiceSupervisor(self.config, *self.spec.spaces[name], learners.device,
                                               self.reporter.message, hangs=self.hangs)
            self.inference.start()
            self.pool.upstream = self.inference.check  # actors that wait on a hung service are not the ones hung
        self.pool.start()

    # ---- the loop ------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Train until a stop rule holds; returns the summary written to summary.json."""
        self._open()
        reason, ahead = None, None  # ahead: with run.overlap_sampling, the round sampling during the update
        try:
            while (reason := self._stop_reason()) is None:
                timer = PhaseTimer()
                with timer.phase("sync"):  # weights + normalizer stats, once per iteration
                    full = self._broadcast()
                    broadcast = broadcast_arg(full)
                    self.evaluation.submit(broadcast, self.state.counters.iteration, self.state.counters.env_steps)
                    sampling = broadcast if self.inference is None else self.inference.serve(full)
                with timer.phase("gather"):  # ray.wait as segments arrive; dead actors replaced
                    gathered = self._gather(ahead or self.pool.dispatch(sampling))
                    ahead = self.pool.dispatch(sampling) if self.config.run.overlap_sampling else None
                with timer.phase("update"):
                    stats = self._update(gathered)
                record, new_returns, phases = self._account(gathered, stats, timer)
                self._evaluated(record)
                self.record = record
                with timer.phase("checkpoint"):
                    if self.state.counters.iteration % self.config.run.checkpoint_every == 0:
                        self._checkpoint()
                record["checkpoint_s"] = phases["checkpoint"] = timer.seconds["checkpoint"]
                self.reporter.iteration(record, gathered.segments, new_returns, phases)
                checkpoint = self.store.newest_path(self.state.counters.iteration)
                if self.on_iteration is not None:
                    self.on_iteration(record, checkpoint)
                self.stop_asked = self.callbacks.after(record, self.run_dir.path, checkpoint)
        except Stop:
            reason = "signal"
        except (RunFailure, EnvFailure, LearnerDied) as err:
            if self.state.counters.iteration > 0:  # a run that trained keeps its work; one that never did, nothing
                self._checkpoint()
            self._finish("error")
            raise RunFailure(str(err), getattr(err, "details", None)) from err
        if self.state.counters.iteration > 0:  # stopped before its first round ended: nothing trained to keep
            self._final_evaluation()
            self._checkpoint()
        return self._finish(reason)

    # ---- a round apart (how `dppo tune` screens a setting: its sampling timed apart from its update) -------------
    def sample_round(self) -> Gathered:
        """One round sampled with the current weights, as an iteration sends and gathers it; nothing is trained,
        counted or recorded."""
        full = self._broadcast(round_=False)
        return self._gather(self.pool.dispatch(broadcast_arg(full) if self.inference is None
                                               else self.inference.serve(full)))

    def update_on(self, gathered: Gathered) -> None:
        """One update of the learners on ``gathered`` (the weights change; no progress record is written)."""
        self._update(gathered)

    # ---- phases --------------------------------------------------------------------------------------
    def _open(self) -> None:
        self.signals.install()
        iteration = self.state.counters.iteration
        if iteration > 0 and self.run_dir.truncate_progress(iteration) < iteration and self.record is not None:
            # killed between this checkpoint and its progress line: the line is in the checkpoint
            self.run_dir.append_progress(strict_json({**self.record, "checkpoint_s": None}))
        self.reporter.open(self.state)
        self.reporter.actors_changed(len(self.pool.alive), len(self.pool.pending))
        self.started = PhaseTimer()
        self.started.start -= self.state.counters.wall_s  # a resumed run's clock continues

    def _stop_reason(self) -> str | None:
        return (self.state.stop_reason() or self.stop_asked
                or ("signal" if self.signals.received is not None else None))

    def _broadcast(self, round_: bool = True) -> Broadcast | PolicyBroadcasts:
        """This round's weights and normalizer statistics: the one policy's, or each policy's by name (``round_``
        False: the run's final ones, which add no self-play snapshot)."""
        league, version = self.state.league, self.state.counters.policy_version
        weights = {name: learners.weights() for name, learners in self.learners.items()}
        if round_ and league is not None and league.due(self.state.counters.iteration):
            league.add(next(iter(weights.values())), self.state.counters.iteration)  # self-play: one policy
        pool = self.snapshot_refs.view(league.view()) if league is not None else None
        broadcasts = {name: Broadcast(weights[name], version, stats.obs_stats, stats.return_stats, pool)
                      for name, stats in self.state.policies.items()}
        return broadcasts if len(broadcasts) > 1 else next(iter(broadcasts.values()))

    def _gather(self, round_: Round) -> Gathered:
        """The round's segments; a round the inference service's loss or hang failed goes again to its replacement."""
        while True:
            try:
                return self.pool.gather(round_)
            except ServiceHung:
                assert self.inference is not None
                round_ = self.pool.dispatch(self.inference.again(round_.broadcast))
            except RunFailure as err:
                lost = None if self.inference is None else lost_service(err)
                if lost is None:
                    raise
                round_ = self.pool.dispatch(self.inference.recover(round_.broadcast, lost))

    def _update(self, gathered: Gathered) -> dict[str, TrainStats]:
        """Each policy's learner group updates on its segments."""
        stats = {}
        for name, learners in self.learners.items():
            mine = [(s, r) for s, r in zip(gathered.segments, gathered.refs, strict=True) if s.policy_name == name]
            stats[name] = self._update_policy(name, learners, [s for s, _ in mine], [r for _, r in mine])
        self.reporter.learner_timings([group.timings for group in self.learners.values()])
        self._check_update(sum(part.skipped_minibatches for part in stats.values()))
        return stats

    def _update_policy(self, name: str, learners: LearnerGroup, segments: list[Segment], refs: list[Any]
                       ) -> TrainStats:
        """One policy's update; a dead learner restarts its group (within the run's budget) and the update is
        retried on the same segments, with the optimizer state of the last checkpoint."""
        while True:
            try:
                return learners.update(segments, refs, self.state.lr_clock, self.state.counters.policy_version + 1)
            except LearnerDied as err:
                if not isinstance(err, LearnerHung):  # a hang was said and spent from the hangs' budget already
                    self.learner_restarts.spend(err)
                    whose = f" of policy {name}" if len(self.learners) > 1 else ""
                    self.reporter.message(f"{err}; restarting the {self.config.run.learners} learners{whose}")
                intact = self.store.newest_intact()
                learners.restart(policy_entry(intact[1], name)["trainer"] if intact else learners.fallback_state()[1])
                self.reporter.learner_restarted()

    def _check_update(self, skipped_minibatches: int) -> None:
        """NaN/Inf losses or gradients skip their minibatch; too many such updates in a row end the run."""
        if skipped_minibatches:
            self.reporter.update_skipped()
            self.reporter.message(f"update had {skipped_minibatches} NaN/Inf minibatches (skipped); "
                                  f"{self.state.counters.bad_updates_in_row + 1} in a row")
        self.state.count_update(skipped_minibatches)

    def _account(self, gathered: Gathered, stats: dict[str, TrainStats], timer: PhaseTimer
                 ) -> tuple[dict[str, Any], list[float], dict[str, float]]:
        """Count the iteration into the run's state; its progress record, new episode returns and phases."""
        steps, new_returns = self.state.absorb(gathered.segments)
        if self.first_iteration_s is None:  # this process's first round: first weights, first segments
            self.first_iteration_s = round(timer.elapsed(), 3)
        self.state.counters.wall_s = self.started.elapsed()
        sampling = sampling_phases(gathered.segments)
        phases = {"sync": timer.seconds["sync"], "sample": sampling["sample"],
                  "wait": max(0.0, timer.seconds["gather"] - sampling["sample"]), "update": timer.seconds["update"],
                  "env": sampling["env"], "inference": sampling["inference"]}
        record = progress_record(self.state, gathered.segments, steps, stats, phases, timer.elapsed())
        record["hangs"] = self.reporter.faults.hangs
        if self.state.league is not None:
            games = [s.match_results for s in gathered.segments if s.match_results is not None]
            record.update(self.state.league.record(np.concatenate(games) if games else np.zeros((0, 2))))
        return {**record, **self.record_extra}, new_returns, phases

    def _evaluated(self, record: dict[str, Any]) -> None:
        """A finished evaluation into this iteration's record; its weights to best.pt when they are the best."""
        try:
            result = self.evaluation.collect()
        except EvaluationStopped as err:
            self.reporter.message(str(err))
            return
        if result is not None:
            record.update(result.record())
            if self.state.count_evaluation(result.mean, result.env_steps):
                self._save_best(result, record)

    def _final_evaluation(self) -> None:
        """With run.eval_every, the run's end waits for the evaluation in flight and evaluates the final weights, so
        summary.json and the final checkpoint hold the evaluation of what was saved; a stop signal skips it."""
        if not self.evaluation.on or self.signals.received is not None:
            return
        c = self.state.counters
        self.reporter.message(f"evaluating the final weights ({counted(self.config.run.eval_episodes, 'episode')}) "
                              "for summary.json; a stop signal skips it")
        try:
            results = self.evaluation.finish(self._broadcast(round_=False), c.iteration, c.env_steps,
                                             lambda: self.signals.received is not None)
        except EvaluationStopped as err:
            self.reporter.message(str(err))
            return
        for result in results:
            record = result.record()
            self.reporter.evaluated_at_end(record, c.env_steps)
            if self.state.count_evaluation(result.mean, result.env_steps):
                self._save_best(result, {**(self.record or {}), **record})
        if self.evaluation.in_flight is not None:
            _, _, steps, _ = self.evaluation.in_flight
            self.reporter.message(f"the evaluation of the weights at {steps:,} env steps did not finish "
                                  + ("before the stop signal" if self.signals.received is not None
                                     else f"in {FINISH_WAIT_S:.0f} s") + "; summary.json keeps the last that did")

    def _save_best(self, result: EvalResult, record: dict[str, Any]) -> None:
        """best.pt: the evaluated weights with the statistics they were evaluated with, in the checkpoint format."""
        self.store.save_best(compose_best(self.state, result.broadcast, record))

    def _checkpoint(self) -> None:
        """Save the newest checkpoint (unless this iteration's is on disk already)."""
        iteration = self.state.counters.iteration
        if self.store.has(iteration):
            return
        models, trainers = {}, {}
        for name, learners in self.learners.items():
            try:
                models[name], trainers[name] = learners.state()
            except LearnerDied as err:
                self.reporter.message("learner 0 is gone: the checkpoint keeps the optimizer state the learners last "
                                      "loaded")
                models[name], trainers[name] = learners.fallback_state()
                if isinstance(err, LearnerHung):  # killed: the next update needs a group
                    learners.restart(trainers[name])
                    self.reporter.learner_restarted()
        path = self.store.save(compose(self.state, models, trainers, self.record), iteration)
        self.reporter.checkpoint_written(path)

    def _finish(self, reason: str) -> dict[str, Any]:
        groups = {"learners": [learners.group for learners in self.learners.values()],
                  "evaluation": [self.evaluation.group], "inference": [self.inference.group] if self.inference else []}
        losses = {name: dict(sum((Counter(group.losses) for group in members), Counter()))
                  for name, members in groups.items() if members}
        summary = self.reporter.summary(self.state, reason, self.started.elapsed(), self.startup_s,
                                        self.first_iteration_s, losses)
        self.reporter.output.close()
        return summary

    def shutdown(self) -> None:
        self.evaluation.shutdown()
        self.pool.shutdown()
        if self.inference is not None:
            self.inference.shutdown()
        for learners in self.learners.values():
            learners.shutdown()
        self.reporter.close()
