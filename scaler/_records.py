"""Per-iteration bookkeeping of the scalers: where each optimizer stands, and its found_inf flags.

Why a module of its own: the records are torch's private layout (``_per_optimizer_states[id(opt)]``
is a dict with ``"stage"`` and ``"found_inf_per_device"``), which code written against torch's
scalers reads, so both scalers keep it exactly; the scaler classes only move records through
``READY -> UNSCALED -> STEPPED`` and reset them in ``update()``.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import Any

import torch

__all__ = ["OptState", "OptimizerRecords", "sum_on"]


class OptState(Enum):
    """Where one optimizer is within the current iteration (reset by ``update()``)."""

    READY = 0
    UNSCALED = 1
    STEPPED = 2


_READY = OptState.READY  # a module name: cheaper than the Enum lookup on every first access


class OptimizerRecords(dict):
    """``id(optimizer) -> {"stage", "found_inf_per_device"}``, created on first access.

    A dict subclass rather than ``defaultdict(lambda ...)`` so that a scaler stays picklable.
    """

    def __missing__(self, key: int) -> dict[str, Any]:
        record = self[key] = {"stage": _READY, "found_inf_per_device": {}}
        return record


def sum_on(device: torch.device, flags: Sequence[torch.Tensor]) -> torch.Tensor:
    """The found_inf flags, moved to ``device`` and added (the flag itself when there is one on
    ``device``: no copy and no kernel on the hot path)."""
    if len(flags) == 1:
        flag = flags[0]
        return flag if flag.device == device else flag.to(device, non_blocking=True)
    return torch.stack([flag.to(device, non_blocking=True) for flag in flags]).sum()
