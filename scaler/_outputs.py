"""``scale(outputs)``: multiply a tensor or a nested list/tuple/iterable of tensors by the scale.

Why a module of its own: it is the one part of a scaler that touches the user's outputs rather
than gradients, and the two scalers differ in it only by the dtype of what they return.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from scaler._unscale import PerDevice

__all__ = ["scale_outputs"]


def scale_outputs(
    outputs: Any, scale_for: Callable[[torch.Tensor], torch.Tensor], *, keep_dtype: bool
) -> Any:
    """``outputs`` times the scale, with the same nesting (lists and tuples rebuilt, other iterables
    mapped lazily). ``scale_for(first_tensor)`` returns the scale tensor (creating it on the first
    tensor's device if need be); it is copied once to each other device met.

    The product follows torch's type promotion (an fp16 0-dim loss times the float32 scale is
    float32); ``keep_dtype`` casts each product back to its output's dtype.
    """
    if isinstance(outputs, torch.Tensor):
        scaled = outputs * scale_for(outputs).to(device=outputs.device, non_blocking=True)
        return scaled.type(outputs.dtype) if keep_dtype else scaled
    replicated: list[PerDevice] = []

    def apply(value):
        if isinstance(value, torch.Tensor):
            if not replicated:
                replicated.append(PerDevice(scale_for(value)))
            scaled = value * replicated[0].get(value.device)
            return scaled.type(value.dtype) if keep_dtype else scaled
        if isinstance(value, Iterable):
            mapped = map(apply, value)
            return type(value)(mapped) if isinstance(value, (list, tuple)) else mapped
        raise ValueError("outputs must be a Tensor or an iterable of Tensors")

    return apply(outputs)
