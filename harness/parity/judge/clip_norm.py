"""The clip norm check: each candidate rank's total norm from ``clip_grad_norm_`` against the
reference's, every step (path ``unscale_clip``; pure, controller side).

Why a tolerance of its own: the norm is one number summed from every gradient element, and the
engines sum in different orders. DDP's ``torch.nn.utils.clip_grad_norm_`` takes each full
gradient's norm, then the norm of those norms; FSDP1's ``clip_grad_norm_`` sums the squares of
each rank's local flat shard and all-reduces the sums; FSDP2's runs over DTensor shards, one
partial norm per rank, reduced. The same squares in another grouping round differently in float32.
Measured (gloo, world size 2, the MLP and the Llama-style decoder, fp32/fp16/bf16, FSDP1 flat and
original parameters, FSDP2): the candidate's norm equals the reference's or lies 1 or 2 float32
ULPs from it (relative 6e-8 to 1.2e-7), on rows whose gradients match bitwise; at world size 4,
on a tiny Hugging Face Mixtral under FSDP1 (hundreds of thousands of squares), 2.3e-6 apart. So a
norm passes within :data:`ORDER_ULPS` float32 ULPs, or within what any order of summation can
give (:func:`order_free_bound`, a proof, not a measurement), or within the profile's ``rtol``
where that is wider (a row whose gradients may differ has norms that differ as much). A rank
that clipped with its own shard's norm is off by a factor near ``sqrt(world size)``, one that
clipped before ``unscale_`` by the loss scale: far outside all three. Non-finite norms (an
overflow step) match a non-finite reference norm.
"""

from __future__ import annotations

import math

from harness.parity.plan.profiles import ToleranceProfile
from harness.parity.ranks.measure import ulp
from harness.parity.ranks.measure.record import StepRecord

ORDER_ULPS = 8
"""Float32 ULPs two sums of the same squares in another order may differ by (measured: 2)."""


def order_free_bound(elements: int) -> float:
    """How far apart, relatively, two float32 2-norms of the same ``elements`` squares may be,
    whatever the grouping of their sums (Higham, *Accuracy and Stability of Numerical
    Algorithms*, 4.2: a sum of n non-negative terms in any order is within ``gamma_{n-1}`` of the
    exact sum, relative to the sum; a few more roundings for the partial norms taken, squared
    again and the square root), for each of the two norms: ``gamma_{n+4} + 2u``, ``u = 2**-24``."""
    unit = 2.0**-24
    terms = max(elements, 0) + 4
    return terms * unit / (1 - terms * unit) + 2 * unit


def agrees(want: float, got: float, profile: ToleranceProfile, elements: int = 0) -> bool:
    """Whether a candidate's norm ``got`` passes against the reference's ``want`` (the bounds
    above; ``elements``: how many gradient elements the norm sums; a test that moves a norm asks
    this to know whether its row must turn red)."""
    if not (math.isfinite(want) and math.isfinite(got)):
        return not math.isfinite(want) and not math.isfinite(got)
    if ulp.of_floats(want, got) <= ORDER_ULPS:
        return True
    allowed = max(profile.rtol, order_free_bound(elements) if elements else 0.0)
    return abs(got - want) <= allowed * abs(want)


def _elements(record: StepRecord) -> int:
    return sum(math.prod(shape) for shape, _ in record.shapes("grad").values())


def problems(ref: StepRecord, cand: StepRecord, profile: ToleranceProfile) -> list[str]:
    """What is wrong with the candidate's clip norms at this step (empty: nothing, or no clip)."""
    if not ref.clip_norms and not cand.clip_norms:
        return []
    if not ref.clip_norms or not cand.clip_norms:
        who, other = ("candidate", "reference") if cand.clip_norms else ("reference", "candidate")
        return [f"the {who} clipped its gradients and the {other} did not"]
    want = ref.clip_norms[0]
    elements = _elements(ref)
    wrong = {
        rank: got for rank, got in enumerate(cand.clip_norms) if not agrees(want, got, profile, elements)
    }
    if not wrong:
        return []
    said = ", ".join(f"rank {rank} {got!r}" for rank, got in wrong.items())
    allowed = max(profile.rtol, order_free_bound(elements) if elements else 0.0)
    return [
        f"clip norm {said}, reference {want!r} (allowed: {ORDER_ULPS} float32 ulp or relative "
        f"{allowed:.3g}, what any order of summing {elements} squares can give, or the profile's rtol)"
    ]
