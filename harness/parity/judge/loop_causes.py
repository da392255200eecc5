"""Known causes that a training loop's features break: clipping, accumulation, checkpointing.

Why apart from ``causes.py``: each reads what only its loop feature records (the clip norms of
path ``unscale_clip``, say), and the catalogue stays a list of names. Pure, controller side.
"""

from __future__ import annotations

import math

from harness.parity.judge.evidence import Cause, Evidence

_SAME = 1e-3
"""How close (relative) the ranks' partial norms must add up to the reference's norm."""


def clip_norm_sharded(e: Evidence) -> Cause | None:
    """``clip_norm_sharded``: the candidate's ranks clipped with norms of their own that, taken as
    the partial norms of one gradient, add up to the reference's total (their squares sum to its
    square); or, without that, ranks that disagree on the norm of the same gradients."""
    if "clip_norm" not in e.failed or len(e.candidate.clip_norms) < 2 or not e.reference.clip_norms:
        return None
    norms, want = e.candidate.clip_norms, e.reference.clip_norms[0]
    if not all(math.isfinite(n) for n in (*norms, want)):
        return None
    total = math.sqrt(sum(n * n for n in norms))
    adds_up = want > 0 and abs(total / want - 1) <= _SAME
    if not adds_up and len(set(norms)) == 1:
        return None
    said = ", ".join(f"{n:.6g}" for n in norms)
    how = (
        f"the square root of the sum of their squares is {total:.6g}, the reference's total norm"
        if adds_up
        else f"the reference's total norm is {want:.6g}"
    )
    return Cause(
        name="clip_norm_sharded",
        evidence=f"at step {e.candidate.step} each rank clipped with a norm of its own ({said}); {how}",
        explanation=(
            "Each rank's clip used the norm of its own gradient shard as if it were the total "
            "(torch.nn.utils.clip_grad_norm_ over FSDP1's local flat shards, or a norm not "
            "all-reduced; eps is then added per rank too), so every rank scales its shard by "
            "another coefficient. Clip with FSDP1's model.clip_grad_norm_, or with "
            "torch.nn.utils.clip_grad_norm_ over FSDP2's DTensor parameters, which reduce the "
            "partial norms across ranks first"
        ),
        reference="pytorch#88621",
    )
