"""PPO: the clipped-surrogate loss and the Trainer (the optimizer's owner; K epochs x minibatches of SGD).

Schulman et al. 2017 (arXiv:1707.06347), with the implementation details of Huang et al. 2022:
per-minibatch advantage normalization, clipped value loss, entropy bonus, global grad-norm clip,
Adam eps 1e-5, linear learning-rate annealing, optional target-KL early stop.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import NamedTuple, Protocol

import numpy as np
import torch

from dppo.config import PPOConfig
from dppo.rl.batch import Batch, build_batch
from dppo.rl.model import ActorCritic
from dppo.rl.normalizer import ValueNormalizer
from dppo.rl.optimizer import EagerAdam
from dppo.rl.segment import Segment


class LossTerms(NamedTuple):
    """The loss pieces (with gradients) and detached diagnostics of one minibatch."""

    policy_loss: torch.Tensor
    value_loss: torch.Tensor
    entropy: torch.Tensor
    approx_kl: float
    clip_fraction: float
    rows: float = 1.0  # the rows of the global minibatch that count (with an active mask: the live ones)


@dataclass
class TrainStats:
    """Diagnostics of one update, averaged over the minibatches that ran."""

    policy_loss: float
    value_loss: float
    entropy: float
    approx_kl: float
    clip_fraction: float
    explained_variance: float
    learning_rate: float
    grad_norm: float
    epochs_run: int
    skipped_minibatches: int

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def explained_variance(predicted: np.ndarray, target: np.ndarray) -> float:
    """1 - Var[target - predicted] / Var[target]; NaN when the target is constant (or there is none)."""
    if target.size == 0:
        return float("nan")
    var = float(np.var(target))
    return float("nan") if var == 0 else 1.0 - float(np.var(target - predicted)) / var


class Reducer(Protocol):
    """Sums tensors over the learners of a data-parallel group (torch.distributed all-reduce)."""

    world: int

    def sum(self, tensor: torch.Tensor) -> torch.Tensor: ...


class LocalReducer:
    """The group of one: sums are the values themselves."""

    world = 1

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor


class MaskedMean:
    """The mean over a minibatch's live rows (many agents: the padding steps of agents that left count for
    nothing), scaled so that averaging the learners' shard gradients gives the global minibatch's mean."""

    def __init__(self, active: torch.Tensor, reducer: Reducer) -> None:
        self.weight = active.to(torch.float32)
        self.rows = float(reducer.sum(self.weight.sum()))
        self.share = max(self.rows, 1.0) / reducer.world  # the live rows per learner, on average

    def __call__(self, values: torch.Tensor) -> torch.Tensor:
        return (values * self.weight).sum() / self.share


def normalized_advantages(advantages: torch.Tensor, reducer: Reducer, live: MaskedMean | None = None
                          ) -> torch.Tensor:
    """Normalize with the mean and (unbiased) std of the global minibatch, whichever learner holds which rows
    (``live``: the minibatch's live rows when some are padding; None: every row counts)."""
    if live is None:
        count = reducer.sum(torch.tensor(float(advantages.numel()), dtype=advantages.dtype, device=advantages.device))
    else:
        count = live.rows  # already summed over the learners
    if count <= 1:
        return advantages

    def weighted(rows: torch.Tensor) -> torch.Tensor:
        return rows if live is None else rows * live.weight

    mean = reducer.sum(weighted(advantages).sum()) / count
    var = reducer.sum(weighted((advantages - mean) ** 2).sum()) / (count - 1)
    return (advantages - mean) / (var.sqrt() + 1e-8)


def ppo_loss(
    new_log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    new_values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    entropy: torch.Tensor,
    config: PPOConfig,
    reducer: Reducer | None = None,
    active: torch.Tensor | None = None,
) -> LossTerms:
    """Clipped surrogate, (clipped) value loss and entropy of one minibatch (or of this learner's shard of it,
    with ``reducer`` the group: advantages are normalized over the whole minibatch); no side effects. ``active``:
    the rows that count (the padding of agents that left does not); None: all of them."""
    reducer = reducer or LocalReducer()
    masked = None if active is None else MaskedMean(active, reducer)
    mean = torch.mean if masked is None else masked
    if config.normalize_advantages:
        advantages = normalized_advantages(advantages, reducer, masked)
    log_ratio = new_log_probs - old_log_probs
    ratio = log_ratio.exp()
    clip = config.clip_coef
    policy_loss = mean(torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip, 1 + clip)))
    if config.clip_value_loss:
        value_clip = config.value_clip_range
        clipped = old_values + (new_values - old_values).clamp(-value_clip, value_clip)
        value_loss = 0.5 * mean(torch.max((new_values - returns) ** 2, (clipped - returns) ** 2))
    else:
        value_loss = 0.5 * mean((new_values - returns) ** 2)
    with torch.no_grad():  # means over the whole minibatch (shards are equal in size)
        approx_kl = float(reducer.sum(mean((ratio - 1) - log_ratio))) / reducer.world  # k3 (Schulman 2020)
        clip_fraction = float(reducer.sum(mean(((ratio - 1).abs() > clip).float()))) / reducer.world
    rows = float(len(ratio) * reducer.world) if masked is None else masked.rows
    return LossTerms(policy_loss, value_loss, mean(entropy), approx_kl, clip_fraction, rows)


class Trainer:
    """Runs the PPO update on the learner; the only place gradients and optimizer state exist."""

    def __init__(self, model: ActorCritic, config: PPOConfig, num_iterations: int, seed: int,
                 device: torch.device, reducer: Reducer | None = None, rank: int = 0) -> None:
        self.model = model.to(device)
        self.reducer = reducer or LocalReducer()
        self.rank = rank  # with several learners each takes every world-th row of each global minibatch
        self.config = config
        self.num_iterations = num_iterations
        self.device = device
        # fused: one kernel for all parameters instead of a dozen small ops per tensor; EagerAdam: see its module
        self.optimizer = EagerAdam(model.parameters(), lr=config.learning_rate, eps=1e-5, fused=True)
        self.generator = torch.Generator().manual_seed(seed)
        self.value_normalizer = ValueNormalizer() if config.normalize_value else None

    def learning_rate(self, lr_clock: float) -> float:
        """Linear annealing to 0 over the run. ``lr_clock`` is the env steps trained on so far in iterations' worth
        (0 at the first update): with every round full it is the iteration's index, and a round that lost actors
        advances the schedule by the steps it had, so the rate reaches 0 at total_steps either way."""
        if not self.config.anneal_lr:
            return self.config.learning_rate
        frac = 1.0 - min(lr_clock, self.num_iterations - 1) / self.num_iterations
        return frac * self.config.learning_rate

    def train_on(self, segments: list[Segment], lr_clock: float, version: int) -> TrainStats:
        """The update on one iteration's segments (GAE and flattening first, :mod:`dppo.rl.batch`); ``version``: the
        policy version of the weights it makes."""
        return self.update(build_batch(segments, self.config.gamma, self.config.gae_lambda, self.device,
                                       self.value_normalizer), lr_clock, version)

    def update(self, batch: Batch, lr_clock: float, version: int) -> TrainStats:
        """K epochs of minibatch SGD over the batch (see :meth:`learning_rate` for ``lr_clock``), making policy
        ``version``. A batch smaller than usual (a round that lost actors) gives fewer minibatches of the same
        size."""
        cfg = self.config
        lr = self.learning_rate(lr_clock)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        sums = dict.fromkeys(("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "grad_norm"), 0.0)
        steps = skipped = epochs_run = 0
        old_values, returns = self._value_targets(batch, version)
        self.model.train()
        for _epoch in range(cfg.epochs):
            epochs_run += 1
            epoch_kl = []
            for idx in self._minibatches(batch):
                new_logp, entropy, new_values = self._evaluate(batch, idx)
                terms = ppo_loss(new_logp, batch.log_probs[idx], batch.advantages[idx], new_values,
                                 old_values[idx], returns[idx], entropy, cfg, self.reducer,
                                 None if batch.active is None else batch.active[idx])
                if terms.rows == 0:  # padding only (every agent of these rows had left): nothing to learn
                    continue
                loss = terms.policy_loss - cfg.entropy_coef * terms.entropy + cfg.value_coef * terms.value_loss
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self._average_gradients()
                grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm,
                                                                 foreach=True))
                if not (math.isfinite(float(loss.detach())) and math.isfinite(grad_norm)):
                    skipped += 1  # a NaN/Inf step would poison the weights: skip it, the driver counts it
                    continue
                self.optimizer.step()
                steps += 1
                epoch_kl.append(terms.approx_kl)
                for key, value in (("policy_loss", float(terms.policy_loss.detach())),
                                   ("value_loss", float(terms.value_loss.detach())),
                                   ("entropy", float(terms.entropy.detach())), ("approx_kl", terms.approx_kl),
                                   ("clip_fraction", terms.clip_fraction), ("grad_norm", grad_norm)):
                    sums[key] += value
            if cfg.target_kl is not None and epoch_kl and float(np.mean(epoch_kl)) > cfg.target_kl:
                break
        self.model.eval()
        means = {k: (v / steps if steps else float("nan")) for k, v in sums.items()}
        if self.reducer.world > 1:  # each learner saw its shard: report the group's mean
            for key in ("policy_loss", "value_loss", "entropy"):
                means[key] = float(self.reducer.sum(torch.tensor(means[key], dtype=torch.float64))) / self.reducer.world
        ev = explained_variance(batch.live(batch.values).cpu().numpy(), batch.live(batch.returns).cpu().numpy())
        return TrainStats(**means, explained_variance=ev, learning_rate=lr, epochs_run=epochs_run,
                          skipped_minibatches=skipped)

    def _value_targets(self, batch: Batch, version: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The old values and the returns in the value head's scale: as they are, or, with ppo.normalize_value,
        standardized by the return statistics with this batch's returns merged in (rl_games' order)."""
        if self.value_normalizer is None:
            return batch.values, batch.returns
        self.value_normalizer.update(batch.live(batch.returns).cpu().numpy(), version)
        return self.value_normalizer.normalize(batch.values), self.value_normalizer.normalize(batch.returns)

    def _minibatches(self, batch: Batch) -> Iterator[torch.Tensor]:
        """This learner's rows of each minibatch of one epoch, in a fresh random order. Feed-forward: rows;
        recurrent: whole env columns (rows c * T .. c * T + T - 1). Every learner's shard is the same size.
        ppo.num_minibatches sizes them against this batch (as Config.minibatch_size does against a full one), so a
        round that lost actors gets the same count of smaller minibatches; a remainder under one unit sits out."""
        unit = batch.steps or 1  # rows per sampling unit
        units = len(batch.actions) // unit
        mb_units = min(self.config.minibatch_rows(units * unit, unit * self.reducer.world) // unit, units)
        mb_units -= mb_units % self.reducer.world
        count = units // mb_units
        if self.config.num_minibatches is not None:
            count = min(count, self.config.num_minibatches)
        order = torch.randperm(units, generator=self.generator).to(self.device)
        offsets = torch.arange(unit, device=self.device)
        for start in range(0, count * mb_units, mb_units):
            picked = order[start:start + mb_units][self.rank::self.reducer.world]
            yield picked if unit == 1 else (picked[:, None] * unit + offsets).reshape(-1)

    def _evaluate(self, batch: Batch, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """log pi(a|s), entropy and V(s) of the rows ``idx`` under the current weights."""
        if batch.memory is None:
            return self.model.evaluate(batch.obs[idx], batch.actions[idx])
        columns = idx[::batch.steps] // batch.steps
        memory = (batch.memory[0][:, columns], batch.memory[1][:, columns])
        return self.model.evaluate_columns(batch.obs[idx], batch.actions[idx], batch.starts[idx], memory,
                                           batch.steps)

    def _average_gradients(self) -> None:
        """The mean of the learners' shard gradients is the gradient of the global minibatch's mean loss:
        one all-reduce of all gradients in a flat buffer, then every learner takes the same step."""
        if self.reducer.world == 1:
            return
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        flat = self.reducer.sum(torch.cat([g.reshape(-1) for g in grads])) / self.reducer.world
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    def state_dict(self) -> dict:
        state = {"optimizer": self.optimizer.state_dict(), "generator": self.generator.get_state()}
        if self.value_normalizer is not None:
            state["value_normalizer"] = self.value_normalizer.to_state()
        return state

    def load_state_dict(self, state: dict) -> None:
        """A checkpoint from before ppo.normalize_value (or written with it off) starts the statistics afresh."""
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        if self.value_normalizer is not None and "value_normalizer" in state:
            self.value_normalizer.load_state(state["value_normalizer"])
