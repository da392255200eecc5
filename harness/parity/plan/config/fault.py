"""A planted fault: a non-finite value written into one gradient, the forced-inf suite's axis."""

from __future__ import annotations

import dataclasses

from harness.parity.plan.config.axes import FAULT_VALUES, choice


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Fault:
    """A non-finite value written into one gradient after backward (before unscaling)."""

    step: int
    """The step it happens in (0-based)."""
    rank: int | None = 1
    """The one rank whose gradient is poisoned; ``None``: every rank at once."""
    value: str = "inf"
    """``"inf"`` or ``"nan"``."""
    optimizer: int = 0
    """Which optimizer's parameters get it (``two_optimizers``: 0 or 1)."""

    def __post_init__(self) -> None:
        if self.step < 0:
            raise ValueError(f"Fault.step must be >= 0, got {self.step}")
        if self.rank is not None and self.rank < 0:
            raise ValueError(f"Fault.rank must be >= 0 or None (every rank), got {self.rank}")
        choice("Fault.value", self.value, FAULT_VALUES)
        choice("Fault.optimizer", self.optimizer, (0, 1))

    @property
    def id(self) -> str:
        """``inf@r1s2`` (rank 1, step 2), ``nan@alls4`` (every rank, step 4); ``o1`` marks optimizer 1."""
        where = "all" if self.rank is None else f"r{self.rank}"
        return f"{self.value}@{where}s{self.step}" + (f"o{self.optimizer}" if self.optimizer else "")
