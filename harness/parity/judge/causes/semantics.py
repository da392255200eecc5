"""Why a split trains unlike the whole batch: the ground truth's known causes (controller side).

Why their own family: the other causes explain a candidate that differs from its DDP twin; these
explain a setup whose every side means another thing than the whole global batch, which DDP
shares (``judge/semantics.py``). Each reads the first differing step the stage measured
(``wire.TruthStep``): the weights of the pieces' own gradients that fit the whole batch's, the
samples a sampler repeated, the first module whose outputs on the pieces differ. As in the main
catalogue, each states its premise beside its pattern and is ruled out, with why, when what was
measured refutes it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from harness.parity.judge.evidence import Cause, RuledOut
from harness.parity.ranks.truth.gradients import BOUND
from harness.parity.ranks.wire import TruthStep

UNIFORM = 1e-6
"""How far apart (relative) fitted weights may be and still count as one weight for all pieces."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Split:
    """What the judge knows of the split: the data-parallel size and the microbatch count."""

    ranks: int
    microbatches: int


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class SemanticCause:
    """One known cause of a semantic difference: its pattern, and its premise checked."""

    name: str
    premise: str
    pattern: Callable[[TruthStep, Split], Cause | None]
    refutes: Callable[[TruthStep], str | None]
    """What measured refutes the premise, in words (``None``: it holds)."""

    def weigh(self, step: TruthStep, split: Split) -> Cause | RuledOut | None:
        found = self.pattern(step, split)
        if found is None:
            return None
        why = self.refutes(step)
        return found if why is None else RuledOut(name=self.name, why=f"needs {self.premise}; {why}")


def _fitted(step: TruthStep) -> bool:
    return step.weights_residual is not None and step.weights_residual <= BOUND and bool(step.weights)


def _uniform(weights: tuple[float, ...]) -> bool:
    top = max(abs(w) for w in weights)
    return top > 0 and max(weights) - min(weights) <= UNIFORM * top


def _forward_agrees(step: TruthStep) -> str | None:
    if step.module is None:
        return None
    name, kind, distance = step.module
    return f"module {name} ({kind}) already gives other outputs on the pieces (relative {distance:.3g})"


def _sampler(step: TruthStep, split: Split) -> Cause | None:
    if not step.repeats:
        return None
    shown = "; ".join(step.repeats[:3]) + (
        f"; ... ({len(step.repeats)} in all)" if len(step.repeats) > 3 else ""
    )
    return Cause(
        name="sampler_padding",
        evidence=f"{len(step.repeats)} sample(s) of step {step.step} are served twice ({shown})",
        explanation=(
            "a sampler evens out the ranks by repeating samples (DistributedSampler without "
            "drop_last pads the last batch of an epoch), so those samples count twice; way out: "
            "drop_last=True, or a dataset whose length the ranks x batch size divides"
        ),
        reference="torch.utils.data.DistributedSampler, drop_last",
    )


def _only_repeats(step: TruthStep) -> str | None:
    if step.as_served is not None and step.as_served <= BOUND:
        return None
    return (
        f"the split is {step.as_served:.3g} away from the batch as served, repeats included: "
        "something more than the repeats differs"
        if step.as_served is not None
        else "the batch as served was not measured"
    )


def _batchnorm(step: TruthStep, split: Split) -> Cause | None:
    if step.module is None or "BatchNorm" not in step.module[1]:
        return None
    name, kind, distance = step.module
    if kind == "SyncBatchNorm":
        if split.microbatches == 1:
            return None  # its statistics span every rank: the whole batch's
        return Cause(
            name="batchnorm_per_rank",
            evidence=(
                f"module {name} (SyncBatchNorm) is the first whose outputs differ from the whole batch's "
                f"(relative {distance:.3g}): under accumulation it normalizes each of the "
                f"{split.microbatches} microbatches by its own statistics (its all-reduce spans the ranks, "
                "not the microbatches)"
            ),
            explanation=(
                "a batch norm's statistics are those of one microbatch's share of the batch; way out: no "
                "accumulation across a batch norm (a larger batch per rank), or a per-sample norm"
            ),
            reference="torch.nn.SyncBatchNorm",
        )
    return Cause(
        name="batchnorm_per_rank",
        evidence=(
            f"module {name} ({kind}) is the first whose outputs on the pieces differ from its outputs "
            f"on the whole batch (relative {distance:.3g}): it normalizes by each piece's own statistics"
        ),
        explanation=(
            "BatchNorm's statistics are those of one rank's (one microbatch's) share of the batch; way "
            "out: torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) (statistics over the ranks; "
            "each microbatch still has its own under accumulation), or a per-sample norm"
        ),
        reference="torch.nn.SyncBatchNorm",
    )


def _is_first(step: TruthStep) -> str | None:
    return None  # the stage measured it the first module to differ, every module before agreeing


def _scaling(step: TruthStep, split: Split) -> Cause | None:
    if not _fitted(step) or not _uniform(step.weights):
        return None
    ratio = step.factor / step.weights[0]
    if abs(ratio - 1.0) <= UNIFORM:
        return None
    named = (
        (
            1.0 / split.ranks,
            f"1 / {split.ranks} data-parallel ranks: divided by the world size on top of the average",
        ),
        (float(split.ranks), f"{split.ranks} data-parallel ranks: summed over the ranks, not averaged"),
        (
            1.0 / split.microbatches,
            f"1 / {split.microbatches} microbatches: divided by the microbatch count twice",
        ),
        (
            float(split.microbatches),
            f"{split.microbatches} microbatches: summed over microbatches, not averaged",
        ),
    )
    words = " or ".join(w for value, w in named if value != 1.0 and abs(ratio / value - 1.0) <= UNIFORM)
    return Cause(
        name="microbatch_scaling",
        evidence=(
            f"the split's gradient is {ratio:.6g} times the whole batch's at step {step.step}"
            + (f" (= {words})" if words else "")
            + f", every piece weighed alike (fit within {step.weights_residual:.2g})"
        ),
        explanation=(
            "the loss is scaled by a wrong microbatch count or divided by the world size although the "
            "data-parallel reduction already averages the ranks: the learning rate silently changes "
            "with the number of ranks or microbatches"
        ),
        reference="README, Does it train like the whole batch?",
    )


def _normalization(step: TruthStep, split: Split) -> Cause | None:
    if not _fitted(step) or _uniform(step.weights):
        return None
    relative = [w / step.factor for w in step.weights]
    shown = ", ".join(
        f"{name}: {weight:.3g} ({count} {step.counted})"
        for name, weight, count in zip(step.pieces, relative, step.counts, strict=True)
    )
    return Cause(
        name="loss_normalization",
        evidence=(
            f"the whole batch weighs the pieces' gradients unequally where the split weighs them alike "
            f"(relative weights {shown}; fit within {step.weights_residual:.2g}): "
            + _against_counts(relative, step)
        ),
        explanation=(
            "a mean per microbatch or per rank over uneven counts of items: each piece's items weigh "
            "1 / its own count instead of 1 / the whole batch's; way out: a loss that takes num_items "
            "and divides the sum over its items by it (transformers' num_items_in_batch)"
        ),
        reference="README, Does it train like the whole batch?",
    )


def _against_counts(relative: list[float], step: TruthStep) -> str:
    """Whether the weights follow the pieces' counts (what a per-piece mean over them gives)."""
    mean = sum(step.counts) / len(step.counts)
    proportional = all(
        abs(w - count / mean) <= 1e-6 * max(1.0, abs(w))
        for w, count in zip(relative, step.counts, strict=True)
    )
    if proportional:
        return f"each in proportion to its count of {step.counted}, as the whole batch's mean weighs them"
    if step.counted == "samples":
        return (
            "not in proportion to the pieces' samples, so to some other count per piece (tokens whose "
            "label is not ignored?): declare Workload.items to see it"
        )
    return f"not in proportion to the pieces' counts of {step.counted}"


def _coupled(step: TruthStep, split: Split) -> Cause | None:
    if step.weights_residual is None or _fitted(step) or step.repeats:
        return None
    return Cause(
        name="loss_couples_samples",
        evidence=(
            f"every module's outputs on the pieces equal the whole batch's, yet no weighing of the pieces' "
            f"own gradients gives the whole batch's (closest within {step.weights_residual:.2g}): the loss "
            "is not a sum over its samples"
        ),
        explanation=(
            "the loss computes a statistic of the batch it is given (an MoE router's load-balancing loss, "
            "a contrastive or batch-normalized loss), so per rank or per microbatch it means another thing "
            "than over the whole batch; way out: compute the statistic over the global batch (gather its "
            "counts across ranks and microbatches), or accept it as the per-piece statistic it is"
        ),
        reference="README, Does it train like the whole batch?",
    )


CAUSES: tuple[SemanticCause, ...] = (
    SemanticCause(
        name="sampler_padding",
        premise="the split to equal the batch as served, repeats included",
        pattern=_sampler,
        refutes=_only_repeats,
    ),
    SemanticCause(
        name="batchnorm_per_rank",
        premise="a BatchNorm to be the first module whose outputs differ",
        pattern=_batchnorm,
        refutes=_is_first,
    ),
    SemanticCause(
        name="microbatch_scaling",
        premise="every module's outputs on the pieces to equal the whole batch's",
        pattern=_scaling,
        refutes=_forward_agrees,
    ),
    SemanticCause(
        name="loss_normalization",
        premise="every module's outputs on the pieces to equal the whole batch's",
        pattern=_normalization,
        refutes=_forward_agrees,
    ),
    SemanticCause(
        name="loss_couples_samples",
        premise="every module's outputs on the pieces to equal the whole batch's",
        pattern=_coupled,
        refutes=_forward_agrees,
    ),
)
"""In the order they are tried; the first that matches with its premise holding is named."""


def weigh(step: TruthStep, split: Split) -> tuple[Cause | None, tuple[RuledOut, ...]]:
    """The cause named for ``step`` (``None``: no known cause), and the causes ruled out."""
    ruled_out = []
    for known in CAUSES:
        found = known.weigh(step, split)
        if isinstance(found, Cause):
            return found, tuple(ruled_out)
        if isinstance(found, RuledOut):
            ruled_out.append(found)
    return None, tuple(ruled_out)
