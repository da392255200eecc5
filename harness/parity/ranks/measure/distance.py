"""How far one tensor is from another: max abs, max rel, mismatches under a profile, and ULPs.

Why on the rank side: the ranks measure too (the op-level localization compares each op's output
where it was computed), and the judge reads the same numbers; one copy of the measurement keeps a
distance the same wherever it was taken. Pure: no processes, no collectives.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from harness.parity.plan.profiles import ToleranceProfile
from harness.parity.ranks.measure import ulp
from harness.parity.ranks.wire import Partial


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class TensorDiff:
    """How far one candidate tensor is from the reference's, at one step."""

    step: int
    kind: str
    """``param``, ``grad``, ``optim_state``, ``buffer`` or ``loss``."""
    name: str
    """Parameter name (``inner.0.linear.weight``), with the state key for optimizer state
    (``inner.0.linear.weight:exp_avg``) and the rank for buffers (``bn.running_mean [rank 1]``)."""
    max_abs: float
    max_rel: float
    mismatched: int
    numel: int
    max_ulp: float = 0.0
    """The largest distance in units in the last place of the tensor's dtype (``inf``: NaN
    against a number)."""

    def describe(self) -> str:
        return (
            f"{self.kind} {self.name}: {self.mismatched} / {self.numel} mismatched; "
            f"max abs {self.max_abs:.3g}, max rel {self.max_rel:.3g}, {format_ulp(self.max_ulp)}"
        )


def format_ulp(value: float) -> str:
    """``0 ulp``, ``3 ulp``, ``1.2e+06 ulp``, ``inf ulp``."""
    if not math.isfinite(value):
        return f"{value} ulp"
    return f"{value:.0f} ulp" if value < 1e6 else f"{value:.2g} ulp"


def equal_diff(numel: int, *, step: int = 0, kind: str = "", name: str = "") -> TensorDiff:
    """The distance of a tensor bitwise equal to the reference's: nothing apart, 0 ulp."""
    return TensorDiff(step=step, kind=kind, name=name, max_abs=0.0, max_rel=0.0, mismatched=0, numel=numel)


def tensor_diff(
    reference: torch.Tensor,
    candidate: torch.Tensor,
    profile: ToleranceProfile,
    *,
    step: int,
    kind: str,
    name: str,
) -> TensorDiff:
    """Elementwise comparison in float64 (``exact``: every element equal); NaN matches NaN."""
    ref = reference.detach().to("cpu")
    cand = candidate.detach().to("cpu")
    if ref.dtype == cand.dtype and not ref.is_sparse and not cand.is_sparse and torch.equal(ref, cand):
        # The common case of a passing run, and the cheap one: bitwise equal, 0 ulp.
        return equal_diff(ref.numel(), step=step, kind=kind, name=name)
    if ref.is_sparse:
        ref = ref.to_dense()
    if cand.is_sparse:
        cand = cand.to_dense()
    r = ref.double()
    c = cand.double()
    both_nan = r.isnan() & c.isnan()
    if profile.bitwise:
        same = (ref == cand) | both_nan
    else:  # a non-finite value must be matched exactly: inf - (-inf) is within no tolerance
        finite = r.isfinite() & c.isfinite()
        close = (c - r).abs() <= profile.atol + profile.rtol * r.abs()
        same = torch.where(finite, close, (c == r) | both_nan)
    equal = both_nan | (c == r)
    delta = torch.where(equal, torch.zeros_like(r), (c - r).abs())
    delta = torch.where(delta.isnan(), torch.full_like(delta, math.inf), delta)
    scale = r.abs()
    rel = torch.where(scale.isfinite() & (scale > 0), delta / scale, torch.where(delta > 0, math.inf, 0.0))
    return TensorDiff(
        step=step,
        kind=kind,
        name=name,
        max_abs=float(delta.max()) if delta.numel() else 0.0,
        max_rel=float(rel.max()) if rel.numel() else 0.0,
        mismatched=int((~same).sum()),
        numel=ref.numel(),
        max_ulp=ulp.max_distance(ref, cand),
    )


def partial(diff: TensorDiff) -> Partial:
    """``diff`` (of one rank's piece) as the numbers that travel to the judge."""
    return Partial(
        max_abs=diff.max_abs,
        max_rel=diff.max_rel,
        mismatched=diff.mismatched,
        numel=diff.numel,
        max_ulp=diff.max_ulp,
    )


def merged(parts: list[Partial], *, step: int, kind: str, name: str) -> TensorDiff:
    """One tensor's distance from its pieces' (each element measured by one rank): largest
    distances, summed counts. Exact: the same numbers :func:`tensor_diff` gives on the whole."""
    return TensorDiff(
        step=step,
        kind=kind,
        name=name,
        max_abs=max((p.max_abs for p in parts), default=0.0),
        max_rel=max((p.max_rel for p in parts), default=0.0),
        mismatched=int(sum(p.mismatched for p in parts)),
        numel=int(sum(p.numel for p in parts)),
        max_ulp=max((p.max_ulp for p in parts), default=0.0),
    )
