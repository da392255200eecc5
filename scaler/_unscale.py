"""Finding non-finite gradients and unscaling them, bucketed by (device, dtype).

Why a module of its own: both scalers walk the optimizer's gradients the same way; they differ
only in whether fp16 gradients are allowed and whether DTensor gradients are reduced to their
local shard (ShardedGradScaler does its own single cross-rank agreement, so it must not let
DTensor's dispatcher run one more all-reduce per bucket).
"""

from __future__ import annotations

from collections import defaultdict

import torch

try:  # DTensor is optional: torch builds without distributed support lack it.
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover - only on builds without torch.distributed
    DTensor = None  # type: ignore[assignment,misc]


class PerDevice:
    """Lazily serves copies of one tensor on each device that asks for it (cached per device)."""

    __slots__ = ("master", "copies")

    def __init__(self, master: torch.Tensor) -> None:
        self.master = master
        self.copies: dict[torch.device, torch.Tensor] = {}

    def get(self, device: torch.device) -> torch.Tensor:
        copy = self.copies.get(device)
        if copy is None:
            copy = self.master.to(device=device, non_blocking=True, copy=True)
            self.copies[device] = copy
        return copy


def _coalesce_fp16_sparse(param: torch.Tensor) -> torch.Tensor:
    """Coalesce an fp16 sparse grad through fp32, so duplicate indices that sum past fp16's range
    become inf in the stored grad (and are then found) instead of wrapping silently in fp16 adds."""
    grad = param.grad
    assert grad is not None
    param.grad = grad.to(torch.float32).coalesce().to(torch.float16)
    return param.grad


def unscale_grads_(
    optimizer: torch.optim.Optimizer,
    inv_scale: torch.Tensor,
    found_inf: torch.Tensor,
    *,
    allow_fp16: bool,
    local_dtensor: bool,
) -> dict[torch.device, torch.Tensor]:
    """Multiply every grad by ``inv_scale`` and record non-finite values, per device.

    Returns ``{device: found_inf_on_that_device}``; each value is 1.0 if a grad on that device held
    an inf/NaN before the multiply. With ``local_dtensor`` a DTensor grad is unscaled through its
    local shard (the caller agrees found_inf across ranks itself).
    """
    per_device_inv_scale = PerDevice(inv_scale)
    per_device_found_inf = PerDevice(found_inf)
    # One pass, no per-parameter helper calls: this loop runs for every parameter every step.
    buckets: defaultdict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = defaultdict(list)
    with torch.no_grad():
        for group in optimizer.param_groups:
            for param in group["params"]:
                try:
                    grad = param.grad
                except AttributeError:
                    raise TypeError(
                        f"optimizer.param_groups holds a {type(param).__name__}, expected torch.Tensor parameters"
                    ) from None
                if grad is None:
                    continue
                if not allow_fp16 and grad.dtype == torch.float16:
                    raise ValueError("Attempting to unscale FP16 gradients.")
                if type(grad) is not torch.Tensor and local_dtensor and DTensor is not None:
                    if isinstance(grad, DTensor):
                        grad = grad.to_local()
                if grad.is_sparse:
                    if grad.dtype == torch.float16:
                        grad = _coalesce_fp16_sparse(param)
                    grad = grad._values()
                buckets[grad.device, grad.dtype].append(grad)
        for (device, _), grads in buckets.items():
            torch._amp_foreach_non_finite_check_and_unscale_(
                grads, per_device_found_inf.get(device), per_device_inv_scale.get(device)
            )
    return per_device_found_inf.copies
