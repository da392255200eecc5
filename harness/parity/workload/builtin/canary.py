"""``canary``: a wiring canary whose every gradient sums exactly, in any order, on any backend.

Why: a verdict past two ranks rests on the reference summing each gradient element in its
candidate's order (``ranks/sides/reduce_layout.py``). Where that cannot be had (NCCL picks its algorithm
by message size, NVLS is not deterministic between calls), the canary still asks for every bit:
its output is linear in each parameter and no parameter feeds another's gradient, so each local
gradient is the loss's coefficients times the inputs (small integers, over 4), whatever the
weights are, at every step. Every sum of them over up to 8 ranks, in any order or grouping, is then
exact in float32; divide factors are powers of two at world sizes 2, 4 and 8, so the averages are
exact too. So any difference at all is wiring, never rounding: a wrong divide factor, a rank left
out, padding that leaks into a value, HSDP's second stage skipped. It runs in float32 (a lower
dtype's few bits would round the sums) and is judged bitwise on every backend
(``Workload.exact_sums``).

The widths are chosen so padding happens: the wide branch's 12 rows shard 3 x 4 at world size 4
and 2 x 6 + 0 x 2 at 8, the narrow branch's 5 rows leave an empty shard at 4 and padded ones at 8,
and the root holds a parameter of its own (a third reduce-scatter group).
"""

from __future__ import annotations

import torch
from torch import nn

from harness.parity.workload.spec import Workload

WIDE = 12
INPUTS = 8
CLASSES = 5
STEPS = 4
LR = 2.0**-6
MOMENTUM = 0.5


class Branch(nn.Module):
    """One linear map of the input: the FSDP unit."""

    def __init__(self, rows: int) -> None:
        super().__init__()
        self.fc = nn.Linear(INPUTS, rows)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


class Canary(nn.Module):
    """``out = P @ wide(x) + narrow(x) + bias``: P a fixed projection of -1, 0 and 1 (a buffer),
    every weight a multiple of 1/8 (any value would do: no gradient depends on one)."""

    def __init__(self) -> None:
        super().__init__()
        self.wide = Branch(WIDE)
        self.narrow = Branch(CLASSES)
        self.bias = nn.Parameter(torch.zeros(CLASSES))
        self.register_buffer("projection", torch.randint(-1, 2, (CLASSES, WIDE)).float())
        with torch.no_grad():
            for param in self.parameters():
                param.copy_(torch.randint(-3, 4, param.shape).float() / 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wide(x) @ self.projection.t() + self.narrow(x) + self.bias


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Four inputs of small integers and a coefficient of -1, 0 or 1 per output."""
    return torch.randint(-2, 3, (4, INPUTS)).float(), torch.randint(-1, 2, (4, CLASSES)).float()


def linear_loss(model: nn.Module, data: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """``sum(output * coefficient)`` over the batch's rows, divided by their count (4 a rank: exact): linear
    in the output, so its gradient is the coefficient; a mean over the rows, so the whole batch's
    loss is the ranks' average (``judge/semantics.py``)."""
    inputs, coefficients = data
    return (model(inputs).float() * coefficients).sum() / inputs.shape[0]


def sgd(params: list[torch.Tensor]) -> torch.optim.Optimizer:
    """SGD whose learning rate and momentum are powers of two (the updates stay dyadic)."""
    return torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)


def canary() -> Workload:
    return Workload(
        name="canary",
        model=Canary,
        batch=batch,
        loss=linear_loss,
        units=(Branch,),
        optimizer=sgd,
        steps=STEPS,
        exact_sums=True,
    )
