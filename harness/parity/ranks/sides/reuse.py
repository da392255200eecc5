"""Candidate tensors that equal the reference's travel once (rank side; pure, no collectives).

Why: rank 0 records full parameters, gradients and optimizer state for both runs of a
configuration, and a passing configuration is most often bitwise equal to its reference. Where a
candidate tensor equals the reference's tensor of the same step and name (same dtype, shape and
``torch.equal``), the candidate's record holds the reference's tensor object instead of its own
copy: rank 0 frees the copy at once, ``pickle`` sends a shared object once (its memo is keyed by
identity), and the controller unpickles one tensor referenced by both records. Verdicts cannot
change: the judge compares values, and ``torch.equal`` tensors compare as equal there too
(``distance.tensor_diff`` short-cuts on the same test).
"""

from __future__ import annotations

from typing import Any

import torch


def _same(want: Any, got: Any) -> bool:
    return (
        isinstance(want, torch.Tensor)
        and isinstance(got, torch.Tensor)
        and want.dtype == got.dtype
        and want.layout == got.layout == torch.strided
        and want.shape == got.shape
        and torch.equal(want, got)
    )


def _share(want: dict[str, Any], got: dict[str, Any]) -> int:
    """Point each entry of ``got`` equal to ``want``'s at ``want``'s tensor; how many were shared."""
    shared = 0
    for name, value in got.items():
        if isinstance(value, dict):
            shared += _share(want.get(name) or {}, value)
        elif name in want and want[name] is not value and _same(want[name], value):
            got[name] = want[name]
            shared += 1
    return shared


def share_equal_tensors(reference: dict[str, Any], candidate: dict[str, Any]) -> int:
    """Share the reference's tensors into ``candidate`` (a ``record.rank_run`` dict this rank owns,
    changed in place) step by step wherever they are equal; how many tensors were shared."""
    return sum(
        share_step(want, got) for want, got in zip(reference["steps"], candidate["steps"], strict=False)
    )


def share_step(want: dict[str, Any], got: dict[str, Any]) -> int:
    """:func:`share_equal_tensors` for one step's ``record.rank_step`` dicts (``got`` changed in
    place). ``train.run`` calls it as each candidate step is recorded, so that rank 0 never holds
    a copy of what the reference already holds."""
    shared = 0
    if want.get("tensors") and got.get("tensors"):
        shared += _share(want["tensors"], got["tensors"])
    if want.get("buffers") and got.get("buffers"):
        shared += _share(want["buffers"], got["buffers"])
    return shared
