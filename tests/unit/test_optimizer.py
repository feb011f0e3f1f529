"""EagerAdam: torch's Adam to the bit, without importing TorchDynamo (2 s of CPU at every run's start)."""

from __future__ import annotations

import subprocess
import sys

import torch

from dppo.rl.optimizer import EagerAdam


def trained(optimizer_class: type[torch.optim.Optimizer], state: dict | None = None) -> tuple[list, dict]:
    """A small net after 6 seeded Adam steps (fused, its learning rate changed between steps, as annealing does),
    from ``state`` if given; its parameters and the optimizer's state_dict."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    optimizer = optimizer_class(net.parameters(), lr=1e-2, eps=1e-5, fused=True)
    if state is not None:
        optimizer.load_state_dict(state)
    for step in range(6):
        optimizer.zero_grad()
        net(torch.randn(16, 4)).pow(2).sum().backward()
        for group in optimizer.param_groups:
            group["lr"] = 1e-2 * (1 - step / 10)
        optimizer.step()
    return [p.detach().clone() for p in net.parameters()], optimizer.state_dict()


def same_state(a: dict, b: dict) -> bool:
    return a["param_groups"] == b["param_groups"] and a["state"].keys() == b["state"].keys() and all(
        torch.equal(a["state"][k][name], b["state"][k][name]) for k in a["state"] for name in a["state"][k])


def test_eager_adam_steps_and_saves_as_torch_adam_does_and_their_states_load_into_each_other() -> None:
    eager_params, eager_state = trained(EagerAdam)
    torch_params, torch_state = trained(torch.optim.Adam)
    assert all(torch.equal(a, b) for a, b in zip(eager_params, torch_params, strict=True))
    assert same_state(eager_state, torch_state)
    # a checkpoint written by either goes on in the other
    assert same_state(trained(EagerAdam, torch_state)[1], trained(torch.optim.Adam, eager_state)[1])


def test_a_trainers_update_and_checkpoint_leave_torch_dynamo_unimported() -> None:
    """In a fresh process (this one may have imported it for another test): a Trainer's update and state_dict
    round trip. Fails where a torch release moves the import elsewhere: then EagerAdam needs another look."""
    code = """
import sys, torch
from dppo.config import load_config
from dppo.envs.make import env_spaces
from dppo.rl.batch import Batch
from dppo.rl.model import ActorCritic
from dppo.rl.ppo import Trainer
from dppo.rl.spaces import Obs
cfg = load_config(overrides={"ppo.minibatch_size": 64})
model = ActorCritic(*env_spaces(cfg), cfg.model)
trainer = Trainer(model, cfg.ppo, num_iterations=10, seed=0, device=torch.device("cpu"))
obs = torch.randn(256, 4)
with torch.no_grad():
    dist, values = model(obs)
    actions = dist.sample()
batch = Batch(Obs(vector=obs), actions, dist.log_prob(actions), values, torch.randn(256), values + 1)
trainer.update(batch, 0, 1)
trainer.optimizer.load_state_dict(trainer.optimizer.state_dict())
print(sorted(name for name in sys.modules if name.startswith("torch._dynamo")))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]", done.stdout[-2000:]
