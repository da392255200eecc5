"""What a known cause is, and what its pattern sees (shared by ``causes`` and ``rounding``).

Why its own module: the catalogue's patterns live in more than one module (the rounding ones in
``rounding.py``), and each needs these two types without importing the catalogue.
"""

from __future__ import annotations

import dataclasses

import torch

from harness.parity.ranks.measure.record import StepRecord


def short(dtype: torch.dtype) -> str:
    """``bfloat16`` for ``torch.bfloat16``."""
    return str(dtype).removeprefix("torch.")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Cause:
    """A known cause that matches a divergence."""

    name: str
    """``skip_desync``, ``divide_factor``, ``forward_differs``, ``dtype_differs``, ``reduce_order``,
    ``noise_gradient``, ``optimizer_only``, ``buffers_only``, ``loss_dtype_differs`` or
    ``clip_norm_sharded``, ``clip_unscale_order``, ``accumulation_dtype`` or ``checkpoint_rng``
    (``loop_causes.py``), ``reduced_in_lower_dtype`` (``reduce_causes.py``); from a localization,
    ``autocast_differs`` (``recipe_causes.py``) and ``reduction_differs`` (``reduce_causes.py``);
    a resume row's ``resume_*`` (``resume_causes.py``)."""
    evidence: str
    """What in the records matched, with numbers."""
    explanation: str
    """What the pattern usually means."""
    reference: str
    """Where to read more (an issue, a document)."""

    def describe(self) -> str:
        return f"known cause ({self.name}): {self.evidence}. {self.explanation} ({self.reference})"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Evidence:
    """What a pattern sees: both runs at the first diverging step, and what failed there."""

    reference: StepRecord
    candidate: StepRecord
    failed: frozenset[str]
    """The ``what`` of every divergence at that step."""
    world_size: int
    grads_compared: bool
    """False at a step with a planted fault (its gradients hold the planted value)."""
    reduce_dtype: torch.dtype | None = None
    """The dtype both runs sum their ranks' gradients in (``None``: not known, or float32)."""
    origin: tuple[StepRecord, StepRecord] | None = None
    """Both runs at the earliest step, up to this one, whose gradients differ at all (steps with a
    planted fault or an overflow skipped): where a difference that grew began."""
