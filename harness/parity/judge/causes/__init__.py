"""Known causes: patterns over the recorded data that turn a divergence into an explanation, each
named only when its premise was measured.

Why a catalogue: the same few mistakes account for most sharded runs that drift from DDP, and
each leaves a recognisable trace in what the engine records anyway (per-rank skip decisions, the
losses, gradients, parameters, optimizer state and buffers of the first diverging step, the staged
check's stages, the localization). Each entry (:class:`~harness.parity.judge.evidence.KnownCause`)
is a pattern, the premise it stands on, a sentence saying what the pattern usually means and a
reference to read further. A pattern that matches is named only when its premise holds against
the row's own evidence (``measured.py``: where the first difference was measured from a common
state); one whose premise the evidence refutes is ruled out, with why, never printed as an
explanation. Pure, controller side.

One module a family, in the order a step runs:

* ``forward``: forward_differs, dtype_differs, loss_dtype_differs; autocast_differs (localization)
* ``loop``: clip_norm_sharded, clip_unscale_order, accumulation_dtype, checkpoint_rng
* ``reduction``: never_reduced, divide_factor, reduced_in_lower_dtype, reduction_differs
* ``update``: skip_desync, optimizer_only, buffers_only
* ``rounding``: reduce_order, noise_gradient (named only when the staged check held everywhere)
* ``resume``: resume_* (the candidate's own audit after the load)
* ``compiled``: compile_changes_numerics (a candidate compiled otherwise than its reference)
* ``function``: split_tie (read off a user's ``parallelize`` function)
* ``pipeline``: pp_zero_bubble_resharded, pp_microbatch_scaling, pp_tie_not_summed,
  pp_param_not_stepped, pp_stage_inputs_differ
* ``two_d``: tp_grad_not_reduced; tp_partial_not_reduced (localization); tp_plan_incomplete (a
  crash); divide_factor's explanation under HSDP
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from harness.parity.judge.causes import (
    compiled,
    forward,
    function,
    loop,
    pipeline,
    reduction,
    resume,
    rounding,
    two_d,
    update,
)
from harness.parity.judge.compare import Comparison
from harness.parity.judge.evidence import Cause, Evidence, KnownCause, RuledOut
from harness.parity.judge.measured import Measured, from_straight
from harness.parity.judge.pinpoint import Localization
from harness.parity.plan.config import ParityConfig
from harness.parity.ranks.measure.record import RunRecord

__all__ = ["CATALOGUE", "Cause", "Evidence", "KnownCause", "RuledOut", "Weighed", "match", "weigh"]

dtype_differences = forward.dtype_differences
localized = forward.localized

FAMILIES: tuple[KnownCause, ...] = (
    *forward.CAUSES,
    *loop.CAUSES,
    *reduction.CAUSES,
    *update.CAUSES,
    *rounding.CAUSES,
    *resume.CAUSES,
    *two_d.CAUSES,
    *pipeline.CAUSES,
    *compiled.CAUSES,
    *function.CAUSES,
    *forward.FROM_LOCALIZATION,
    *two_d.FROM_LOCALIZATION,
)
"""Every cause each family defines (a test checks that the catalogue lists each once)."""
_LISTED = (
    *(known.name for known in resume.CAUSES),  # a resume row's headline first
    "skip_desync",
    "pp_zero_bubble_resharded",
    "pp_microbatch_scaling",
    "pp_tie_not_summed",
    "pp_param_not_stepped",
    "pp_stage_inputs_differ",
    "split_tie",
    "never_reduced",
    "divide_factor",
    "compile_changes_numerics",  # before forward_differs: the more specific reading of a step-0 loss
    "forward_differs",
    "clip_norm_sharded",
    "clip_unscale_order",
    "accumulation_dtype",
    "checkpoint_rng",
    "dtype_differs",
    "loss_dtype_differs",
    "reduced_in_lower_dtype",
    "reduce_order",
    "noise_gradient",
    "optimizer_only",
    "buffers_only",
    "tp_grad_not_reduced",
    "reduction_differs",
    "autocast_differs",
    "tp_partial_not_reduced",
)
CATALOGUE: tuple[KnownCause, ...] = tuple({k.name: k for k in FAMILIES}[name] for name in _LISTED)
"""Every known cause read from the records and the localization, in the order the report lists
them (``tp_plan_incomplete``, read from a crash, is ``two_d.plan_incomplete``)."""

_MORE_SPECIFIC = {
    "reduction_differs": (
        "divide_factor",
        "reduced_in_lower_dtype",
        "never_reduced",
        "split_tie",
        "pp_tie_not_summed",
        "pp_microbatch_scaling",
    ),
    "forward_differs": ("split_tie", "checkpoint_rng", "pp_stage_inputs_differ"),
    "divide_factor": ("pp_microbatch_scaling",),
    "optimizer_only": ("pp_param_not_stepped",),
}
"""A cause left out when one that says more about the same stage is named."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Weighed:
    """The causes whose pattern matched: named (premise held) or ruled out (premise refuted)."""

    named: tuple[Cause, ...] = ()
    ruled_out: tuple[RuledOut, ...] = ()


def straight_measured(comparison: Comparison, why_not: str) -> Measured:
    """What the straight comparison alone measured (``measured.from_straight``)."""
    return from_straight(
        ((d.step, d.what, d.message) for d in comparison.divergences),
        ((s.step, s.max_ulp == 0 and not s.failed) for s in comparison.steps),
        why_not,
    )


def _origin(
    reference: RunRecord, candidate: RunRecord, step: int, poisoned_steps: frozenset[int]
) -> tuple[Any, Any] | None:
    """Both runs at the earliest step up to ``step`` whose gradients differ at all (steps with a
    planted fault or an overflow skipped)."""
    return next(
        (
            (want, got)
            for want, got in zip(reference.steps[: step + 1], candidate.steps, strict=False)
            if want.step not in poisoned_steps
            and all(bool(value.isfinite().all()) for value in want.grads.values())  # not an overflow
            and any(
                name in got.grads and not torch.equal(value, got.grads[name])
                for name, value in want.grads.items()
            )
        ),
        None,
    )


def weigh(
    reference: RunRecord,
    candidate: RunRecord,
    comparison: Comparison,
    *,
    poisoned_steps: frozenset[int] = frozenset(),
    reduce_dtype: torch.dtype | None = None,
    measured: Measured | None = None,
    localization: Localization | None = None,
    config: ParityConfig | None = None,
) -> Weighed:
    """Every cause whose pattern matches the first diverging step, named or ruled out by its
    premise against ``measured`` (default: what the straight comparison alone measured). The step
    is the straight comparison's first divergence, else (a row only the staged check failed) the
    step ``measured`` names; nothing when neither exists. ``reduce_dtype``: the dtype both runs sum
    their ranks' gradients in, when low precision."""
    if measured is None:
        measured = straight_measured(comparison, "the staged check did not judge this row")
    first = comparison.first
    step = first.step if first is not None else measured.step
    if step is None or step >= min(len(reference.steps), len(candidate.steps)):
        return Weighed()
    evidence = Evidence(
        reference=reference.steps[step],
        candidate=candidate.steps[step],
        failed=frozenset(d.what for d in comparison.divergences if d.step == step),
        world_size=len(candidate.steps[step].losses),
        grads_compared=step not in poisoned_steps,
        reduce_dtype=reduce_dtype,
        origin=_origin(reference, candidate, step, poisoned_steps),
        measured=measured,
        localization=localization,
        config=config,
        at_first=comparison.at_first,
        facts=candidate.facts,
    )
    found = [known.weigh(evidence) for known in CATALOGUE]
    named = tuple(c for c in found if isinstance(c, Cause))
    names = {c.name for c in named}
    named = tuple(c for c in named if not set(_MORE_SPECIFIC.get(c.name, ())) & names)
    ruled_out = tuple(c for c in found if isinstance(c, RuledOut))
    if config is not None:
        named = two_d.hsdp_factor(config, named)
    if localization is not None and localization.first is not None:
        named = localized(named, reference, candidate, localization.step, localization.first.module)
    return Weighed(named=named, ruled_out=ruled_out)


def match(
    reference: RunRecord, candidate: RunRecord, comparison: Comparison, **evidence: Any
) -> tuple[Cause, ...]:
    """The causes :func:`weigh` names (the ruled-out ones dropped)."""
    return weigh(reference, candidate, comparison, **evidence).named
