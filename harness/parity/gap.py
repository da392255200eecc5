"""The expected mixed-precision gap: how far a fp16/bf16 reference is from plain float32.

Why: a candidate that is bitwise equal to its bf16 reference says nothing about how far bf16
itself is from float32, which is what users weigh when they ask whether "close" losses are
acceptable. ``rank_side.run_one`` sends a float32 twin of each mixed-precision reference (same
workload, optimizer, data and faults; a cached reference run), and :func:`gap` measures the
distance. Pure.
"""

from __future__ import annotations

import dataclasses
import math

from harness.parity.record import RunRecord


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Gap:
    """How far one run is from another over every step, in relative and absolute terms: the
    *expected* gap between a mixed-precision reference and the same training in float32 (which
    includes the steps the low precision skipped on overflow and float32 did not)."""

    loss_max_abs: float
    loss_max_rel: float
    param_max_abs: float
    param_max_rel: float

    def describe(self) -> str:
        return f"loss rel {self.loss_max_rel:.2g}, params rel {self.param_max_rel:.2g}"


def gap(run: RunRecord, other: RunRecord) -> Gap:
    """The largest loss (any rank) and parameter differences of ``run`` from ``other``, over the
    steps both recorded. A parameter's relative difference is norm-wise (``||a - b|| / ||b||``:
    elementwise ratios explode on weights that happen to be near zero)."""
    loss_abs = loss_rel = param_abs = param_rel = 0.0
    for mine, theirs in zip(run.steps, other.steps, strict=False):
        for a, b in zip(mine.losses, theirs.losses, strict=True):
            loss_abs = max(loss_abs, abs(a - b))
            loss_rel = max(loss_rel, abs(a - b) / abs(b) if b else (0.0 if a == b else math.inf))
        for name, want in theirs.params.items():
            got = mine.params.get(name)
            if got is None or got.shape != want.shape:
                continue
            delta = got.double() - want.double()
            norm = float(want.double().norm())
            param_abs = max(param_abs, float(delta.abs().max()) if delta.numel() else 0.0)
            off = float(delta.norm())
            param_rel = max(param_rel, off / norm if norm else (0.0 if off == 0 else math.inf))
    return Gap(loss_max_abs=loss_abs, loss_max_rel=loss_rel, param_max_abs=param_abs, param_max_rel=param_rel)
