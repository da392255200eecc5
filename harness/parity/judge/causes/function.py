"""Causes read off a user's own ``parallelize`` function (``ranks/sides/user/discover.py``):
structural facts of what the function did that explain a difference by themselves.

Why a family of its own: the other causes are patterns over the recorded numbers; these are facts
the engine read off the modules the function returned (``wire.FunctionFacts``), true whatever the
numbers, and each names the line of the user's function to change. (Parameters left outside every
unit are the reduction's: ``reduction.never_reduced``.)
"""

from __future__ import annotations

from harness.parity.judge.evidence import Cause, Evidence, KnownCause
from harness.parity.ranks.wire import FunctionFacts

_DIFFERS = {"loss": "losses", "grad": "gradients", "param": "parameters", "optim_state": "optimizer state"}


def split_tie(e: Evidence) -> Cause | None:
    """``split_tie``: the function's ``fully_shard`` units hold the names of one tied parameter
    apart, and something differs."""
    ties = e.facts.split_ties if e.facts is not None else ()
    differs = [words for what, words in _DIFFERS.items() if what in e.failed]
    if not ties or not differs:
        return None
    return Cause(
        name="split_tie",
        evidence=(
            f"at step {e.candidate.step} the {' and '.join(differs[:2])} differ, and your function's "
            f"fully_shard units hold the tie {', '.join(ties)} apart"
        ),
        explanation=(
            "A tied parameter (an embedding shared with the output head) sharded in two units is two "
            "copies to FSDP: each unit all-gathers and reduces its own, the optimizer steps one, and "
            "the other stays where it was; re-tying after fully_shard makes the module attributes "
            "agree, not FSDP's copies. Keep the tied modules in one unit (fully_shard them together, "
            "or leave both to the root), and tie before sharding"
        ),
        reference="torch.distributed.fsdp.fully_shard (shared parameters: one FSDP group)",
    )


_MIXED = "mixed torch.Tensor and DTensor"


def never_reduced_crash(facts: FunctionFacts | None, candidate_error: str | None) -> Cause | None:
    """``never_reduced`` read from a crash: the candidate raised on plain tensors beside DTensors
    (a ``foreach`` or fused optimizer over both), and the function left those parameters outside
    every unit: the crash and the unreduced gradients have one cause."""
    never = facts.never_reduced if facts is not None else ()
    if not never or not candidate_error or _MIXED not in candidate_error:
        return None
    shown = ", ".join(never[:4]) + (f" and {len(never) - 4} more" if len(never) > 4 else "")
    return Cause(
        name="never_reduced",
        evidence=(
            f"the candidate raised on plain tensors beside DTensors ({_MIXED}), and your function left "
            f"{shown} under no fully_shard and no DDP"
        ),
        explanation=(
            "Parameters outside every fully_shard unit stay plain tensors while the units' become "
            "DTensors, so a foreach or fused optimizer over both raises; run one step at a time and "
            "they would not be averaged across ranks either. Call fully_shard on the root too, after "
            "the blocks"
        ),
        reference="torch.distributed.fsdp.fully_shard (apply to the root module last)",
    )


CAUSES: tuple[KnownCause, ...] = (
    KnownCause(
        name="split_tie",
        premise=(
            "the function's units, as read off the modules, holding two names of one tied parameter, "
            "and any difference: a structural fact, true whatever the stage"
        ),
        pattern=split_tie,
    ),
)
"""The causes read off a user's function."""
