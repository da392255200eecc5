"""Known causes of 2-D rows: a TP reduction missing, a plan that leaves a module out, HSDP's
replicas summed instead of averaged.

Why a family of its own: these read what only a 2-D row has, its mesh and the workload's plan
(which module is split how) next to the localization, the candidate's error or a cause the
catalogue found, so they need the configuration and not only the two records. Controller side;
resolving the plan builds the workload's model once (only for a failed TP row).

* ``tp_partial_not_reduced``: the first module whose output differs (forward, at the first
  diverging step) is one the plan splits by rows (``RowwiseParallel``): its output is a sum of
  partial products across the TP group, and the reference computes that sum; a candidate whose
  output differs there did not sum them (a missing all-reduce, a style whose output layout is
  not ``Replicate``).
* ``divide_factor`` under HSDP (:func:`hsdp_factor`): the catalogue's cause, its explanation
  narrowed to HSDP's two stages (averaged within the shard group, and again across the replicas).
* ``tp_grad_not_reduced`` (:func:`grad_not_reduced`): at step 0 the losses match but the gradient
  of a parameter the plan does not split differs: a parameter replicated across the TP group whose
  gradient was computed from a TP rank's share (of the positions, under a sequence-parallel plan)
  and never summed across the group (a norm left out of ``SequenceParallel``).
* ``tp_plan_incomplete``: a TP candidate crashed on a shape mismatch: a module the model's code
  needs split was left out of the plan, so it got a TP rank's share of its input (or of the heads)
  and a whole weight.

Premises: ``tp_partial_not_reduced`` blames the forward, so the first diverging module must come
from a common state (the row's first difference measured in the loss or local stage);
``tp_grad_not_reduced`` blames the gradients at step 0 (a common state by construction) with every
loss equal; ``tp_plan_incomplete`` stands on the candidate's own error text.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from harness.parity.judge.evidence import Cause, Evidence, KnownCause
from harness.parity.plan.config import ParityConfig
from harness.parity.workload import registry, tp_plan

_SHAPES = re.compile(
    r"size of tensor a \(\d+\) must match|shapes cannot be multiplied|mat1 and mat2|"
    r"shape '\[.*\]' is invalid for input|Expected size|doesn't match the broadcast shape"
)
"""What a shape mismatch says in torch 2.13 (elementwise, matmul, view, broadcast)."""


def _styles(config: ParityConfig) -> dict[str, Any]:
    """``{module name: ParallelStyle}`` of the workload's plan over a freshly built model."""
    workload = registry.get(config.workload)
    model = registry.build_model(workload, config.seed)
    plan = tp_plan.resolve(workload, model)
    return dict(tp_plan.styled_modules(plan, model))


def partial_not_reduced(e: Evidence) -> Cause | None:
    """The ``tp_partial_not_reduced`` pattern: the first diverging module of a TP row is split by
    rows in its plan."""
    config, localization = e.config, e.localization
    first = localization.first if localization is not None else None
    if (
        config is None
        or config.mesh.tp is None
        or localization is None
        or first is None
        or first.phase != "forward"
    ):
        return None
    from torch.distributed.tensor.parallel import RowwiseParallel

    module = first.module.split("#")[0].split("[")[0]
    style = _styles(config).get(module)
    if not isinstance(style, RowwiseParallel):
        return None
    return Cause(
        name="tp_partial_not_reduced",
        evidence=(
            f"at step {localization.step} the first module whose output differs is {module!r}, which the "
            f"TP plan splits by rows ({type(style).__name__}); max abs {first.max_abs:.3g} over {first.mismatched} / "
            f"{first.numel} elements"
        ),
        explanation=(
            "A RowwiseParallel linear computes partial products on each TP rank, and its output is their "
            "sum across the TP group; the reference (the same linear split the same way, summed over "
            "the same group in the same order) differs from the candidate's there, so the partial sums "
            "were not reduced as the plan says: a missing all-reduce, one over another group than the "
            "TP group (a mesh dimension mixed up), or an output layout other than Replicate handed on "
            "as if it were whole"
        ),
        reference="torch.distributed.tensor.parallel.RowwiseParallel",
    )


def plan_incomplete(config: ParityConfig, candidate_error: str | None) -> Cause | None:
    """The ``tp_plan_incomplete`` cause when a TP candidate raised on a shape mismatch."""
    if config.mesh.tp is None or not candidate_error:
        return None
    found = _SHAPES.search(candidate_error)
    if found is None:
        return None
    line = next(
        (text.strip() for text in candidate_error.splitlines() if found.group(0) in text), found.group(0)
    )
    return Cause(
        name="tp_plan_incomplete",
        evidence=f"the TP candidate raised on a shape mismatch: {line[:200]}",
        explanation=(
            "A module the model's code needs split was left out of the TP plan (or split another way "
            "than its neighbours): it received a TP rank's share of its input, or of the heads, and a "
            "whole weight. Every linear between a ColwiseParallel and the RowwiseParallel that closes "
            "the block must be in the plan (Megatron's pairs: q, k, v with o; gate, up with down)"
        ),
        reference="torch.distributed.tensor.parallel.parallelize_module",
    )


def hsdp_factor(config: ParityConfig, found: tuple[Cause, ...]) -> tuple[Cause, ...]:
    """``found`` with a ``divide_factor`` cause of an HSDP row explained in HSDP's terms."""
    if config.mesh.hsdp is None:
        return found
    shard = config.world_size // config.mesh.hsdp
    note = (
        f". Under HSDP ({config.mesh.hsdp} replicas x {shard} shards) FSDP2 averages within the shard group "
        f"(reduce-scatter) and again across the replicas (all-reduce): gradients {config.mesh.hsdp}x the "
        "reference's were summed across the replicas, as FSDP's divide factor (the shard group's size) "
        "used for HSDP does (pytorch/pytorch#155903), or as a factor lost at a sharding degree of 1 "
        "does (pytorch/pytorch#167178)"
    )
    return tuple(
        dataclasses.replace(cause, explanation=cause.explanation + note)
        if cause.name == "divide_factor"
        else cause
        for cause in found
    )


def grad_not_reduced(e: Evidence) -> Cause | None:
    """The ``tp_grad_not_reduced`` pattern: a TP row whose first divergence is at step 0, with
    every rank's loss bitwise equal, on gradients of parameters of modules the plan leaves whole."""
    config = e.config
    if config is None or config.mesh.tp is None or e.candidate.step != 0:
        return None
    if list(e.reference.losses) != list(e.candidate.losses):
        return None
    differing = [d.name for d in e.at_first if d.kind == "grad" and d.mismatched]
    if not differing:
        return None
    styles = _styles(config)
    whole = [name for name in differing if name.rsplit(".", 1)[0] not in styles]
    if not whole:
        return None
    from torch.distributed.tensor.parallel import SequenceParallel

    sequence = any(isinstance(style, SequenceParallel) for style in styles.values())
    modules = sorted({name.rsplit(".", 1)[0] for name in whole})
    return Cause(
        name="tp_grad_not_reduced",
        evidence=(
            f"at step 0 every loss matches, but the gradients of {', '.join(whole[:4])} differ, and the TP "
            f"plan leaves {', '.join(modules[:4])} whole"
            + (" under a sequence-parallel plan" if sequence else "")
        ),
        explanation=(
            "A parameter replicated on every TP rank whose gradient was computed from that rank's share "
            "(of the positions, under sequence parallelism) and never summed across the TP group: FSDP "
            "reduces it over the data-parallel group only. "
            + (
                f"Under a sequence-parallel plan, make {modules[0]} SequenceParallel (its weight's "
                "gradient is then summed across the group)"
                if sequence
                else "Put the module in the plan, or all-reduce its gradient over the TP group"
            )
        ),
        reference="torch.distributed.tensor.parallel.SequenceParallel",
    )


CAUSES = (
    KnownCause(
        name="tp_grad_not_reduced",
        premise="the gradients differing first at step 0 (a common state), every loss equal",
        blames=frozenset({"gradients", "reduction", "local"}),
        pattern=grad_not_reduced,
    ),
)
"""The 2-D causes read from the step records."""

FROM_LOCALIZATION = (
    KnownCause(
        name="tp_partial_not_reduced",
        premise="the first diverging module found from a common state (the loss or local stage differing first)",
        blames=frozenset({"loss", "local"}),
        pattern=partial_not_reduced,
    ),
)
"""The 2-D causes read from a localization."""
