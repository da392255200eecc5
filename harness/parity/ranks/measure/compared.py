"""One rank's pieces of the candidate against the same elements of its reference, and the one
all-reduce that agrees a measurement's flags (rank side; ``stepcheck.Check`` measures with them).

Why apart: each measurement (gradients, parameters, optimizer state, buffers) compares the same
way, and the ranks must agree on what they found before anyone decides to gather: which tensors
exist on any rank (a rank lacking one measured zeros), whether any rank's differ or fail, in one
collective per measurement, not one per question.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from harness.parity.plan import profiles
from harness.parity.ranks.measure import distance, local, ulp
from harness.parity.ranks.wire import Partial, Tensors


@dataclasses.dataclass(slots=True)
class Measured:
    partials: dict[str, Partial] = dataclasses.field(default_factory=dict)
    differ: bool = False
    """Some element (or a shape or dtype) is not bitwise equal."""
    fail: bool = False
    """Some element is outside the profile (or a name, shape or dtype differs)."""


def compare(
    reference: Tensors,
    pieces: dict[str, local.Piece],
    profile: profiles.ToleranceProfile,
    *,
    align: bool = False,
) -> Measured:
    """Each piece against the same elements of ``reference`` (``align``: floating-point buffers
    compared in the coarser of their dtypes, as the judge does)."""
    return merged(compare_each(reference, pieces, profile, align=align), set(reference))


def merged(each: dict[str, Measured], expected: set[str]) -> Measured:
    """Per-tensor measurements as one (a name missing from either side differs and fails)."""
    found = Measured()
    if expected != set(each):
        found.differ = found.fail = True
    for one in each.values():
        found.partials.update(one.partials)
        found.differ |= one.differ
        found.fail |= one.fail
    return found


def compare_each(
    reference: Tensors,
    pieces: dict[str, local.Piece],
    profile: profiles.ToleranceProfile,
    *,
    align: bool = False,
) -> dict[str, Measured]:
    """:func:`compare`, per piece (one ``reference`` lacks differs and fails)."""
    out: dict[str, Measured] = {}
    for name in sorted(pieces):
        found = out[name] = Measured()
        want, piece = reference.get(name), pieces[name]
        if want is None:
            found.differ = found.fail = True
            continue
        dtype = piece.dtype
        if align and want.dtype != dtype and want.is_floating_point() and dtype.is_floating_point:
            dtype = ulp.coarser(want.dtype, dtype)
        elif want.dtype != dtype:
            found.differ = found.fail = True
            continue
        if tuple(want.shape) != piece.shape:
            found.differ = found.fail = True
            continue
        if piece.values is None:
            continue
        got = piece.values.to("cpu", dtype)
        want_part = want.reshape(-1)[piece.start : piece.start + got.numel()].to(dtype)
        if torch.equal(want_part, got):  # the common case, once per tensor: nothing to measure
            found.partials[name] = distance.partial(distance.equal_diff(got.numel()))
            continue
        diff = distance.tensor_diff(want_part, got, profile, step=0, kind="", name=name)
        found.partials[name] = distance.partial(diff)
        found.differ = True
        found.fail = diff.mismatched > 0
    return out


def agreed(
    each: dict[str, Measured], held: dict[str, bool], extra: list[bool], device: torch.device
) -> tuple[dict[str, Measured], list[bool]]:
    """One all-reduce for a measurement: which of ``each``'s tensors some rank holds (``held``:
    this rank's; one it lacks was measured as zeros), whether some rank found each differing or
    failing, and ``extra`` flags. Returns ``each`` with its flags agreed, keeping only the tensors
    held somewhere (in ``each``'s order), and ``extra`` agreed."""
    names, first = list(each), len(extra)
    count = len(names)
    flags = [
        *extra,
        *(held[n] for n in names),
        *(each[n].differ for n in names),
        *(each[n].fail for n in names),
    ]
    agreed = any_rank(flags, device)
    kept = {}
    for i, name in enumerate(names):
        if agreed[first + i]:
            each[name].differ, each[name].fail = agreed[first + count + i], agreed[first + 2 * count + i]
            kept[name] = each[name]
    return kept, agreed[:first]


def any_rank(flags: list[bool], device: torch.device) -> list[bool]:
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return flags
    values = torch.tensor([float(f) for f in flags], device=device)
    dist.all_reduce(values, op=dist.ReduceOp.MAX)
    return [bool(v) for v in values.tolist()]
