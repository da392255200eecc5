"""Hand-made run records for the pure parity tests (compare, result, report): no ranks needed."""

from __future__ import annotations

import dataclasses

import torch

from harness.parity.record import RunRecord, StepRecord


def step(
    index: int,
    *,
    world: int = 2,
    weight: float = 1.0,
    scale: float = 4.0,
    tracker: int = 1,
    skipped: bool = False,
    loss: float = 0.5,
    grad: float = 0.25,
    state: float = 0.125,
) -> StepRecord:
    """One step on ``world`` ranks where every rank agrees; tensors hold the given values."""
    return StepRecord(
        step=index,
        losses=(loss,) * world,
        scales=(scale,) * world,
        trackers=(tracker,) * world,
        found_inf=((1.0 if skipped else 0.0,),) * world,
        skipped=((skipped,),) * world,
        params={"layer.weight": torch.full((2, 2), weight), "layer.bias": torch.zeros(2)},
        grads={"layer.weight": torch.full((2, 2), grad), "layer.bias": torch.zeros(2)},
        optim_state={"layer.weight": {"momentum_buffer": torch.full((2, 2), state)}},
    )


def run(*steps: StepRecord, role: str = "reference", error: str | None = None) -> RunRecord:
    return RunRecord(role=role, description=role, steps=tuple(steps), error=error, duration_s=0.5)


def replace_step(record: StepRecord, **changes) -> StepRecord:
    return dataclasses.replace(record, **changes)
