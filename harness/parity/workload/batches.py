"""A workload's batch as the engine moves and converts it: tensors inside dicts, lists and tuples.

Why here: a batch is the workload's data, whatever shape its factory gives it; the engines move it
to a device and the ground truth casts it, through one walk over its tensors.
"""

from __future__ import annotations

from typing import Any

import torch


def to_device(batch: Any, device: torch.device) -> Any:
    return tree_map(batch, lambda t: t.to(device))


def tree_map(batch: Any, func: Any) -> Any:
    """``func`` applied to every tensor of ``batch`` (through dicts, lists and tuples)."""
    if isinstance(batch, torch.Tensor):
        return func(batch)
    if isinstance(batch, dict):
        return {key: tree_map(value, func) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)) and not hasattr(batch, "_fields"):
        return type(batch)(tree_map(value, func) for value in batch)
    return batch
