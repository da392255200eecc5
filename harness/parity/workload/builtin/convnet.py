"""``convnet``: a small convolutional classifier with GroupNorm and dropout, the second worked
example of writing a workload.

What it exercises that the toys do not: convolutions, normalization layers with affine parameters,
and *randomness inside forward*: ``Dropout2d`` in every block and ``Dropout`` before the head draw
their masks from torch's RNG during the forward pass. The engine seeds that RNG per ``(seed, rank,
step)`` right before each forward, under DDP and under FSDP alike (neither wrapper draws from it),
so both runs drop the same channels and units and the comparison stays exact.

Why GroupNorm and not BatchNorm: FSDP1's ``MixedPrecision`` keeps ``_BatchNorm`` modules in float32
by default (its ``_module_classes_to_ignore``), which FSDP2 and a DDP reference over a
low-precision copy do not, so a BatchNorm net's fp16/bf16 rows would compare two different
computations. GroupNorm runs in the model's dtype everywhere.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from harness.parity.workload.spec import Workload

CLASSES = 10


class ConvBlock(nn.Module):
    """``conv -> GroupNorm -> ReLU -> Dropout2d``: the FSDP unit."""

    def __init__(self, channels_in: int, channels_out: int, stride: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels_in, channels_out, 3, stride=stride, padding=1, bias=False)
        self.norm = nn.GroupNorm(4, channels_out)
        self.drop = nn.Dropout2d(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(F.relu(self.norm(self.conv(x))))


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(ConvBlock(3, 8), ConvBlock(8, 16, stride=2), ConvBlock(16, 16))
        self.drop = nn.Dropout(0.25)
        self.head = nn.Linear(16, CLASSES)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = self.blocks(images).mean(dim=(2, 3))
        return self.head(self.drop(features))


def image_batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Four 3x16x16 images and their labels."""
    return torch.randn(4, 3, 16, 16), torch.randint(0, CLASSES, (4,))


def classify(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    images, labels = batch
    return F.cross_entropy(model(images).float(), labels)


def convnet() -> Workload:
    return Workload(name="convnet", model=ConvNet, batch=image_batch, loss=classify, units=(ConvBlock,))
