"""Distances in units in the last place (ULPs): how many representable values lie between two numbers.

Why ULPs next to abs/rel: "rel 3e-8" says nothing to a reader who does not know the dtype, while
"1 ulp" says the two runs differ in the last bit of one rounding, and "0 ulp" that they are
bitwise equal. The distance is exact, not estimated: each float is mapped to an integer that
counts the representable values from zero (the bit pattern for a positive float, its negation
for a negative one, so ``-0.0`` and ``0.0`` are both 0), and the distance is the difference of
those integers. Two NaNs are 0 apart, a NaN and a number infinitely far; ``inf`` is one ulp past
the largest finite value, as the bit patterns say.

Tensors of different dtypes (a buffer kept in float32 by one engine and cast to bfloat16 by the
other) are measured in the coarser dtype of the two, the one whose last place is larger.
"""

from __future__ import annotations

import math

import torch

_BITS = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
}


def short(dtype: torch.dtype) -> str:
    """``bfloat16`` for ``torch.bfloat16``: a dtype as the report writes it."""
    return str(dtype).removeprefix("torch.")


def coarser(a: torch.dtype, b: torch.dtype) -> torch.dtype:
    """The dtype of ``a`` and ``b`` with the larger unit in the last place (fewer mantissa bits)."""
    if a not in _BITS or b not in _BITS:
        return a if a in _BITS else b
    return a if torch.finfo(a).eps >= torch.finfo(b).eps else b


def _ordinal(values: torch.Tensor) -> torch.Tensor:
    """Each float's count of representable values from zero, signed, as int64."""
    bits = values.view(_BITS[values.dtype]).to(torch.int64)
    sign_bit = torch.iinfo(_BITS[values.dtype]).min  # the pattern of -0.0, as a signed integer
    return torch.where(bits < 0, sign_bit - bits, bits)


def same_bits(reference: torch.Tensor, candidate: torch.Tensor) -> bool:
    """Whether the two tensors have one dtype and shape and the same bits everywhere: every
    distance 0 (two NaNs of one pattern too), known without measuring any. Bits, not values:
    ``-0.0`` against ``0.0`` is not the same bits (its distance is 0 all the same, measured)."""
    if reference.dtype != candidate.dtype or reference.shape != candidate.shape:
        return False
    if candidate.device != reference.device:
        candidate = candidate.to(reference.device)
    if reference.dtype in _BITS:
        bits = _BITS[reference.dtype]
        return torch.equal(reference.detach().view(bits), candidate.detach().view(bits))
    return torch.equal(reference, candidate)


def distances(reference: torch.Tensor, candidate: torch.Tensor) -> torch.Tensor:
    """Elementwise ULP distance (float64: ``inf`` where exactly one of the two is NaN).

    Non-float tensors (integer state such as a step counter) count their difference as is."""
    dtype = coarser(reference.dtype, candidate.dtype)
    if dtype not in _BITS:
        return (candidate.double() - reference.double()).abs()
    ref = reference.detach().to("cpu", dtype).contiguous()
    cand = candidate.detach().to("cpu", dtype).contiguous()
    ref_nan, cand_nan = ref.isnan(), cand.isnan()
    # Exact in int64 when both have the same sign; across zero (where float64 ordinals could
    # overflow int64) the two magnitudes are added in float64 instead.
    a, b = _ordinal(cand), _ordinal(ref)
    same_side = (a < 0) == (b < 0)
    apart = torch.where(
        same_side, (a - torch.where(same_side, b, a)).abs().double(), a.double().abs() + b.double().abs()
    )
    apart = torch.where(ref_nan & cand_nan, torch.zeros_like(apart), apart)
    return torch.where(ref_nan ^ cand_nan, torch.full_like(apart, math.inf), apart)


def max_distance(reference: torch.Tensor, candidate: torch.Tensor) -> float:
    """The largest elementwise ULP distance (0.0 for empty tensors)."""
    apart = distances(reference, candidate)
    return float(apart.max()) if apart.numel() else 0.0


def of_floats(reference: float, candidate: float, dtype: torch.dtype = torch.float32) -> float:
    """The ULP distance of two Python numbers in ``dtype`` (a loss: the workload's float32 scalar)."""
    return max_distance(torch.tensor([reference], dtype=dtype), torch.tensor([candidate], dtype=dtype))


def label(max_ulp: float, *, passed: bool, close_limit: int = 64) -> str:
    """What a passing configuration measured: ``bitwise``, ``≤ N ulp`` (N the power of two at or
    above the largest distance, up to ``close_limit``), or ``toleranced`` (farther apart: it
    passed only because the profile's rtol/atol allowed it). Empty for a configuration that did
    not pass."""
    if not passed:
        return ""
    if max_ulp == 0:
        return "bitwise"
    if max_ulp <= close_limit:
        return f"≤ {2 ** math.ceil(math.log2(max_ulp))} ulp"
    return "toleranced"
