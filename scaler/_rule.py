"""The loss-scale rule: exactly one copy, shared by GradScaler and ShardedGradScaler.

Why one copy: torch's ShardedGradScaler re-implements ``update()`` for CPU in Python and its copy
drifts from the native one (it grows the scale to +inf). Here both scalers call
:func:`update_scale_`, which defers to the native ``torch._amp_update_scale_`` kernel (the same
arithmetic on CPU and CUDA, no host sync), and :func:`next_scale_state` is its pure form.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["ScaleConfig", "ScaleState", "next_scale_state", "update_scale_"]


class ScalerArgumentError(ValueError, AssertionError):
    """A scaler argument is out of range.

    It is a ``ValueError`` (bad input, not a broken invariant) and also an ``AssertionError``
    because ``torch.amp.GradScaler`` raises ``AssertionError`` for a bad growth or backoff factor:
    code written against torch that catches that keeps working.
    """


def _require_finite_positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value) or value <= 0.0:
        raise ScalerArgumentError(f"{name} must be a finite number > 0, got {value}")
    return value


class ScalerUsageError(RuntimeError, AssertionError):
    """A scaler method was called out of order (no ``scale()`` yet, pickled mid-iteration, ...).

    A ``RuntimeError`` (it is misuse, not a broken invariant) and an ``AssertionError``, the type
    ``torch.amp.GradScaler`` raises in the same situations.
    """


def check_growth_factor(value: float) -> float:
    value = _require_finite_positive("growth_factor", value)
    if value <= 1.0:
        raise ScalerArgumentError(f"growth_factor must be > 1.0, got {value}; use e.g. 2.0")
    return value


def check_backoff_factor(value: float) -> float:
    value = _require_finite_positive("backoff_factor", value)
    if not 0.0 < value < 1.0:
        raise ScalerArgumentError(f"backoff_factor must be in (0, 1), got {value}; use e.g. 0.5")
    return value


def check_growth_interval(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"growth_interval must be an int, got {type(value).__name__}")
    if value < 1:
        raise ScalerArgumentError(f"growth_interval must be >= 1, got {value}; use e.g. 2000")
    return value


def check_scale(name: str, value: float) -> float:
    return _require_finite_positive(name, value)


@dataclass(frozen=True, kw_only=True, slots=True)
class ScaleConfig:
    """How the scale moves. Defaults are torch's numbers."""

    growth_factor: float = 2.0
    """Multiplier applied after ``growth_interval`` consecutive clean steps (> 1)."""
    backoff_factor: float = 0.5
    """Multiplier applied after a step with a non-finite gradient (in (0, 1))."""
    growth_interval: int = 2000
    """Consecutive clean steps needed before the scale grows (>= 1)."""
    min_scale: float | None = None
    """Optional floor for the scale; ``None`` (torch's behaviour) means no floor."""
    max_scale: float | None = None
    """Optional ceiling for the scale; ``None`` means only float32's finiteness bounds growth."""

    def __post_init__(self) -> None:
        check_growth_factor(self.growth_factor)
        check_backoff_factor(self.backoff_factor)
        check_growth_interval(self.growth_interval)
        if self.min_scale is not None:
            check_scale("min_scale", self.min_scale)
        if self.max_scale is not None:
            check_scale("max_scale", self.max_scale)
        if self.min_scale is not None and self.max_scale is not None and self.min_scale > self.max_scale:
            raise ScalerArgumentError(f"min_scale ({self.min_scale}) must be <= max_scale ({self.max_scale})")


@dataclass(frozen=True, slots=True)
class ScaleState:
    """The scale (float32, one element) and the growth tracker (int32), on the scale's device."""

    scale: torch.Tensor
    growth_tracker: torch.Tensor

    @classmethod
    def initial(cls, init_scale: float, device: torch.device | str = "cpu") -> ScaleState:
        return cls(
            torch.full((), float(init_scale), dtype=torch.float32, device=device),
            torch.zeros((), dtype=torch.int32, device=device),
        )


def update_scale_(
    scale: torch.Tensor, growth_tracker: torch.Tensor, found_inf: torch.Tensor, config: ScaleConfig
) -> None:
    """Advance ``scale`` and ``growth_tracker`` in place by one ``update()``; never syncs the host.

    The rule (``found_inf`` is a float32 tensor on the scale's device; non-zero means overflow)::

        if found_inf != 0:
            scale = scale * backoff_factor            # product in float64, stored as float32
            growth_tracker = 0
        else:
            growth_tracker += 1
            if growth_tracker == growth_interval:
                grown = float32(scale * growth_factor)
                if isfinite(grown): scale = grown     # never grows to inf
                growth_tracker = 0
        scale = clamp(scale, min_scale, max_scale)    # only when bounds are set
    """
    torch._amp_update_scale_(
        scale, growth_tracker, found_inf, config.growth_factor, config.backoff_factor, config.growth_interval
    )
    if config.min_scale is not None or config.max_scale is not None:
        scale.clamp_(min=config.min_scale, max=config.max_scale)


def next_scale_state(state: ScaleState, found_inf: torch.Tensor, config: ScaleConfig) -> ScaleState:
    """Pure form of :func:`update_scale_`: returns the next state and leaves ``state`` untouched."""
    scale, tracker = state.scale.clone(), state.growth_tracker.clone()
    update_scale_(scale, tracker, found_inf.to(device=scale.device, dtype=torch.float32), config)
    return ScaleState(scale, tracker)
