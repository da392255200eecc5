"""Known causes in the gradient reduction itself (controller side, pure).

Why they can be told apart: the reference reduces through its candidate's own collectives on its
buffer layout (``ranks/sides/reduce_layout.py``), so a correct candidate's reduced gradients are
bitwise the reference's at any world size on gloo; and the staged check measures, from a common
state, each rank's local gradients before the reduction and every reduced element after it. Each
cause here blames the reduction, so its premise is that the reduction is where the first
difference was measured: the staged check's reduction stage (every loss and local gradient
bitwise before it), or, straight through, a step begun from a common state whose losses matched
and whose gradients did not (``divide_factor`` and ``reduced_in_lower_dtype`` read a pattern in
the reduced values that the local computation cannot give; ``reduction_differs`` needs a
localization from that state in which every module matched).

* ``divide_factor``: every gradient that differs is one constant ``k`` times the reference's.
* ``reduced_in_lower_dtype``: every element of the candidate's differing gradients is a float16 or
  bfloat16 value although its policy reduces in a wider dtype, and the reference's are not: the
  sum ran in the lower dtype (a reduce hook or a collective that casts, a policy whose
  ``reduce_dtype`` was dropped). Measured: an FSDP2 ``bf16-reduce32`` candidate whose
  reduce-scatter runs in bfloat16 at world size 4.
* ``reduction_differs``: every module's forward output and backward gradient matched on every
  rank, the reduced gradients did not (a rank's gradient left out, a wrong process group, a
  divide factor that is not one constant, a reduce hook). Measured: an FSDP2 candidate whose
  reduce-scatter drops the last rank's gradients, at world sizes 4 and 8.
"""

from __future__ import annotations

import torch

from harness.parity.judge.evidence import Cause, Evidence, KnownCause
from harness.parity.ranks.measure.ulp import short

_LOWER = (torch.bfloat16, torch.float16)


def _constant_factor(reference: torch.Tensor, candidate: torch.Tensor) -> float | None:
    """``k`` when ``candidate == k * reference`` elementwise (to 1e-3), ``None`` otherwise."""
    ref, cand = reference.double().flatten(), candidate.double().flatten()
    if not (ref.isfinite().all() and cand.isfinite().all()):
        return None
    if ((ref == 0) != (cand == 0)).any():
        return None
    nonzero = ref != 0
    if not nonzero.any():
        return None
    ratios = cand[nonzero] / ref[nonzero]
    k = float(ratios.median())
    if k == 0 or not bool(((ratios / k - 1).abs() <= 1e-3).all()):
        return None
    return k


def _some(names: list[str], total: int) -> str:
    """``the gradients of embed.weight, norm.weight (2 of 9; the others equal)``."""
    shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
    return f"the gradient of {shown} ({len(names)} of {total}; the others equal)"


def divide_factor(e: Evidence) -> Cause | None:
    """The ``divide_factor`` pattern: every differing gradient ``k`` times the reference's (the
    others equal: a factor set on some units only, as ``set_gradient_divide_factor`` on one
    ``fully_shard`` module does)."""
    if not e.grads_compared or "grad" not in e.failed:
        return None
    factors, scaled, unchanged = [], [], []
    for name, want in e.reference.grads.items():
        got = e.candidate.grads.get(name)
        if got is None or got.shape != want.shape:
            return None
        if torch.equal(want, got):
            if bool(want.ne(0).any()):
                unchanged.append(name)  # a unit that divides right (a factor set on some units only)
            continue
        k = _constant_factor(want, got)
        if k is None:
            return None
        factors.append(k)
        scaled.append(name)
    if not factors:
        return None
    k = factors[0]
    if abs(k - 1) < 1e-3 or any(abs(f / k - 1) > 1e-3 for f in factors):
        return None
    world = e.world_size
    note = ""
    if abs(k / world - 1) < 1e-3:
        note = f" (the world size, {world}: summed where the reference averages)"
    elif abs(k * world - 1) < 1e-3:
        note = f" (1 / the world size, {world}: divided once more than the reference)"
    which = _some(scaled, len(scaled) + len(unchanged)) if unchanged else "every gradient"
    return Cause(
        name="divide_factor",
        evidence=f"at step {e.candidate.step} {which} is {k:.4g}x the reference's{note}",
        explanation=(
            "A reduce/divide-factor mismatch: gradients summed instead of averaged, divided "
            "twice, or a loss divided by the world size by hand on one side only (FSDP's "
            "gradient_divide_factor, a custom reduce hook)"
        ),
        reference="torchtitan#2318",
    )


def _held_in(tensor: torch.Tensor, dtype: torch.dtype) -> bool:
    """Every element of ``tensor`` (a wider float) is a value of ``dtype``."""
    finite = tensor[tensor.isfinite()]
    return bool(torch.equal(finite.to(dtype).to(finite.dtype), finite))


def reduced_in_lower_dtype(e: Evidence) -> Cause | None:
    """The ``reduced_in_lower_dtype`` pattern (module docstring)."""
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


def reduction_differs(e: Evidence) -> Cause | None:
    """The ``reduction_differs`` pattern: the staged check found the reduction stage failing first
    (every rank's loss and local gradients bitwise), or a localization found every module's
    forward and backward equal on every rank (that it was from a common state and that the
    gradients are what differed is the premise, :data:`CAUSES`')."""
    found, measured = e.localization, e.measured
    if measured.source == "staged" and measured.stage == "reduction":
        evidence = (
            f"at step {measured.step}, from the same state, every rank's loss and local gradients match "
            f"bitwise and the reduction does not: {measured.detail}"
        )
    elif found is not None and found.first is None and not found.error and found.modules:
        evidence = (
            f"at step {found.step} the reduced gradients differ, while all "
            f"{len(found.modules)} module outputs and gradients compared on every rank match"
        )
    else:
        return None
    return Cause(
        name="reduction_differs",
        evidence=evidence,
        explanation=(
            "What each rank computed was the same, so the reduction across ranks was not: a rank's "
            "gradient left out or counted twice, a wrong process group or mesh dimension, a divide "
            "factor that is not one constant, or a custom reduce hook"
        ),
        reference="pytorch#155903; pytorch#167178",
    )


def never_reduced(e: Evidence) -> Cause | None:
    """The ``never_reduced`` pattern: the gradients that differ are exactly of parameters the
    candidate's function left under no ``fully_shard`` and no DDP (read off its modules)."""
    never = e.facts.never_reduced if e.facts is not None else ()
    if not e.grads_compared or "grad" not in e.failed or not never:
        return None
    differing = [
        n for n, want in e.reference.grads.items() if not torch.equal(want, e.candidate.grads.get(n, want))
    ]
    left = set(never)
    if not differing or not set(differing) <= left:
        return None
    return Cause(
        name="never_reduced",
        evidence=(
            f"at step {e.candidate.step} only the gradients of {_listed(differing)} differ, and your "
            "function left them under no fully_shard and no DDP"
        ),
        explanation=(
            "Parameters outside every fully_shard unit (a root never wrapped: embeddings, final norm, "
            "head) and outside DDP are never averaged across ranks: each rank steps its own gradient "
            "and the replicas drift apart. Call fully_shard on the root too, after the blocks"
        ),
        reference="torch.distributed.fsdp.fully_shard (apply to the root module last)",
    )


def _listed(names: list[str]) -> str:
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


_FROM_COMMON = "from a common state, the losses matching and the reduced gradients not"

CAUSES = (
    KnownCause(
        name="never_reduced",
        premise=f"the reduction differing first ({_FROM_COMMON})",
        blames=frozenset({"reduction", "gradients"}),
        pattern=never_reduced,
    ),
    KnownCause(
        name="divide_factor",
        premise=f"the reduction differing first ({_FROM_COMMON})",
        blames=frozenset({"reduction", "gradients"}),
        pattern=divide_factor,
    ),
    KnownCause(
        name="reduced_in_lower_dtype",
        premise=f"the reduction differing first ({_FROM_COMMON})",
        blames=frozenset({"reduction", "gradients"}),
        pattern=reduced_in_lower_dtype,
    ),
    KnownCause(
        name="reduction_differs",
        premise=(
            "the reduction differing first: from a common state every module's output and gradient "
            "matching on every rank (the staged check's local stage, or a localization), the reduced "
            "gradients not"
        ),
        blames=frozenset({"reduction"}),
        pattern=reduction_differs,
    ),
)
"""The reduction's causes, in the order the report lists them."""
