"""The loss scaler a configuration's candidate trains through, and its schedule.

Why a part: which scaler the candidate uses is the question the matrix asks of it (ours or
torch's ShardedGradScaler), and the initial scale and growth interval set which steps overflow
and grow; the reference always scales through ``torch.amp.GradScaler`` with the same schedule.
"""

from __future__ import annotations

import dataclasses

from harness.parity.plan.config.axes import SCALERS, choice


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Scale:
    """``Scale()`` is ours from 2**16, growing after 3 clean steps."""

    scaler: str = "ours"
    """The candidate's scaler: ``ours`` (``scaler.ShardedGradScaler``) or ``torch`` (torch's)."""
    init_scale: float = 2.0**16
    growth_interval: int = 3
    """Short, so a few steps show growth as well as backoff."""

    def __post_init__(self) -> None:
        choice("scaler", self.scaler, SCALERS)
        if self.growth_interval < 1:
            raise ValueError(f"growth_interval must be >= 1, got {self.growth_interval}")
        if not self.init_scale > 0:
            raise ValueError(f"init_scale must be > 0, got {self.init_scale}")

    def id_parts(self) -> list[str]:
        return [f"{self.scaler}_scaler"] if self.scaler != "ours" else []

    def reference_key(self, reference: str) -> tuple[object, ...]:
        """A DDP reference scales through ``torch.amp.GradScaler`` whatever the candidate's scaler;
        the single-process reference through the scaler under test."""
        return (self.scaler if reference == "single" else "torch.amp", self.init_scale, self.growth_interval)


DEFAULT_SCALE = Scale()
"""Ours from 2**16, growing after 3 clean steps: what a matrix scales by unless told otherwise."""
