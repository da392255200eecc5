"""Known causes of a resume row that leaves its straight-through reference: which state the
checkpoint lost.

Why from the candidate's own audit: a resumed run that diverges shows *where* (the first step
after the resume) but not *what* was lost; the rank side (``ranks/restart/resume.py``) compared each
rank's state right after the load with what it saved (weights, optimizer moments, step counts,
scaler, RNG, schedulers) and whether the resumed forward ran on the saved weights. Each pattern
here turns one lost piece into its sentence. Pure, controller side.

Their premise is that audit: each cause is named only when the candidate's own ranks measured,
right after the load, that piece of state differing from what they saved (or, for
``resume_weights_late``, the restored weights not yet in place when the resumed forward began),
so none of them blames a stage of the step: the audit is the measurement.
"""

from __future__ import annotations

from collections.abc import Sequence

from harness.parity.judge.evidence import Cause, Evidence, KnownCause
from harness.parity.ranks.wire import ResumeAudit

_SHOWN = 3
"""How many names of a group the evidence quotes."""


def _audits(e: Evidence) -> list[tuple[int, ResumeAudit]]:
    return [(rank, audit) for rank, audit in enumerate(e.candidate.resume) if audit is not None]


def _lost(e: Evidence, group: str) -> dict[int, tuple[str, ...]]:
    """By rank, the names of ``group`` that differed from the saved state right after the load."""
    return {rank: audit.restored[group] for rank, audit in _audits(e) if group in audit.restored}


def _headline(e: Evidence) -> str:
    first = _audits(e)[0][1]
    at = first.step
    later = e.candidate.step - at
    when = "the first step after resuming" if later == 0 else f"{later} step(s) after resuming"
    worlds = first.world_sizes
    where = f" at world size {worlds[1]}" if worlds else ""
    saved = f" at world size {worlds[0]}" if worlds else ""
    return (
        f"the run resumed at step {at}{where} from a checkpoint saved{saved} after step {at - 1}, "
        f"and first diverges at step {e.candidate.step} ({when})"
    )


def _said(lost: dict[int, Sequence[str]]) -> str:
    parts = []
    for rank, names in lost.items():
        shown = ", ".join(names[:_SHOWN]) + (
            f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
        )
        parts.append(f"rank {rank}: {shown}")
    return "; ".join(parts)


def _group_cause(
    e: Evidence, group: str, name: str, what: str, explanation: str, reference: str
) -> Cause | None:
    if not _audits(e):
        return None
    lost = _lost(e, group)
    if not lost:
        return None
    return Cause(
        name=name,
        evidence=f"{_headline(e)}; right after the load, {what} differed from what was saved ({_said(lost)})",
        explanation=explanation,
        reference=reference,
    )


def weights_not_restored(e: Evidence) -> Cause | None:
    return _group_cause(
        e,
        "weights",
        "resume_weights_not_restored",
        "the weights",
        "The load left the fresh model's weights in place: the model's state was not loaded, or "
        "loaded into another module than the one that trains (a copy, the unwrapped model)",
        "pytorch#35047",
    )


def weights_late(e: Evidence) -> Cause | None:
    """The load's audit found the weights restored, yet the resumed forward ran on others."""
    audits = _audits(e)
    if not audits or _lost(e, "weights"):
        return None
    stale = [rank for rank, audit in audits if audit.weights_at_forward is False]
    if not stale:
        return None
    return Cause(
        name="resume_weights_late",
        evidence=(
            f"{_headline(e)}; the weights equalled the saved ones once the load had run, but not "
            f"when the resumed step's forward began (rank(s) {', '.join(map(str, stale))})"
        ),
        explanation=(
            "The loaded weights became active one step late: the first step after resuming "
            "trained the fresh model's weights (a load applied after that step, or a stale "
            "unsharded copy the forward used instead of the loaded shards)"
        ),
        reference="NVIDIA-NeMo/Megatron-Bridge#3397",
    )


def shard_misplaced(e: Evidence) -> Cause | None:
    return _group_cause(
        e,
        "misplaced",
        "resume_shard_misplaced",
        "whole weights or optimizer state held the saved values in other places",
        "A shard was loaded into the wrong rank or rows: the values are the checkpoint's, their "
        "offsets are not (a resharding load at another world size or in another layout that took "
        "another rank's shard, or placements or row offsets that do not match those that saved them)",
        "torch.distributed.checkpoint resharding (load_planner)",
    )


def optimizer_not_restored(e: Evidence) -> Cause | None:
    return _group_cause(
        e,
        "optimizer",
        "resume_optimizer_not_restored",
        "the optimizer state",
        "The optimizer's state was not restored: its moments (momentum buffers, Adam's exp_avg "
        "and exp_avg_sq) start again from zero, so the first updates after resuming differ",
        "huggingface/transformers#25849",
    )


def step_counter_reset(e: Evidence) -> Cause | None:
    if _lost(e, "optimizer"):
        return None  # the whole state was lost: optimizer_not_restored says so
    return _group_cause(
        e,
        "optimizer_step",
        "resume_step_counter_reset",
        "the optimizer's step count",
        "The optimizer's step counter was reset (or advanced) while its moments were restored: "
        "Adam's bias correction then divides by another 1 - beta**step and the update changes",
        "NVIDIA-NeMo/Megatron-Bridge#5680",
    )


def scaler_not_restored(e: Evidence) -> Cause | None:
    return _group_cause(
        e,
        "scaler",
        "resume_scaler_not_restored",
        "the loss scaler",
        "The scaler's state was not saved or not loaded: the scale is back at its initial value "
        "(and the growth tracker at 0), so the resumed run skips steps the straight run did not, "
        "or scales by another factor; save and load scaler.state_dict() with the checkpoint",
        "NVIDIA/apex#480",
    )


def rng_not_restored(e: Evidence) -> Cause | None:
    return _group_cause(
        e,
        "rng",
        "resume_rng_not_restored",
        "torch's RNG state",
        "The RNG state was not restored: dropout (and any other random draw) after resuming draws "
        "other values than the straight run; save torch.get_rng_state() per rank and restore it",
        "pytorch#35047",
    )


def scheduler_not_restored(e: Evidence) -> Cause | None:
    return _group_cause(
        e,
        "schedulers",
        "resume_scheduler_not_restored",
        "the LR scheduler",
        "The LR scheduler was not restored: it starts again from its first epoch, so the learning "
        "rate after resuming is not the straight run's; save and load scheduler.state_dict()",
        "torch.optim.lr_scheduler.LRScheduler.state_dict",
    )


def _audited(what: str) -> str:
    return f"the candidate's audit right after the load finding {what} differing from what was saved"


CAUSES = (
    KnownCause(
        name="resume_weights_not_restored", premise=_audited("the weights"), pattern=weights_not_restored
    ),
    KnownCause(
        name="resume_weights_late",
        premise="the audit finding the weights restored, and the resumed forward running on others",
        pattern=weights_late,
    ),
    KnownCause(
        name="resume_shard_misplaced",
        premise=_audited("the placement of the saved values (another rank's or row's)"),
        pattern=shard_misplaced,
    ),
    KnownCause(
        name="resume_optimizer_not_restored",
        premise=_audited("the optimizer state"),
        pattern=optimizer_not_restored,
    ),
    KnownCause(
        name="resume_step_counter_reset",
        premise=_audited("the optimizer's step count, its moments restored"),
        pattern=step_counter_reset,
    ),
    KnownCause(
        name="resume_scaler_not_restored", premise=_audited("the scaler"), pattern=scaler_not_restored
    ),
    KnownCause(
        name="resume_rng_not_restored", premise=_audited("torch's RNG state"), pattern=rng_not_restored
    ),
    KnownCause(
        name="resume_scheduler_not_restored",
        premise=_audited("the LR scheduler"),
        pattern=scheduler_not_restored,
    ),
)
"""The resume causes, in the order the report lists them (first in the catalogue: a resume row's
headline)."""
