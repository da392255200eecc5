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

from harness.parity.ranks.wire import RankRun, RankStep, StepTensors


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


def share_equal_tensors(reference: RankRun, candidate: RankRun) -> int:
    """Share the reference's tensors into ``candidate`` (a ``record.rank_run`` this rank owns: its
    steps' dicts are changed in place) step by step wherever they are equal; how many tensors were
    shared."""
    return sum(share_step(want, got) for want, got in zip(reference.steps, candidate.steps, strict=False))


def share_step(want: RankStep, got: RankStep) -> int:
    """:func:`share_equal_tensors` for one step's records (``got``'s dicts changed in place)."""
    shared = 0
    if want.tensors is not None and got.tensors is not None:
        shared += share_tensors(want.tensors, got.tensors)
    if want.buffers and got.buffers:
        shared += _share(want.buffers, got.buffers)
    return shared


def share_tensors(want: StepTensors, got: StepTensors) -> int:
    """:func:`share_step` for one step's full tensors (``got``'s dicts changed in place).
    ``stepcheck.Check`` calls it as each candidate step's tensors are recorded, before they go
    into the step's record, so that rank 0 never holds a copy of what the reference already
    holds."""
    return (
        _share(want.params, got.params)
        + _share(want.grads, got.grads)
        + _share(want.optim_state, got.optim_state)
    )
