"""The staged check's anchor hands the reference every scalar of the candidate scaler's state
(``ranks/sides/anchor.py``). Pure: CPU scalers, no ranks.

Why each scalar alone: anchored, the reference starts every step from the candidate's state, so
its scale stage compares one step's update of the scale and growth tracker. A scalar the anchor
leaves out keeps the reference's own value; from the step where the candidate's moved otherwise
(a backoff on one side) the reference would count from its own, and the check would fail a
correct candidate, or pass one whose tracker drifted, on every later step.
"""

from __future__ import annotations

import pytest
import torch

from harness.parity.ranks.sides import anchor
from scaler import ShardedGradScaler


def _candidate() -> ShardedGradScaler:
    """A candidate scaler mid-run: backed off once, three steps into its growth interval."""
    made = ShardedGradScaler("cpu", init_scale=2.0**16, growth_interval=8)
    made.load_state_dict({**made.state_dict(), "scale": 2.0**15, "_growth_tracker": 3})
    return made


def _reference() -> torch.amp.GradScaler:
    """The reference's scaler after its first step (its scale and tracker are tensors by now)."""
    made = torch.amp.GradScaler("cpu", init_scale=2.0**16, growth_interval=8)
    made.scale(torch.ones(()))
    return made


@pytest.mark.parametrize("scalar", ["scale", "_growth_tracker"])
def test_anchoring_hands_the_reference_each_scalar_of_the_candidates_scaler(scalar):
    candidate, reference = _candidate(), _reference()
    assert reference.state_dict()[scalar] != candidate.state_dict()[scalar]  # else it tests nothing
    anchor.load_scaler(reference, candidate)
    assert reference.state_dict()[scalar] == candidate.state_dict()[scalar]
