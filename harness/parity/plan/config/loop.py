"""The training loop a configuration runs: the path through the scaler, clipping, gradient
accumulation and activation checkpointing.

Why a part: each loop feature has rules against the engine and the others (accumulation checks an
FSDP candidate against its DDP twin; a max norm applies to the clipping path only), and the loop
owns them, its words in the id and its share of the reference key.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from harness.parity.plan.config.axes import CHECKPOINTS, PATHS, SYNCS, choice

if TYPE_CHECKING:
    from harness.parity.plan.config import ParityConfig


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Loop:
    """``Loop()`` is ``scale -> backward -> step -> update`` with one microbatch."""

    path: str = "plain"
    """``plain``, ``unscale_clip`` or ``two_optimizers`` (``axes.PATHS``)."""
    clip: float = 1.0
    """The ``max_norm`` of ``clip_grad_norm_`` on path ``unscale_clip`` (the CLI's ``--clip NORM``);
    named in the id when it is not 1.0, so the rows that clip at 1.0 keep their ids."""
    accumulate: int = 1
    """Microbatches per optimizer step (gradient accumulation, ``ranks/sides/accumulate.py``); named in
    the id when more than 1 (``acc4``)."""
    sync: str = "every"
    """With ``accumulate > 1``: reduce ``every`` microbatch, or only the ``last`` (DDP and FSDP1
    ``no_sync()``, FSDP2 ``set_requires_gradient_sync(False)``; ``synclast`` in the id)."""
    checkpoint: str | None = None
    """Activation checkpointing of the units on both sides (``ranks/sides/checkpoint.py``): ``replay``
    (RNG state preserved), ``no_replay`` (the candidate's recompute draws new dropout masks; the
    reference always replays); ``ckpt``/``ckpt_norng`` in the id."""

    def __post_init__(self) -> None:
        choice("path", self.path, PATHS)
        choice("sync", self.sync, SYNCS)
        choice("checkpoint", self.checkpoint, CHECKPOINTS)
        if not self.clip > 0:
            raise ValueError(f"clip must be a max norm > 0, got {self.clip}")
        if self.clip != 1.0 and self.path != "unscale_clip":
            raise ValueError(f"clip={self.clip} clips on path='unscale_clip' only, not {self.path!r}")
        if self.accumulate < 1:
            raise ValueError(f"accumulate must be >= 1 microbatch, got {self.accumulate}")
        if self.accumulate == 1 and self.sync != "every":
            raise ValueError(f"sync={self.sync!r} needs accumulate > 1 (one microbatch always syncs)")

    def check(self, config: ParityConfig) -> None:
        """Refuse accumulation where the reference cannot mirror it."""
        if config.engine == "user" and self.checkpoint is not None:
            raise ValueError(
                "engine='user' checkpoints activations where the workload's parallelize function does "
                f"(checkpoint_wrapper, or torch's checkpoint in it): leave checkpoint None, got {self.checkpoint!r}"
            )
        if self.accumulate == 1:
            return
        if config.engine == "user":
            return  # the function's own layout, read on the ranks: its reference mirrors it
        if config.engine == "ddp" or config.reference != "ddp":
            raise ValueError(
                "accumulate > 1 checks an FSDP candidate against its DDP reference (engine='fsdp1' "
                "or 'fsdp2'): DDP's own reducer re-reduces the earlier microbatches' sum"
            )
        mixed = config.precision.mixed
        if mixed is not None and mixed.keep_low_precision_grads:
            raise ValueError("accumulate > 1 with keep_low_precision_grads is not emulated by the reference")

    def id_parts(self) -> list[str]:
        """``unscale_clip``, ``clip0.05``, ``acc2-synclast``, ``ckpt``/``ckpt_norng``: what differs
        from the plain loop."""
        parts = [self.path] if self.path != "plain" else []
        if self.clip != 1.0:
            parts.append(f"clip{self.clip:g}")
        if self.accumulate > 1:
            parts.append(f"acc{self.accumulate}" + ("-synclast" if self.sync == "last" else ""))
        if self.checkpoint is not None:
            parts.append("ckpt" if self.checkpoint == "replay" else "ckpt_norng")
        return parts

    def reference_key(self) -> tuple[object, ...]:
        """The reference runs the same loop; it always replays the RNG when it checkpoints."""
        return (self.path, self.clip, self.accumulate, self.sync, self.checkpoint is not None)
