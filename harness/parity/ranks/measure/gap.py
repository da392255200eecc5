"""The expected mixed-precision gap: how far a fp16/bf16 reference is from plain float32.

Why: a candidate that is bitwise equal to its bf16 reference says nothing about how far bf16
itself is from float32, which is what users weigh when they ask whether "close" losses are
acceptable. ``entry.run_one`` runs a float32 twin of each mixed-precision reference (same
workload, optimizer, data and faults; a cached reference run) and measures the distance on the
ranks (:func:`of_steps`: each rank its own losses, rank 0 the parameters), so only four
numbers per rank travel, step by step as the candidate trains (``stepcheck.Check``);
:func:`merge` takes the largest over the ranks. :func:`gap` is the same measure over two merged records. Pure.
"""

from __future__ import annotations

import dataclasses
import math

from harness.parity.ranks.measure.record import RunRecord
from harness.parity.ranks.wire import Gap, Tensors


def _losses_and_params(
    pairs: list[tuple[list[float], list[float], Tensors | None, Tensors | None]],
) -> Gap:
    loss_abs = loss_rel = param_abs = param_rel = 0.0
    for mine_losses, their_losses, mine_params, their_params in pairs:
        for a, b in zip(mine_losses, their_losses, strict=True):
            loss_abs = max(loss_abs, abs(a - b))
            loss_rel = max(loss_rel, abs(a - b) / abs(b) if b else (0.0 if a == b else math.inf))
        for name, want in (their_params or {}).items():
            got = (mine_params or {}).get(name)
            if got is None or got.shape != want.shape:
                continue
            delta = got.double() - want.double()
            norm = float(want.double().norm())
            param_abs = max(param_abs, float(delta.abs().max()) if delta.numel() else 0.0)
            off = float(delta.norm())
            param_rel = max(param_rel, off / norm if norm else (0.0 if off == 0 else math.inf))
    return Gap(loss_max_abs=loss_abs, loss_max_rel=loss_rel, param_max_abs=param_abs, param_max_rel=param_rel)


def gap(run: RunRecord, other: RunRecord) -> Gap:
    """The largest loss (any rank) and parameter differences of ``run`` from ``other``, over the
    steps both recorded. A parameter's relative difference is norm-wise (``||a - b|| / ||b||``:
    elementwise ratios explode on weights that happen to be near zero)."""
    return _losses_and_params(
        [
            (list(mine.losses), list(theirs.losses), mine.params, theirs.params)
            for mine, theirs in zip(run.steps, other.steps, strict=False)
        ]
    )


def of_steps(
    steps: list[tuple[float, float, Tensors | None, Tensors | None]],
) -> Gap:
    """:func:`gap` on one rank's steps (``(loss, other's loss, parameters, other's parameters)``,
    parameters where the rank measures them: rank 0), for :func:`merge`. The measure is a running
    maximum, so steps may come one at a time and the largest of each kept (``merge``)."""
    return _losses_and_params([([a], [b], p, q) for a, b, p, q in steps])


def merge(parts: list[Gap]) -> Gap:
    """The largest of every rank's (or every step's) :func:`of_steps`, field by field."""
    return Gap(
        **{field.name: max(getattr(part, field.name) for part in parts) for field in dataclasses.fields(Gap)}
    )
