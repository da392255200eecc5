"""Rows of the training loop's features: ``clip_grad_norm_`` after ``unscale_`` at a chosen norm.

Why apart from the precision matrices (``matrix.py``, ``workload_matrix.py``): a loop feature is
one more axis over a few engine layouts, in the default matrix (a few rows, so ``make parity``
keeps its wall time) and in a workload's own matrix (the user's feature under every layout); both
draw their rows from here.
"""

from __future__ import annotations

from harness.parity.plan import recipe as recipes
from harness.parity.plan.config import ParityConfig

BITING_CLIP = 0.05
"""A max norm the MLP's gradients exceed (their total norm is 0.06 to 0.14 over six steps,
measured), so the clip scales them at every step: the default rows clip for real, where 1.0
(``unscale_clip``'s default) never bites on the MLP."""


def default_rows(*, world_size: int = 2, backend: str = "gloo") -> list[ParityConfig]:
    """The default matrix's loop rows: FSDP1 (flat, fp16) and FSDP2 (resharding, bf16) clipping
    at :data:`BITING_CLIP` after ``unscale_``."""
    common = {"world_size": world_size, "backend": backend, "path": "unscale_clip", "clip": BITING_CLIP}
    return [
        ParityConfig(
            engine="fsdp1", sharding="full_shard", use_orig_params=False, precision="fp16", **common
        ),  # type: ignore[arg-type]
        ParityConfig(engine="fsdp2", reshard_after_forward=True, precision="bf16", **common),  # type: ignore[arg-type]
    ]


def workload_rows(
    common: dict[str, object],
    layouts: list[dict[str, object]],
    optimizers: tuple[str, ...],
    recipe: str | None,
    clip: float | None,
) -> list[ParityConfig]:
    """A workload's loop rows: clipping after ``unscale_`` at ``clip`` (1.0 when the user named
    none) in the user's ``recipe`` (float32 when none), under each of ``layouts``."""
    kind, precision = recipes.parse(recipe) if recipe is not None else ("pure", "fp32")
    return [
        ParityConfig(
            recipe=kind,
            precision=precision,
            optimizer=opt,
            path="unscale_clip",
            clip=1.0 if clip is None else clip,
            **layout,  # type: ignore[arg-type]
            **common,  # type: ignore[arg-type]
        )
        for opt in optimizers
        for layout in layouts
    ]
