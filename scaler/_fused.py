"""The protocol between a scaler and an optimizer that unscales and skips inside its own kernel.

Why a module of its own: it is torch's contract with its fused optimizers (``Adam(fused=True)``,
``AdamW``, ``SGD``, ``Adagrad``), independent of how a scaler finds or agrees found_inf. An
optimizer that declares ``_step_supports_amp_scaling`` gets two attributes for one ``step()``:

- ``grad_scale``: the scale to divide the grads by (None when ``unscale_`` already did it);
- ``found_inf``: a float32 flag; the kernel skips the update only when it is exactly 1.0.

Optimizers written for an older torch take the scaler itself as ``step(grad_scaler=...)``
instead; they still work, with torch's FutureWarning.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["step_with_amp_attributes", "takes_grad_scaler_kwarg"]


@functools.lru_cache(maxsize=256)
def _has_grad_scaler_parameter(step: Callable[..., Any]) -> bool:
    return "grad_scaler" in inspect.signature(step).parameters


def takes_grad_scaler_kwarg(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer.step`` still has the deprecated ``grad_scaler=`` parameter, warning as
    torch does when it has. Cached per step function: ``inspect.signature`` costs more than all
    the rest of a fused step's host work."""
    step = optimizer.step
    if not _has_grad_scaler_parameter(getattr(step, "__func__", step)):
        return False
    warnings.warn(
        "GradScaler is going to stop passing itself as a keyword argument to the passed "
        "optimizer. In the near future GradScaler registers `grad_scale: Tensor` and "
        "`found_inf: Tensor` to the passed optimizer and let the optimizer use them directly.",
        FutureWarning,
        stacklevel=4,
    )
    return True


def step_with_amp_attributes(
    optimizer: torch.optim.Optimizer,
    *,
    scale: torch.Tensor | None,
    found_inf: torch.Tensor,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """Call ``optimizer.step`` with ``grad_scale``/``found_inf`` set, and remove them afterwards.

    ``scale`` None means the grads are already unscaled. A ``grad_scale`` the optimizer holds
    itself is an extra factor: it is multiplied in (or passed through when ``scale`` is None).
    The kernels only read these tensors, so the scale is handed over without a copy.
    """
    outer = getattr(optimizer, "grad_scale", None)
    if scale is None:
        optimizer.grad_scale = outer  # type: ignore[attr-defined]
    else:
        optimizer.grad_scale = scale if outer is None else scale * outer  # type: ignore[attr-defined]
    optimizer.found_inf = found_inf  # type: ignore[attr-defined]
    try:
        return optimizer.step(*args, **kwargs)
    finally:
        del optimizer.grad_scale  # type: ignore[attr-defined]
        del optimizer.found_inf  # type: ignore[attr-defined]
