"""The order-free bound of a reduction (rank side): how far a correct mean of the ranks' gradients
can be from the exact one, whatever order the collective sums in.

Why a bound and not a tolerance: a sum of n floating-point terms computed in *any* order (ring,
tree, chain, NVLS, a custom reduce-scatter) lies within ``gamma_{n-1} * sum_i |x_i|`` of the exact
sum (Higham, *Accuracy and Stability of Numerical Algorithms*, 4.2; ``gamma_k = k u / (1 - k u)``,
``u`` the unit roundoff of the dtype summed in). The candidate's reduced element ``c`` is that sum
divided by the world size (before, after or split around the sum: two more roundings at most),
then cast to its gradient's dtype (``u_out``). So with ``m`` the exact mean of the ranks' local
values and ``A`` the mean of their absolute values (both in float64)::

    |c - m| <= gamma_{n+1}(u_reduce) * A + u_out * |m| + (n + 2) * eta_reduce

where ``eta`` is half the spacing of the dtype's subnormals (the absolute error an underflowing
rounding can add, which no relative term covers). The bound is relative to ``A``, not to ``|m|``:
an element whose terms nearly cancel may legitimately move far from ``m`` relative to itself,
which is what breaks a relative tolerance. It still fails a divide factor off by one rank (off by
``m / n``), a rank left out (off by a whole term), a wrong scale, and a reduction in a lower dtype
than configured (``u`` 2**-8 where 2**-24 is allowed).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist


def unit_roundoff(dtype: torch.dtype) -> float:
    """``u``: half the distance from 1 to the next float of ``dtype``."""
    return torch.finfo(dtype).eps / 2


def gamma(k: int, dtype: torch.dtype) -> float:
    """``gamma_k = k u / (1 - k u)`` for ``dtype``'s unit roundoff (``inf`` once ``k u >= 1``)."""
    ku = k * unit_roundoff(dtype)
    return ku / (1 - ku) if ku < 1 else float("inf")


def _eta(dtype: torch.dtype) -> float:
    """Half the spacing of ``dtype``'s subnormals."""
    info = torch.finfo(dtype)
    return info.smallest_normal * info.eps / 2


@dataclasses.dataclass(frozen=True, slots=True)
class Checked:
    """One tensor's reduction, judged elementwise."""

    elements: int
    violations: int
    worst_ratio: float
    """The largest ``|c - m| / bound`` over the elements (> 1: a violation)."""


def exact_means(
    local: dict[str, torch.Tensor], names: list[str], device: torch.device
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """For each of ``names`` (the same list on every rank), ``(m, A)``: the mean over the ranks of
    this rank's ``local`` gradient and of its absolute value, in float64 (an all-reduce of
    float64 sums: its own rounding, 2**-53 relative, is covered by the slack in :func:`check`).
    A name this rank has no gradient for counts as zeros (a parameter unused on this rank)."""
    world = dist.get_world_size()
    shapes = {name: local[name].shape for name in names if name in local}
    agreed = _agreed_shapes(names, shapes, device)
    pieces = []
    for name in names:
        values = _flat64(local.get(name), agreed[name], device)
        pieces += [values, values.abs()]
    flat = torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.float64, device=device)
    dist.all_reduce(flat)
    out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    offset = 0
    for name in names:
        count = int(torch.Size(agreed[name]).numel())
        sums = flat[offset : offset + count].cpu()
        sums_abs = flat[offset + count : offset + 2 * count].cpu()
        out[name] = ((sums / world).view(agreed[name]), (sums_abs / world).view(agreed[name]))
        offset += 2 * count
    return out


def _flat64(value: torch.Tensor | None, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    if value is None:
        return torch.zeros(int(torch.Size(shape).numel()), dtype=torch.float64, device=device)
    return value.detach().to(device, torch.float64).reshape(-1)


def _agreed_shapes(
    names: list[str], shapes: dict[str, torch.Size], device: torch.device
) -> dict[str, tuple[int, ...]]:
    """Each name's shape as any rank that has it knows it (ranks without one send nothing)."""
    gathered: list[dict[str, tuple[int, ...]] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {name: tuple(shape) for name, shape in shapes.items()})
    agreed: dict[str, tuple[int, ...]] = {}
    for known in gathered:
        agreed.update(known or {})
    missing = [name for name in names if name not in agreed]
    if missing:
        raise ValueError(f"no rank computed a local gradient for {missing[:3]}")
    return agreed


def check(
    reduced: torch.Tensor,
    mean: torch.Tensor,
    mean_abs: torch.Tensor,
    world: int,
    reduce_dtype: torch.dtype,
) -> Checked:
    """``reduced`` (the candidate's reduced gradient, full) against ``(mean, mean_abs)`` of its
    ranks' local gradients, elementwise (module docstring). Non-finite elements are not judged
    here (an overflow is the scaler's business, compared exactly elsewhere)."""
    return check_sum(reduced, [(mean, mean_abs)], world, reduce_dtype)


def _one(mean: torch.Tensor, mean_abs: torch.Tensor, world: int, reduce_dtype: torch.dtype, out: torch.dtype):
    """How far one reduction's result may lie from its exact mean."""
    return (
        gamma(world + 1, reduce_dtype) * mean_abs
        + unit_roundoff(out) * mean.abs()
        + (world + 2) * _eta(reduce_dtype)
    )


def check_sum(
    reduced: torch.Tensor,
    parts: list[tuple[torch.Tensor, torch.Tensor]],
    world: int,
    reduce_dtype: torch.dtype,
) -> Checked:
    """:func:`check` of a gradient that is the sum of several reductions (one per microbatch of an
    accumulation that reduces every microbatch, added in the gradient's dtype in microbatch
    order): each reduction within its own bound of its exact mean, and the running sum of ``K``
    of them within ``gamma_{K-1}(u_out)`` of the sum of their magnitudes (Higham 4.2 once more).
    One part is one reduction: the bound of the module docstring."""
    out = reduced.dtype
    got = reduced.detach().to("cpu", torch.float64).reshape(parts[0][0].shape)
    if len(parts) == 1:  # one reduction (the common case): the sums below of one term each, as is
        mean, mean_abs = parts[0]
        want = mean
        allowed = _one(mean, mean_abs, world, reduce_dtype, out) + 4 * 2.0**-53 * mean_abs
    else:
        want = sum((mean for mean, _ in parts), torch.zeros_like(got))
        each = [_one(mean, mean_abs, world, reduce_dtype, out) for mean, mean_abs in parts]
        magnitude = sum(
            (mean.abs() + e for (mean, _), e in zip(parts, each, strict=True)), torch.zeros_like(got)
        )
        allowed = sum(each, torch.zeros_like(got)) + 4 * 2.0**-53 * sum(
            (mean_abs for _, mean_abs in parts), torch.zeros_like(got)
        )  # the float64 sums' own rounding
        allowed = allowed + gamma(len(parts) - 1, out) * magnitude
    finite = got.isfinite() & want.isfinite()
    apart = (got - want).abs()
    ratio = torch.where(finite, apart / allowed, torch.zeros_like(apart))
    return Checked(
        elements=int(finite.sum()),
        violations=int((ratio > 1).sum()),
        worst_ratio=float(ratio.max()) if ratio.numel() else 0.0,
    )
