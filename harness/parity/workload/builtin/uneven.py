"""``uneven``: a plain residual MLP whose parameters' rows divide neither by 2 nor by 4.

Why it exists: every other built-in has even dimensions, so no sharded parameter of theirs ever
splits unevenly across ranks, and a whole class of bugs never showed: anything that computes a
collective's size from a *local* shard (``DTensor.from_local`` inferring a global shape of local
rows x world size, a padding computed per rank) agrees with its peers only when the rows divide
evenly. Here the width is 21 rows (11 + 10 on two ranks, 6 + 6 + 6 + 3 on four), the hidden layer
43, and the output head has 5 classes (3 + 2 on two ranks; 2 + 2 + 1 + 0 on four: one rank holds
an empty shard of it). The inputs are large enough that fp16 at the matrix's initial scale
overflows in the first steps, so those steps are skipped and the optimizer has no state yet when
the first records are gathered (the placeholders' path). Each is an ordinary user's model.
"""

from __future__ import annotations

import torch
from torch import nn

from harness.parity.workload.spec import Workload

WIDTH = 21
HIDDEN = 43
CLASSES = 5
INPUTS = 12
INPUT_SCALE = 6.0
"""Inputs of this magnitude make the fp16 gradients at the initial scale 2**16 overflow, so the
first steps of every fp16 row are skipped (``suites/parity/test_uneven.py`` checks they are)."""


class Block(nn.Module):
    """Pre-norm residual MLP block, the FSDP unit: ``x + fc2(gelu(fc1(norm(x))))``."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.fc1 = nn.Linear(WIDTH, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm(x))))


class UnevenMLP(nn.Module):
    """``12 -> 21 -> 2 x Block(21, 43) -> 5``."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(INPUTS, WIDTH)
        self.blocks = nn.Sequential(Block(), Block())
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.inp(x)))


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Six inputs and class labels (torch's RNG is seeded per ``(seed, rank, step)``)."""
    return torch.randn(6, INPUTS) * INPUT_SCALE, torch.randint(0, CLASSES, (6,))


def classify(model: nn.Module, data: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    inputs, labels = data
    return nn.functional.cross_entropy(model(inputs).float(), labels)


def uneven() -> Workload:
    return Workload(name="uneven", model=UnevenMLP, batch=batch, loss=classify, units=(Block,))
