"""The learner's Adam, without TorchDynamo's import.

torch.optim wraps its optimizers' methods so that TorchDynamo leaves them alone while it compiles, and the first call
of a wrapped method imports ``torch._dynamo`` (with sympy, torch.fx and FSDP): about 2 s of CPU in every process
that makes an optimizer, as much as importing torch itself, spent at each run's start on a compiler dppo never uses.
:class:`EagerAdam` is ``torch.optim.Adam`` calling the wrapped methods themselves: the same arithmetic, state and
``state_dict`` (checkpoints move between the two), ``tests/unit/test_optimizer.py`` holds it to that.
"""

from __future__ import annotations

from collections.abc import Callable
from inspect import unwrap

import torch

# Taken once, through every wrapper: an Adam made elsewhere in the process wraps Adam.step again (a profiler hook).
ADAM_STEP = unwrap(torch.optim.Adam.step)


class EagerAdam(torch.optim.Adam):
    """Adam for eager mode only: its methods skip the wrappers that import TorchDynamo."""

    add_param_group = unwrap(torch.optim.Optimizer.add_param_group)
    zero_grad = unwrap(torch.optim.Optimizer.zero_grad)
    state_dict = unwrap(torch.optim.Optimizer.state_dict)
    load_state_dict = unwrap(torch.optim.Optimizer.load_state_dict)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """Adam's step; its wrapper only turned gradients off (as here) and marked graph breaks for TorchDynamo."""
        return ADAM_STEP(self, closure)
