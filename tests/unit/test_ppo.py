"""PPO loss terms on tiny hand-checked batches, and the update's diagnostics."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dppo.config import PPOConfig, load_config
from dppo.envs.make import env_spaces
from dppo.rl.model import ActorCritic
from dppo.rl.ppo import Batch, Trainer, explained_variance, ppo_loss
from dppo.rl.spaces import Obs


def test_identical_policies_give_ratio_one() -> None:
    logp = torch.log(torch.tensor([0.2, 0.5, 0.9]))
    terms = ppo_loss(logp, logp.clone(), torch.tensor([1.0, -2.0, 0.5]), torch.zeros(3), torch.zeros(3),
                     torch.zeros(3), torch.ones(3), PPOConfig(normalize_advantages=False))
    assert terms.clip_fraction == 0.0
    assert terms.approx_kl == pytest.approx(0.0, abs=1e-7)
    # ratio 1: the surrogate is -mean(advantages)
    assert float(terms.policy_loss) == pytest.approx(-(1.0 - 2.0 + 0.5) / 3)


def test_clipped_surrogate_kl_and_losses_match_a_hand_computation() -> None:
    """Two samples, clip 0.2: ratio 2 with A=+1 is clipped to 1.2; ratio 0.5 with A=-1 is clipped to 0.8."""
    old = torch.log(torch.tensor([0.25, 0.5]))
    new = torch.log(torch.tensor([0.5, 0.25]))
    adv = torch.tensor([1.0, -1.0])
    cfg = PPOConfig(normalize_advantages=False, clip_coef=0.2, clip_value_loss=False)
    terms = ppo_loss(new, old, adv, torch.tensor([1.0, 3.0]), torch.zeros(2), torch.tensor([0.0, 1.0]),
                     torch.tensor([0.3, 0.7]), cfg)
    # pessimistic bound: max(-A*r, -A*clip(r)) -> sample 0: max(-2, -1.2) = -1.2; sample 1: max(0.5, 0.8) = 0.8
    assert float(terms.policy_loss) == pytest.approx((-1.2 + 0.8) / 2)
    assert terms.clip_fraction == 1.0
    # k3 estimator: mean((r - 1) - log r) over r = 2, 0.5
    expected_kl = ((2 - 1 - math.log(2)) + (0.5 - 1 - math.log(0.5))) / 2
    assert terms.approx_kl == pytest.approx(expected_kl, rel=1e-5)
    assert float(terms.value_loss) == pytest.approx(0.5 * (1.0 + 4.0) / 2)
    assert float(terms.entropy) == pytest.approx(0.5)


def test_value_clipping_takes_the_larger_error() -> None:
    cfg = PPOConfig(normalize_advantages=False, clip_coef=0.2, clip_value_loss=True)
    logp = torch.zeros(1)
    terms = ppo_loss(logp, logp, torch.zeros(1), torch.tensor([2.0]), torch.tensor([0.0]), torch.tensor([2.0]),
                     torch.zeros(1), cfg)
    # unclipped error 0, clipped prediction 0.2 -> error 1.8^2; the max is taken
    assert float(terms.value_loss) == pytest.approx(0.5 * 1.8**2)


def test_explained_variance_is_1_exact_0_at_the_mean_nan_for_a_constant_target() -> None:
    target = np.array([1.0, 2.0, 3.0, 4.0])
    assert explained_variance(target, target) == pytest.approx(1.0)
    assert explained_variance(np.full(4, target.mean()), target) == pytest.approx(0.0)
    assert math.isnan(explained_variance(target, np.ones(4)))


def _trainer(**ppo: object) -> tuple[Trainer, Batch]:
    cfg = load_config(overrides={"ppo.minibatch_size": 64, **{f"ppo.{k}": v for k, v in ppo.items()}})
    obs_space, act_space = env_spaces(cfg)
    torch.manual_seed(0)
    model = ActorCritic(obs_space, act_space, cfg.model)
    trainer = Trainer(model, cfg.ppo, num_iterations=10, seed=0, device=torch.device("cpu"))
    obs = torch.randn(256, 4)
    with torch.no_grad():
        dist, values = model(obs)
        actions = dist.sample()
        logp = dist.log_prob(actions)
    batch = Batch(Obs(vector=obs), actions, logp, values, torch.randn(256), values + torch.randn(256))
    return trainer, batch


def test_update_reports_every_diagnostic_and_anneals() -> None:
    trainer, batch = _trainer(epochs=2, learning_rate=1e-3, anneal_lr=True)
    stats = trainer.update(batch, 5, 6)  # the learning-rate clock at iteration 5 of 10
    assert stats.learning_rate == pytest.approx(1e-3 * 0.5)
    assert stats.epochs_run == 2 and stats.skipped_minibatches == 0
    for value in (stats.policy_loss, stats.value_loss, stats.entropy, stats.approx_kl, stats.clip_fraction,
                  stats.grad_norm):
        assert math.isfinite(value)


def test_update_reports_the_clip_fraction_and_kl_of_the_ratios_it_saw() -> None:
    """Ratios set row by row (old log-probs shifted by log r) and a step size of 0, so they stay put through every
    epoch: 3 of each 8 rows are outside [0.8, 1.2], and the KL is the k3 mean of the pattern, computed by hand."""
    trainer, batch = _trainer(epochs=2)
    trainer.config = trainer.config.model_copy(update={"learning_rate": 0.0})  # past validation: weights stay put
    pattern = [0.5, 0.75, 0.95, 1.0, 1.15, 1.3, 1.0, 0.85]  # |r - 1| > 0.2: 0.5, 0.75 and 1.3
    ratios = torch.tensor(pattern * (len(batch.actions) // len(pattern)))
    stats = trainer.update(batch._replace(log_probs=batch.log_probs - ratios.log()), 0, 1)
    assert stats.epochs_run == 2 and stats.learning_rate == 0.0
    assert stats.clip_fraction == pytest.approx(3 / 8, abs=1e-6)
    assert stats.approx_kl == pytest.approx(sum((r - 1) - math.log(r) for r in pattern) / len(pattern), rel=1e-4)


def test_target_kl_stops_epochs_early() -> None:
    trainer, batch = _trainer(epochs=10, learning_rate=0.05, target_kl=1e-6, anneal_lr=False)
    assert trainer.update(batch, 0, 1).epochs_run == 1


def test_nonfinite_loss_skips_the_step() -> None:
    trainer, batch = _trainer()
    before = [p.detach().clone() for p in trainer.model.parameters()]
    bad = batch._replace(returns=torch.full_like(batch.returns, float("nan")))
    stats = trainer.update(bad, 0, 1)
    assert stats.skipped_minibatches > 0
    for old, new in zip(before, trainer.model.parameters(), strict=True):
        assert torch.equal(old, new)


def _loss_and_grads(active: torch.Tensor | None, advantages: torch.Tensor, returns: torch.Tensor,
                    new_values: torch.Tensor) -> tuple[list[float], list[torch.Tensor]]:
    """The loss terms of one minibatch and their gradients with respect to the new log-probs and values."""
    generator = torch.Generator().manual_seed(3)
    new_logp = (torch.randn(8, generator=generator) * 0.3).requires_grad_()
    old_logp, old_values = torch.zeros(8), torch.zeros(8)
    new_values = new_values.clone().requires_grad_()
    entropy = torch.rand(8, generator=generator)
    terms = ppo_loss(new_logp, old_logp, advantages, new_values, old_values, returns, entropy,
                     PPOConfig(clip_value_loss=True), active=active)
    (terms.policy_loss + terms.value_loss).backward()
    values = [float(terms.policy_loss.detach()), float(terms.value_loss.detach()), float(terms.entropy),
              terms.approx_kl, terms.clip_fraction]
    return values, [new_logp.grad, new_values.grad]


def test_padding_rows_of_agents_that_left_change_nothing_in_the_loss() -> None:
    """Rows masked off (black death) may hold anything: the losses, diagnostics and gradients are those of the live
    rows alone, their advantages normalized among themselves; an all-live mask is the plain loss."""
    generator = torch.Generator().manual_seed(0)
    advantages, returns, values = (torch.randn(8, generator=generator) for _ in range(3))
    active = torch.tensor([True, True, False, True, False, True, True, False])
    first, first_grads = _loss_and_grads(active, advantages, returns, values)
    noise = torch.where(active, 0.0, 100.0)
    second, second_grads = _loss_and_grads(active, advantages + noise, returns - noise, values + noise)
    assert second == pytest.approx(first, rel=1e-6, abs=1e-7)
    for a, b in zip(first_grads, second_grads, strict=True):
        torch.testing.assert_close(a, b)
        assert not a[~active].any()  # padding rows get no gradient
    unmasked, unmasked_grads = _loss_and_grads(None, advantages, returns, values)
    live, live_grads = _loss_and_grads(torch.ones(8, dtype=torch.bool), advantages, returns, values)
    assert live == pytest.approx(unmasked, rel=1e-6, abs=1e-7)
    for a, b in zip(unmasked_grads, live_grads, strict=True):
        torch.testing.assert_close(a, b)


def test_a_minibatch_of_padding_only_takes_no_step() -> None:
    trainer, batch = _trainer()
    before = [p.detach().clone() for p in trainer.model.parameters()]
    stats = trainer.update(batch._replace(active=torch.zeros(len(batch.actions), dtype=torch.bool)), 0, 1)
    assert stats.skipped_minibatches == 0 and math.isnan(stats.policy_loss)  # nothing ran, nothing went wrong
    for old, new in zip(before, trainer.model.parameters(), strict=True):
        assert torch.equal(old, new)
