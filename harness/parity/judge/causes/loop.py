"""Known causes that a training loop's features break: clipping, gradient accumulation,
activation checkpointing.

Why a family of its own: each reads what only its loop feature records (the clip norms of
path ``unscale_clip``, say), and the catalogue stays a list of names. Pure, controller side.

Each blames a stage: the clip causes the clip (the gradients it measured matched, from a common
state, and its norm did not), the accumulation and checkpointing causes the local gradients (the
loss matched, and what each rank summed or recomputed before the reduction did not).
"""

from __future__ import annotations

import math

from harness.parity.judge.evidence import Cause, Evidence, KnownCause

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


_BITS = {"float16": 16, "bfloat16": 16, "float32": 32, "float64": 64}


def accumulation_dtype(e: Evidence) -> Cause | None:
    """``accumulation_dtype``: the two runs summed their unreduced microbatch gradients in different
    dtypes (``StepRecord.accumulated_in``) and the gradients or what follows from them differ."""
    want, got = e.reference.accumulated_in, e.candidate.accumulated_in
    if want is None or got is None or want == got or not (e.failed & {"grad", "param", "optim_state"}):
        return None
    lower, side, other = (got, "candidate", "reference")
    if _BITS.get(got, 0) > _BITS.get(want, 0):
        lower, side, other = (want, "reference", "candidate")
    return Cause(
        name="accumulation_dtype",
        evidence=(
            f"at step {e.candidate.step} the candidate summed its unreduced microbatch gradients in "
            f"{got} and the reference in {want}: the {side} accumulated in the lower dtype, {lower}, "
            f"where the {other} did not"
        ),
        explanation=(
            "Gradient accumulation without a sync per microbatch sums the microbatches before the "
            "reduction, in a dtype of each engine's own: FSDP1's no_sync() in the parameter dtype "
            "(bfloat16 under a bf16 policy, even with an fp32 reduce), FSDP2's in the reduce dtype. "
            "Each sum rounds to that dtype, so the reference must accumulate in the candidate's dtype "
            "(its unsynced twin), or the user syncs every microbatch or reduces in float32 on FSDP2"
        ),
        reference="torch.distributed.fsdp no_sync(); FSDPParam.to_accumulated_grad_if_needed",
    )


def checkpoint_rng(e: Evidence) -> Cause | None:
    """``checkpoint_rng``: the candidate recomputed its checkpointed units without replaying the
    RNG state while the reference replayed, and gradients (or what follows) differ."""
    if e.candidate.checkpoint != "no_replay" or e.reference.checkpoint != "replay":
        return None
    if not (e.failed & {"grad", "param", "optim_state"}):
        return None
    losses = "the losses match, " if "loss" not in e.failed else ""
    return Cause(
        name="checkpoint_rng",
        evidence=(
            f"at step {e.candidate.step} {losses}the gradients differ, and the candidate recomputed "
            "its checkpointed units without replaying the RNG state (the reference replayed it)"
        ),
        explanation=(
            "Activation checkpointing without RNG replay under dropout: the backward recomputes "
            "each unit's forward, and without preserve_rng_state the recompute draws new dropout "
            "masks, so the gradients belong to masks the forward never used. Keep "
            "preserve_rng_state=True (checkpoint_wrapper's and torch.utils.checkpoint's default), or "
            "seed the recompute as the forward was seeded"
        ),
        reference="OLMo-core PR#828; torch.utils.checkpoint(preserve_rng_state=...)",
    )


def _power_of_two(ratio: float) -> int | None:
    """``k`` when ``ratio`` is ``2**k`` to 1e-3, else ``None``."""
    if not ratio > 0 or not math.isfinite(ratio):
        return None
    k = round(math.log2(ratio))
    return k if abs(ratio / 2.0**k - 1) <= _SAME else None


def clip_unscale_order(e: Evidence) -> Cause | None:
    """``clip_unscale_order``: every rank's clip norm is the reference's times a power of two of
    at least 16 (clipped while still scaled) or divided by one (unscaled twice before the clip)."""
    if "clip_norm" not in e.failed or not e.candidate.clip_norms or not e.reference.clip_norms:
        return None
    want = e.reference.clip_norms[0]
    if not (math.isfinite(want) and want > 0):
        return None
    powers = {_power_of_two(norm / want) for norm in e.candidate.clip_norms}
    if len(powers) != 1 or (k := powers.pop()) is None or abs(k) < 4:
        return None
    if k > 0:
        what = f"2**{k} times the reference's: the gradients were clipped while still scaled"
        fix = "call scaler.unscale_(optimizer) before clip_grad_norm_, as torch.amp's recipe does"
    else:
        what = f"the reference's divided by 2**{-k}: the gradients were unscaled once more before the clip"
        fix = "unscale once: scaler.unscale_ per optimizer per step, and no division by the scale by hand"
    return Cause(
        name="clip_unscale_order",
        evidence=f"at step {e.candidate.step} every rank's clip norm is {what}",
        explanation=(
            "clip_grad_norm_ measured gradients in another scale than the reference's: a loss scale "
            f"is a power of two, and so is the ratio of the norms. Clipping scaled gradients clips at "
            f"max_norm times the scale (so nearly never, or every gradient to almost nothing once "
            f"unscaled); {fix}"
        ),
        reference="torch.amp GradScaler docs (gradient clipping); pytorch#149768",
    )


CAUSES = (
    KnownCause(
        name="clip_norm_sharded",
        premise="the clip stage differing first from a common state (the gradients it measures matching)",
        blames=frozenset({"clip"}),
        pattern=clip_norm_sharded,
    ),
    KnownCause(
        name="clip_unscale_order",
        premise="the clip stage differing first from a common state, by a power of two",
        blames=frozenset({"clip"}),
        pattern=clip_unscale_order,
    ),
    KnownCause(
        name="accumulation_dtype",
        premise=(
            "the local gradients differing first from a common state (the loss matching), and the "
            "records naming another accumulation dtype on each side"
        ),
        blames=frozenset({"local", "gradients"}),
        pattern=accumulation_dtype,
    ),
    KnownCause(
        name="checkpoint_rng",
        premise=(
            "the local gradients differing first from a common state (the loss matching), and the "
            "records naming a recompute without RNG replay on the candidate only"
        ),
        blames=frozenset({"local", "gradients"}),
        pattern=checkpoint_rng,
    ),
)
"""The loop's causes, in the order the report lists them."""
