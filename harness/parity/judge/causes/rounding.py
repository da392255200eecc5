"""Known causes that are rounding, not sharding: a low-precision reduction summed in another
order, and Adam turning a gradient of rounding noise into a learning-rate-sized move.

Why their premise is the strictest of the catalogue: "it is only rounding" is the most expensive
sentence a report can print, since a reader who believes it dismisses the row. The shape of the
numbers (a few ulps, a gradient near zero) is what a real bug of the same size leaves too. So
each is named only when the staged check held at every stage from a common state: every rank's
loss and local gradients bitwise, every reduced element within the order-free bound, the update,
buffers and scale as required (``ranks/staged.py``). That measurement, and nothing weaker, shows
the difference to be rounding; ``reduce_order`` further needs the reduction not mirrored bitwise
(some element summed in another order than the reference's mirror). On a row where the staged
check found a stage differing, or did not judge the row, the pattern is ruled out, with why.
"""

from __future__ import annotations

import torch

from harness.parity.judge.evidence import Cause, Evidence, KnownCause
from harness.parity.judge.measured import Measured
from harness.parity.ranks.measure.ulp import short

_LOW = (torch.float16, torch.bfloat16)


def _ulps_of_largest(want: torch.Tensor, got: torch.Tensor, dtype: torch.dtype) -> float:
    """The largest ``|got - want|`` in units in the last place of ``dtype`` at the largest ``|want|``
    of the tensor: the scale a reduction's rounding error lives at."""
    largest = float(want.double().abs().max())
    if largest == 0 or not largest < float("inf"):
        return float("inf")
    exponent = torch.tensor(largest, dtype=torch.float64).frexp().exponent.item() - 1
    ulp = torch.finfo(dtype).eps * 2.0**exponent
    return float((got.double() - want.double()).abs().max()) / ulp


def reduce_order(e: Evidence) -> Cause | None:
    """Gradients summed over more than two ranks in float16/bfloat16, differing by no more than a
    few of that dtype's ulps at each tensor's scale: the addends were summed in another order.

    Why it is no bug by itself: on gloo each element is summed in an order set by its position in
    the reduced buffer (measured at world size 4: the element in the c-th quarter of the buffer
    adds ranks c+2, c+3, c+1, c). The reference reduces through its candidate's collectives on its
    candidate's buffers (``ranks/sides/reduce_layout.py``), so a candidate that reduces as FSDP does never
    shows this; one that reduces otherwise (a custom reduce hook or collective, another grouping
    of its buffers) does. Measured before the reference mirrored the layout, where it reduced one
    flat buffer: at step 0 of ``five_classes`` in bfloat16 on four ranks, a quarter to a half of
    every gradient's elements differed by one bfloat16 ulp at the tensor's largest magnitude; an
    element that nearly cancels keeps that absolute error and fails a relative tolerance, and a
    momentum buffer summing such gradients over steps can leave it while each gradient stays
    inside."""
    if e.reduce_dtype not in _LOW or e.world_size <= 2 or e.origin is None:
        return None
    if not e.failed & {"grad", "param", "optim_state"} or e.failed - {
        "grad",
        "param",
        "optim_state",
        "loss",
        "buffer",
    }:
        return None
    bound = 2 * (e.world_size - 1)
    worst, worst_name = 0.0, ""
    reference, candidate = e.origin
    for name, want in reference.grads.items():
        got = candidate.grads.get(name)
        if got is None or got.shape != want.shape or torch.equal(want, got):
            continue
        if not (want.isfinite().all() and got.isfinite().all()):
            return None
        ulps = _ulps_of_largest(want, got, e.reduce_dtype)
        if ulps > bound:
            return None
        if ulps > worst:
            worst, worst_name = ulps, name
    if not worst_name:
        return None
    dtype = short(e.reduce_dtype)
    grown = (
        f"; by step {e.candidate.step} the difference has grown past the profile"
        if candidate.step < e.candidate.step
        else ""
    )
    return Cause(
        name="reduce_order",
        evidence=(
            f"the gradients first differ at step {candidate.step}, every one within {bound} {dtype} ulps of "
            f"the reference at its tensor's largest magnitude (worst {worst_name}: {worst:.3g}), summed "
            f"over {e.world_size} ranks in {dtype}{grown}"
        ),
        explanation=(
            f"Summation order: {e.world_size} ranks' {dtype} gradients were summed in another order "
            "than the reference's, which reduces through FSDP's own collectives on FSDP's own buffers "
            f"(so a candidate reducing as FSDP does matches it bitwise); each order rounds to its own "
            f"{dtype} value. The candidate reduces otherwise: a custom reduce hook or collective, "
            "another grouping of its gradient buffers, or a backend whose order is not the buffer's "
            "alone (NCCL). An element that nearly cancels keeps that absolute error and fails a "
            "relative tolerance, and optimizer state accumulating it drifts further"
        ),
        reference="harness/parity/ranks/sides/reduce_layout.py",
    )


def noise_gradient(e: Evidence) -> Cause | None:
    """Parameters that move apart although their gradient is rounding noise (at most 1e-6 of the
    step's largest gradient): Adam divides each gradient by its own running RMS, so noise-sized
    last-bit differences become learning-rate-sized moves.

    Measured on ``tiny_conv`` (a convolution bias before a per-channel GroupNorm, whose true
    gradient is zero: |g| ~ 1e-9): FSDP1 with ``use_orig_params=True`` and ``Adam(fused=True)``
    rounds one element one float32 ulp away from DDP at step 1 (plain torch, one thread, no
    scaler: ``docs/repro/fused_adam_orig_params.py``; foreach Adam is bitwise, so it is torch's
    fused kernel, not the engine), the bias gradients then differ by a relative 2.7, and Adam moves
    those biases by 3e-5 to 9e-5, exactly as the parity rows report."""
    if not e.grads_compared or "param" not in e.failed:
        return None
    norms = {name: float(g.double().abs().max()) for name, g in e.reference.grads.items() if g.numel()}
    if not norms:
        return None
    largest = max(norms.values())
    moved = []
    for name, want in e.reference.params.items():
        got = e.candidate.params.get(name)
        if got is None or got.shape != want.shape or not want.is_floating_point():
            continue
        scale = float(want.double().abs().max()) or 1.0
        if float((got.double() - want.double()).abs().max()) > 1e-5 * scale:
            moved.append(name)
    if not moved or largest == 0 or any(norms.get(name, largest) > 1e-6 * largest for name in moved):
        return None
    shown = ", ".join(f"{name} (|grad| <= {norms[name]:.2g})" for name in moved[:3])
    return Cause(
        name="noise_gradient",
        evidence=(
            f"at step {e.candidate.step} the parameters that moved apart have gradients of rounding "
            f"noise, at most 1e-6 of the largest gradient ({largest:.2g}): {shown}"
        ),
        explanation=(
            "These parameters have no true gradient (a bias followed by a normalization that "
            "removes it, such as a convolution bias before a per-channel GroupNorm), so their "
            "gradient is rounding noise, and Adam, dividing each gradient by its own running RMS, "
            "turns a last-bit difference elsewhere (a fused kernel, a reduction order) into a "
            "learning-rate-sized move. Not a sharding bug: remove or freeze such a bias, or check "
            "parity with a non-fused optimizer"
        ),
        reference="harness/parity/judge/causes/rounding.py (noise_gradient)",
    )


def _summed_otherwise(measured: Measured) -> str | None:
    """``reduce_order``'s further premise: some reduced element's bits differ from the mirror."""
    if measured.reordered:
        return None
    return "the staged check found every reduced element bitwise equal to the reference's mirror: no order differed"


_HELD = "the staged check holding at every stage from a common state"

CAUSES = (
    KnownCause(
        name="reduce_order",
        premise=f"{_HELD}, with some reduced elements summed in another order than the mirror",
        rounding=True,
        also=_summed_otherwise,
        pattern=reduce_order,
    ),
    KnownCause(name="noise_gradient", premise=_HELD, rounding=True, pattern=noise_gradient),
)
"""The rounding causes, in the order the report lists them."""
