"""Known causes after the gradients: the scaler's skip decision, the optimizer's update, buffers.

* ``skip_desync``: the candidate's ranks recorded different found_inf flags or skip decisions at
  one step. Its premise is those records: each rank measured its own, so no drift can fake it.
* ``optimizer_only`` blames the update: from a common state the losses and gradients matched and
  only parameters or optimizer state moved apart (the staged check's update stage, or a step the
  straight runs began bitwise whose loss and gradients passed).
* ``buffers_only`` blames the buffers the same way (the staged check's buffer stage, or only
  buffers differing at a step begun bitwise).
"""

from __future__ import annotations

from harness.parity.judge.evidence import Cause, Evidence, KnownCause


def skip_desync(e: Evidence) -> Cause | None:
    step = e.candidate
    flags = [tuple(bool(f) for f in per_rank) for per_rank in step.found_inf]
    decisions = {}
    for index in range(len(step.skipped[0]) if step.skipped else 0):
        decided = {rank: f[index] for rank, f in enumerate(step.skipped) if f[index] is not None}
        if len(set(decided.values())) > 1:
            decisions = decided
            break
    if len(set(flags)) <= 1 and not decisions:
        return None
    if decisions:
        said = ", ".join(f"rank {r} {'skipped' if d else 'stepped'}" for r, d in decisions.items())
    else:
        said = ", ".join(f"rank {r} found_inf {list(f)}" for r, f in enumerate(step.found_inf))
    return Cause(
        name="skip_desync",
        evidence=f"at step {step.step} the ranks disagree: {said}",
        explanation=(
            "The scaler did not agree found_inf across ranks before deciding: each rank checked "
            "only its own gradient shard. A scaler without cross-rank agreement does this, and so "
            "do fused optimizers under torch's ShardedGradScaler (their found_inf is never "
            "all-reduced); one MAX all-reduce of found_inf per optimizer step fixes it"
        ),
        reference="fairscale#179",
    )


_SCALER = frozenset({"agreement", "skipped", "found_inf", "scale", "tracker"})
"""The straight comparison's checks of the scaler's decision (taken before the update)."""


def optimizer_only(e: Evidence) -> Cause | None:
    if e.failed & _SCALER:
        return None  # the optimizer skipped on some ranks or sides: its decision, not its arithmetic
    moved = e.failed & {"param", "optim_state"}
    if e.measured.source == "staged" and e.measured.stage == "update":
        evidence = f"at step {e.measured.step}, from the same state and gradients, {e.measured.detail}"
    elif moved and e.grads_compared and not e.failed - {"param", "optim_state"}:
        which = " and ".join(sorted(kind.replace("optim_state", "optimizer state") for kind in moved))
        evidence = f"at step {e.candidate.step} the losses and gradients match, only {which} differ"
    else:
        return None
    return Cause(
        name="optimizer_only",
        evidence=evidence,
        explanation=(
            "The optimizer step itself differs: its kernel rounds differently (a fused kernel "
            "rounds an element by its offset in the tensor it is given, so tensors cut otherwise "
            "than the candidate's shards round otherwise; foreach against for-loop kernels), or "
            "its state was not sharded like its parameters"
        ),
        reference="harness/parity/ranks/sides/optim/step_pieces.py (fused optimizers)",
    )


def buffers_only(e: Evidence) -> Cause | None:
    if e.measured.source == "staged" and e.measured.stage == "buffer":
        evidence = f"at step {e.measured.step}, from the same state, {e.measured.detail}"
    elif e.failed == {"buffer"}:
        evidence = f"at step {e.candidate.step} only module buffers differ"
    else:
        return None
    return Cause(
        name="buffers_only",
        evidence=evidence,
        explanation=(
            "DDP broadcasts rank 0's buffers before every forward (broadcast_buffers=True), FSDP "
            "does not, so buffers such as normalization running statistics drift apart on the "
            "other ranks"
        ),
        reference="torch.nn.parallel.DistributedDataParallel(broadcast_buffers=...)",
    )


CAUSES = (
    KnownCause(
        name="skip_desync",
        premise="the candidate's ranks recording different found_inf flags or skip decisions at one step",
        pattern=skip_desync,
    ),
    KnownCause(
        name="optimizer_only",
        premise="the update differing first from a common state (the losses and gradients matching)",
        blames=frozenset({"update"}),
        pattern=optimizer_only,
    ),
    KnownCause(
        name="buffers_only",
        premise="the buffers differing first from a common state (everything else matching)",
        blames=frozenset({"buffer"}),
        pattern=buffers_only,
    ),
)
"""The causes after the gradients, in the order the report lists them."""
