"""The clip norm check: each candidate rank's total norm from ``clip_grad_norm_`` against the
reference's, every step (path ``unscale_clip``; pure, controller side).

Why a tolerance of its own: the norm is one number summed from every gradient element, and the
engines sum in different orders. DDP's ``torch.nn.utils.clip_grad_norm_`` takes each full
gradient's norm, then the norm of those norms; FSDP1's ``clip_grad_norm_`` sums the squares of
each rank's local flat shard and all-reduces the sums; FSDP2's runs over DTensor shards, one
partial norm per rank, reduced. The same squares in another grouping round differently in float32.
Measured (gloo, world size 2, the MLP and the Llama-style decoder, fp32/fp16/bf16, FSDP1 flat and
original parameters, FSDP2): the candidate's norm equals the reference's or lies 1 or 2 float32
ULPs from it (relative 6e-8 to 1.2e-7), on rows whose gradients match bitwise. So a norm passes
within :data:`ORDER_ULPS` float32 ULPs (four times the largest measured), or within the profile's
``rtol`` where that is wider (a row whose gradients may differ has norms that differ as much).
A rank that clipped with its own shard's norm is off by a factor near ``sqrt(world size)``:
far outside either. Non-finite norms (an overflow step) match a non-finite reference norm.
"""

from __future__ import annotations

import math

from harness.parity.plan.profiles import ToleranceProfile
from harness.parity.ranks import ulp
from harness.parity.ranks.record import StepRecord

ORDER_ULPS = 8
"""Float32 ULPs two sums of the same squares in another order may differ by (measured: 2)."""


def agrees(want: float, got: float, profile: ToleranceProfile) -> bool:
    """Whether a candidate's norm ``got`` passes against the reference's ``want`` (the bound
    above; a test that moves a norm asks this to know whether its row must turn red)."""
    if not (math.isfinite(want) and math.isfinite(got)):
        return not math.isfinite(want) and not math.isfinite(got)
    if ulp.of_floats(want, got) <= ORDER_ULPS:
        return True
    return abs(got - want) <= profile.rtol * abs(want)


def problems(ref: StepRecord, cand: StepRecord, profile: ToleranceProfile) -> list[str]:
    """What is wrong with the candidate's clip norms at this step (empty: nothing, or no clip)."""
    if not ref.clip_norms and not cand.clip_norms:
        return []
    if not ref.clip_norms or not cand.clip_norms:
        who, other = ("candidate", "reference") if cand.clip_norms else ("reference", "candidate")
        return [f"the {who} clipped its gradients and the {other} did not"]
    want = ref.clip_norms[0]
    wrong = {rank: got for rank, got in enumerate(cand.clip_norms) if not agrees(want, got, profile)}
    if not wrong:
        return []
    said = ", ".join(f"rank {rank} {got!r}" for rank, got in wrong.items())
    return [
        f"clip norm {said}, reference {want!r} (allowed: {ORDER_ULPS} float32 ulp or rtol {profile.rtol:g})"
    ]
