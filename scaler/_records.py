"""Per-iteration bookkeeping of the scalers: where each optimizer stands, and its found_inf flags.

Why a module of its own: the records are torch's private layout (``_per_optimizer_states[id(opt)]``
is a dict with exactly ``"stage"`` and ``"found_inf_per_device"``, the stage a member of torch's own
``torch.amp.grad_scaler.OptState``), which code written against torch's scalers reads and compares
(torch's own tests compare a record with ``_refresh_per_optimizer_state()``), so both scalers keep it
exactly: no enum of our own (its members would never equal torch's) and no extra key (what a scaler
needs beyond torch's record lives on the scaler). The scaler classes only move records through
``READY -> UNSCALED -> STEPPED`` and reset them in ``update()``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.amp.grad_scaler import OptState

__all__ = ["OptState", "OptimizerRecords", "sum_on"]


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
