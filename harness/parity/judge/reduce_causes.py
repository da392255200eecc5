"""Known causes in the gradient reduction itself (controller side, pure).

Why they can be told apart now: the reference reduces through its candidate's own collectives on
its buffer layout (``ranks/sides/reduce_layout.py``), so a correct candidate's reduced gradients are
bitwise the reference's at any world size on gloo. Where they differ while everything computed on
each rank matched, the reduction is the place to look:

* ``reduced_in_lower_dtype``: at the first step whose gradients differ, every loss matched and
  every element of the candidate's gradients is a float16 or bfloat16 value although its policy
  reduces in a wider dtype, and the reference's are not: the sum ran in the lower dtype (a reduce
  hook or a collective that casts, a policy whose ``reduce_dtype`` was dropped). Measured: an FSDP2
  ``bf16-reduce32`` candidate whose reduce-scatter runs in bfloat16 at world size 4.
* ``reduction_differs`` (read from a localization): the gradients differ at a step where every
  module's forward output and backward gradient matched on every rank: the local computation was
  the same, so its reduction was not (a rank's gradient left out, a wrong process group, a divide
  factor that is not one constant, a reduce hook). Measured: an FSDP2 candidate whose
  reduce-scatter drops the last rank's gradients, at world sizes 4 and 8.
"""

from __future__ import annotations

import torch

from harness.parity.judge.evidence import Cause, Evidence, short
from harness.parity.judge.pinpoint import Localization

_LOWER = (torch.bfloat16, torch.float16)


def _held_in(tensor: torch.Tensor, dtype: torch.dtype) -> bool:
    """Every element of ``tensor`` (a wider float) is a value of ``dtype``."""
    finite = tensor[tensor.isfinite()]
    return bool(torch.equal(finite.to(dtype).to(finite.dtype), finite))


def reduced_in_lower_dtype(e: Evidence) -> Cause | None:
    """The ``reduced_in_lower_dtype`` cause (module docstring), else ``None``."""
    if e.origin is None or not e.grads_compared:
        return None
    want, got = e.origin
    if list(want.losses) != list(got.losses):
        return None  # the forward differs: not the reduction's doing
    wide = e.reduce_dtype or torch.float32
    grads = [(name, w, got.grads[name]) for name, w in want.grads.items() if name in got.grads]
    grads = [
        (n, w, g)
        for n, w, g in grads
        if g.is_floating_point() and g.dtype.itemsize > 2 and not torch.equal(w, g)
    ]
    if not grads:
        return None
    for dtype in _LOWER:
        if dtype.itemsize >= torch.empty((), dtype=wide).element_size():
            continue
        if all(_held_in(g, dtype) for _, _, g in grads) and not all(_held_in(w, dtype) for _, w, _ in grads):
            return Cause(
                name="reduced_in_lower_dtype",
                evidence=(
                    f"at step {got.step} every loss matches, and every element of the {len(grads)} "
                    f"gradients that differ is a {short(dtype)} value in the candidate, while the "
                    f"reference's, reduced in {short(wide)}, are not"
                ),
                explanation=(
                    f"The gradients were summed across ranks in {short(dtype)}, not in the policy's "
                    f"{short(wide)}: a reduce hook or collective that casts, or a mixed-precision policy "
                    "whose reduce_dtype did not reach the reduction"
                ),
                reference="torch FSDP MixedPrecisionPolicy(reduce_dtype); torchtitan mixed_precision_reduce",
            )
    return None


def reduction_differs(localization: Localization, first_what: str) -> Cause | None:
    """The ``reduction_differs`` cause when ``localization`` (of the first step whose gradients
    differ) found every module's forward and backward equal on every rank, and the first
    divergence is in the gradients; else ``None``."""
    if localization.first is not None or localization.error or first_what != "grad":
        return None
    if not localization.modules:
        return None
    return Cause(
        name="reduction_differs",
        evidence=(
            f"at step {localization.step} the reduced gradients differ, while all "
            f"{len(localization.modules)} module outputs and gradients compared on every rank match"
        ),
        explanation=(
            "What each rank computed was the same, so the reduction across ranks was not: a rank's "
            "gradient left out or counted twice, a wrong process group or mesh dimension, a divide "
            "factor that is not one constant, or a custom reduce hook"
        ),
        reference="pytorch#155903; pytorch#167178",
    )
