"""The learner group: L data-parallel learners behind one interface, so the driver never branches on L.

L = 1 is one :class:`Learner` in the driver's process, updating on the segments themselves. L > 1 are Ray
actors in one torch.distributed process group: each gets the iteration's segments by object reference (the
driver never concatenates the batch), builds the batch and takes every L-th row of each global minibatch;
advantage statistics, gradients and diagnostics are summed over the group, so every learner takes the step
one learner would take on the whole minibatch. Learner 0 exports the weights that are broadcast and
checkpointed. A learner that dies breaks the process group: the whole group is replaced. The remote learners are a
group on the shared lifecycle (:class:`~dppo.distributed.lifecycle.ActorGroup`): a lost one is classified and
counted by cause there; replacing all L together, and the learners' crash budget, are this group's and the run's.
"""

from __future__ import annotations

import time
from typing import Any

import ray
import torch

from dppo.config import Config
from dppo.distributed.deadlines import Hangs, Hung, SayHangs
from dppo.distributed.learner import Learner, RemoteLearner
from dppo.distributed.lifecycle import ActorGroup
from dppo.distributed.ray_calls import RayCalls
from dppo.envs.user_code import driver_import_paths
from dppo.errors import UsageError, first_line
from dppo.rl.agent import Weights
from dppo.rl.model import ActorCritic
from dppo.rl.ppo import TrainStats
from dppo.rl.segment import Segment

START_TRIES = 5  # the learners started again when one dies while they start (chaos, a node going away)


class LearnerDied(RuntimeError):
    """A learner of the group is gone; its replicas can no longer agree."""


class LearnerHung(LearnerDied):
    """A learner missed its deadline: said and counted as a hang (not a learner crash); the group is replaced."""


def resolve_device(device: str) -> torch.device:
    """The driver's learner device: ``auto`` is the GPU when this process sees one; actors stay on CPU."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("run.device=cuda but the learner sees no CUDA device; use run.device=auto or cpu, "
                         "or give the head a GPU (chart value head.gpus)")
    return torch.device(device)


def group_device(config: Config) -> str:
    """cuda when the cluster has a GPU for every learner (NCCL wants one GPU per rank; two ranks on one GPU
    fail with "Duplicate GPU detected"), else cpu with gloo. run.device=cuda with too few GPUs is bad input."""
    if config.run.device == "cpu":
        return "cpu"
    learners, gpus = config.run.learners, int(ray.cluster_resources().get("GPU", 0))
    if gpus >= learners:
        return "cuda"
    if config.run.device == "cuda":
        raise UsageError(f"run.device=cuda with run.learners={learners} needs a GPU per learner, but the Ray cluster "
                         f"has {gpus}; lower run.learners to {max(gpus, 1)}, add GPUs (chart value learners.gpus) "
                         "or use run.device=auto (CPU learners when GPUs are short)")
    return "cpu"


class LearnerGroup:
    """Update, weights, state, load and restart of L learners. ``model`` holds the initial (or resumed) weights:
    with L = 1 it is the learner's own model."""

    def __init__(self, config: Config, obs_space: Any, action_space: Any, model: ActorCritic,
                 trainer_state: dict[str, Any] | None = None, hangs: Hangs | None = None) -> None:
        """``hangs``: the run's (default: printed, with a budget of their own)."""
        self.config, self.obs_space, self.action_space = config, obs_space, action_space
        self.hangs = hangs or Hangs(config.faults, SayHangs(print))
        self.deadline = self.hangs.deadline()  # an update's (and the calls around it), from the updates' durations
        self.local: Learner | None = None
        self.group = ActorGroup(RayCalls(self._start_learner), lambda rank, spawn: config.run.seed, ready_call=False)
        self.timings: list[tuple[float, float]] = []  # per rank: (update s, all-reduce s) of the last update
        if config.run.learners == 1:
            self.device = str(resolve_device(config.run.device))
            self.local = Learner(config, obs_space, action_space, device=self.device, model=model)
            self.local.load(None, trainer_state)
            return
        self.device = group_device(config)
        self._start_loaded(model.state_dict(), trainer_state)

    @property
    def remote(self) -> list[ray.actor.ActorHandle]:
        return self.group.handles

    def _start_learner(self, rank: int, seed: int) -> ray.actor.ActorHandle:
        """Learner ``rank`` of L, with its GPU or CPUs (its seed is the run's: every replica starts the same)."""
        gpus = 1 if self.device == "cuda" else 0
        resource = self.config.run.learner_resource
        placement = ({"num_cpus": 0, "resources": {resource: 1}} if resource
                     else {"num_cpus": self.config.run.learner_cpus})
        return RemoteLearner.options(num_gpus=gpus, **placement).remote(
            self.config, self.obs_space, self.action_space, rank, self.config.run.learners, self.device,
            import_paths=driver_import_paths())

    def _start(self) -> None:
        """The L learners started and joined (each start-up call within faults.actor_start_timeout_s and the
        deadline: a learner stopped while it starts is hung)."""
        self.group.start(self.config.run.learners)
        limit = max(self.config.faults.actor_start_timeout_s, self.deadline.seconds)
        (address,) = self._answers([self.remote[0].rendezvous.remote()], "starting (its rendezvous)", limit)
        # a learner that dies while joining raises here; its peers would wait in gloo for 30 min
        self._answers([learner.join.remote(address) for learner in self.remote], "joining its group", limit)

    def _answers(self, calls: list[ray.ObjectRef], doing: str, limit_s: float | None = None) -> list[Any]:
        """The answers of one call per learner (or of learner 0's), gathered as they come within the deadline
        (``limit_s``); past it LearnerHung, the ranks that had not answered said. A learner that died raises
        RayActorError, a learner whose peer died RayTaskError, as soon as its call answers."""
        began, limit = time.monotonic(), self.deadline.seconds if limit_s is None else limit_s
        pending = list(calls)
        while pending:  # ray.wait, not ray.get in order: survivors block in the all-reduce of a dead peer
            left = max(0.0, began + limit - time.monotonic())
            ready, pending = ray.wait(pending, num_returns=1, timeout=left)
            if not ready:
                self._hung([calls.index(ref) for ref in pending], doing, time.monotonic() - began)
            self.rank = calls.index(ready[0])
            ray.get(ready)
        return ray.get(calls)

    def _hung(self, ranks: list[int], doing: str, waited_s: float) -> None:
        """Learners ``ranks`` missed the deadline: said (once, for the group: a learner blocked in all-reduce waits
        for a stopped peer, so which is stopped cannot be told), counted, the group's learners killed; LearnerHung."""
        names, count = ", ".join(map(str, ranks)), self.config.run.learners
        self.hangs.declare("learner", f"learner{'s' * (len(ranks) > 1)} {names} of {count}", doing, waited_s,
                           self.deadline, f"killing the {count} learners and starting them again (one blocked in "
                           "all-reduce waits for a stopped peer: which one stopped cannot be told)")
        self.group.lose(ranks[0], Hung(f"no answer in {waited_s:.1f} s"), hung=True)
        self.shutdown()
        raise LearnerHung(f"learner{'s' * (len(ranks) > 1)} {names} hung {doing}")

    def _start_loaded(self, model_state: dict[str, Any], trainer_state: dict[str, Any] | None) -> None:
        """Start the L learners and load them; a learner lost while they start or load (its node, a kill) has
        the whole group started again, up to START_TRIES times."""
        for attempt in range(START_TRIES):
            try:
                self._start()
                self.load(model_state, trainer_state)
                return
            except (ray.exceptions.RayActorError, LearnerHung) as err:
                self.shutdown()
                if attempt == START_TRIES - 1:
                    raise LearnerDied(f"the learners could not start: {first_line(err)}") from err

    def load(self, model_state: dict[str, Any], trainer_state: dict[str, Any] | None) -> None:
        if self.local is not None:
            self.local.load(model_state, trainer_state)
            return
        # learner 0's weights as last seen (broadcast, and reloaded by a restart) and the trainer state loaded
        self.last_weights: Weights = {k: v.detach().cpu().numpy() for k, v in model_state.items()}
        self.trainer_state = trainer_state
        model_ref, trainer_ref = ray.put(model_state), ray.put(trainer_state)  # one copy, read by every learner
        self._answers([learner.load.remote(model_ref, trainer_ref) for learner in self.remote], "loading the weights",
                      max(self.config.faults.actor_start_timeout_s, self.deadline.seconds))

    def update(self, segments: list[Segment], refs: list[ray.ObjectRef], lr_clock: float, version: int
               ) -> TrainStats:
        """Every learner updates to policy ``version`` (remote ones read ``refs``); they agree, so learner 0's
        statistics are the group's. A learner that dies stops the update: LearnerDied (restart the group and
        retry)."""
        if self.local is not None:
            stats, update_s, reduce_s = self.local.update(lr_clock, version, *segments)
            self.timings = [(update_s, reduce_s)]
            return stats
        calls = [learner.update.remote(lr_clock, version, *refs) for learner in self.remote]
        self.rank = 0  # the learner whose answer is being read
        began = time.monotonic()
        try:
            results = self._answers(calls, f"updating to policy version {version}")
            self.deadline.observe(time.monotonic() - began)
            self.rank = 0
            (self.last_weights,) = self._answers([self.remote[0].weights.remote()], "exporting its weights")
        except ray.exceptions.RayTaskError:  # a survivor's all-reduce broke: did a peer die under it?
            lost = dead_peer(calls, calls)
            if lost is None:
                raise
            rank, death = lost
            self.group.lose(rank, death)
            raise LearnerDied(f"a learner process died during the update: {first_line(death)}") from death
        except ray.exceptions.RayActorError as err:
            self.group.lose(self.rank, err)
            raise LearnerDied(f"a learner process died during the update: {first_line(err)}") from err
        self.timings = [(update_s, reduce_s) for _stats, update_s, reduce_s in results]
        return results[0][0]

    def weights(self) -> Weights:
        """Learner 0's weights as numpy arrays (views of the local model's parameters with L = 1)."""
        return self.local.weights() if self.local is not None else self.last_weights

    def state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Learner 0's model and trainer state, for a checkpoint. Without learner 0: the last update's weights and
        the trainer state last loaded (the optimizer state falls back to the last checkpoint's), and LearnerDied."""
        if self.local is not None:
            return self.local.state()
        try:
            (state,) = self._answers([self.remote[0].state.remote()], "saving its state for a checkpoint")
            return state
        except ray.exceptions.RayActorError as err:
            self.group.lose(0, err)
            raise LearnerDied("learner 0 is gone") from err

    def fallback_state(self) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """What the driver holds when learner 0 is gone: the last update's weights, the last loaded trainer state."""
        return self._model_state(), self.trainer_state

    def _model_state(self) -> dict[str, Any]:
        return {k: torch.tensor(v) for k, v in self.last_weights.items()}

    def restart(self, trainer_state: dict[str, Any] | None) -> None:
        """A learner died: the survivors' process group is broken, so replace all L and load the last update's
        weights (what a surviving learner holds) with ``trainer_state``."""
        model_state = self._model_state()
        self.shutdown()
        self._start_loaded(model_state, trainer_state)

    def shutdown(self) -> None:
        self.group.shutdown()


def dead_peer(calls: list[ray.ObjectRef], pending: list[ray.ObjectRef], timeout_s: float = 30.0
              ) -> tuple[int, ray.exceptions.RayActorError] | None:
    """(rank, its death) of a learner whose update call died, among ``pending`` (those not read yet) when a survivor's
    all-reduce failed (gloo: "connection reset by peer" when the peer's process is killed): the death, not the
    survivor's error, is what happened. None when no peer died within ``timeout_s``."""
    done, _ = ray.wait(pending, num_returns=len(pending), timeout=timeout_s) if pending else ([], [])
    for ref in done:
        try:
            ray.get(ref)
        except ray.exceptions.RayActorError as death:
            return calls.index(ref), death
        except ray.exceptions.RayTaskError:
            continue
    return None
