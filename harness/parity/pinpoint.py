"""Localization, controller side: the first module whose values leave the tolerance.

``localize.run_batch`` sends, for every rank, each module's forward output (in the order modules
finish their forward) and the gradient of each module's output (in backward order) from both the
reference and the candidate at the first diverging step. This walks them in that order (forward
first, then backward, each in the reference's order) and names the first module whose values
differ beyond the configuration's tolerance profile, with the phase, rank, step and error. Pure.

When nothing differs, the forward and backward at that step are the same on every rank, and the
divergence arises after them: in the gradient reduction, the scaler or the optimizer step (the
known causes name which, when they can).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from harness.parity.compare import format_ulp, tensor_diff
from harness.parity.profiles import ToleranceProfile

PHASES = ("forward", "backward")
_PHASE_WORDS = {"forward": "forward output", "backward": "gradient of its output"}


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ModuleDiff:
    """How far one module's value on one rank is from the reference's."""

    phase: str
    """``forward`` (the module's output) or ``backward`` (the gradient of the loss w.r.t. it)."""
    module: str
    """Qualified name in the user's model (``blocks.1.attn``; ``""`` for the model itself), with
    ``#k`` for a later call and ``[i]`` for one of several outputs."""
    rank: int
    order: int
    """Position in execution order within its phase."""
    max_abs: float
    max_rel: float
    max_ulp: float
    mismatched: int
    numel: int

    @property
    def failed(self) -> bool:
        return self.mismatched > 0

    @property
    def display_name(self) -> str:
        return self.module or "(the model)"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Localization:
    """Where, inside the first diverging step, the candidate first left the reference."""

    step: int
    first: ModuleDiff | None = None
    modules: tuple[ModuleDiff, ...] = ()
    """Every module on every rank, forward then backward, each in execution order."""
    error: str = ""
    """Why the probe could not run (the ranks' text), when it could not."""
    duration_s: float = 0.0
    """Wall time of the re-runs on the ranks (both sides, through the probed step)."""

    def describe(self) -> str:
        if self.error:
            return f"not localized: {self.error.strip().splitlines()[0]}"
        first = self.first
        if first is None:
            count = len({(m.phase, m.module) for m in self.modules})
            return (
                f"no module diverges: the forward and backward of step {self.step} match on every rank "
                f"({count} module values compared); the difference arises after backward, in the "
                "gradient reduction, the scaler or the optimizer step"
            )
        return (
            f"first diverging module: {first.display_name}, {_PHASE_WORDS[first.phase]}, step {self.step}, "
            f"rank {first.rank}: abs {first.max_abs:.3g}, rel {first.max_rel:.3g}, {format_ulp(first.max_ulp)}"
        )

    def along(self, rank: int | None = None) -> list[ModuleDiff]:
        """The modules of one rank (the first diverging module's, else rank 0) in execution order."""
        if rank is None:
            rank = self.first.rank if self.first is not None else 0
        return [m for m in self.modules if m.rank == rank]


def _diff(
    phase: str,
    key: str,
    rank: int,
    order: int,
    want: torch.Tensor,
    got: torch.Tensor | None,
    profile: ToleranceProfile,
) -> ModuleDiff:
    if got is None or tuple(got.shape) != tuple(want.shape):  # structure differs: as far apart as can be
        inf = float("inf")
        return ModuleDiff(
            phase=phase,
            module=key,
            rank=rank,
            order=order,
            max_abs=inf,
            max_rel=inf,
            max_ulp=inf,
            mismatched=max(want.numel(), 1),
            numel=want.numel(),
        )
    diff = tensor_diff(want, got, profile, step=0, kind=phase, name=key)
    return ModuleDiff(
        phase=phase,
        module=key,
        rank=rank,
        order=order,
        max_abs=diff.max_abs,
        max_rel=diff.max_rel,
        max_ulp=diff.max_ulp,
        mismatched=diff.mismatched,
        numel=diff.numel,
    )


def locate(step: int, parts: list[dict[str, Any]], profile: ToleranceProfile) -> Localization:
    """The localization from every rank's ``localize.run_one`` dict (ordered by rank)."""
    errors = [part["error"] for part in parts if part.get("error")]
    duration = max((part.get("duration_s", 0.0) for part in parts), default=0.0)
    if errors:
        return Localization(step=step, error=errors[0], duration_s=duration)
    modules: list[ModuleDiff] = []
    for phase in PHASES:
        for rank, part in enumerate(parts):
            got = dict(part["candidate"][phase])
            for order, (key, want) in enumerate(part["reference"][phase]):
                modules.append(_diff(phase, key, rank, order, want, got.get(key), profile))
    failing = [m for m in modules if m.failed]
    first = min(failing, key=lambda m: (PHASES.index(m.phase), m.order, m.rank), default=None)
    return Localization(step=step, first=first, modules=tuple(modules), duration_s=duration)
