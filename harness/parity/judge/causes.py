"""Known causes: patterns over the recorded data that turn a divergence into a likely explanation.

Why a catalogue: the same few mistakes account for most sharded runs that drift from DDP, and
each leaves a recognisable trace in what the engine records anyway (per-rank skip decisions, the
losses, gradients, parameters, optimizer state and buffers of the first diverging step). Each
entry is a pure function of the two records and the comparison, a sentence saying what the
pattern usually means, and a reference to read further. It says *likely*: the evidence is quoted
so a reader can judge. Pure, controller side.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from harness.parity.judge import loop_causes, reduce_causes, resume_causes, rounding
from harness.parity.judge.compare import Comparison
from harness.parity.judge.evidence import Cause, Evidence, short
from harness.parity.ranks.measure.record import RunRecord, StepRecord

__all__ = ["CATALOGUE", "Cause", "Evidence", "dtype_differences", "localized", "match"]


_Pattern = Callable[[Evidence], "Cause | None"]


def _skip_desync(e: Evidence) -> Cause | None:
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


def _constant_factor(reference: torch.Tensor, candidate: torch.Tensor) -> float | None:
    """``k`` when ``candidate == k * reference`` elementwise (to 1e-3), ``None`` otherwise."""
    ref, cand = reference.double().flatten(), candidate.double().flatten()
    if not (ref.isfinite().all() and cand.isfinite().all()):
        return None
    if ((ref == 0) != (cand == 0)).any():
        return None
    nonzero = ref != 0
    if not nonzero.any():
        return None
    ratios = cand[nonzero] / ref[nonzero]
    k = float(ratios.median())
    if k == 0 or not bool(((ratios / k - 1).abs() <= 1e-3).all()):
        return None
    return k


def _divide_factor(e: Evidence) -> Cause | None:
    if not e.grads_compared or "grad" not in e.failed:
        return None
    factors = []
    for name, want in e.reference.grads.items():
        got = e.candidate.grads.get(name)
        if got is None or got.shape != want.shape:
            return None
        k = _constant_factor(want, got)
        if k is not None:
            factors.append(k)
        elif not torch.equal(want, got):
            return None
    if not factors:
        return None
    k = factors[0]
    if abs(k - 1) < 1e-3 or any(abs(f / k - 1) > 1e-3 for f in factors):
        return None
    world = e.world_size
    note = ""
    if abs(k / world - 1) < 1e-3:
        note = f" (the world size, {world}: summed where the reference averages)"
    elif abs(k * world - 1) < 1e-3:
        note = f" (1 / the world size, {world}: divided once more than the reference)"
    return Cause(
        name="divide_factor",
        evidence=f"at step {e.candidate.step} every gradient is {k:.4g}x the reference's{note}",
        explanation=(
            "A reduce/divide-factor mismatch: gradients summed instead of averaged, divided "
            "twice, or a loss divided by the world size by hand on one side only (FSDP's "
            "gradient_divide_factor, a custom reduce hook)"
        ),
        reference="torchtitan#2318",
    )


def _forward_differs(e: Evidence) -> Cause | None:
    if e.candidate.step != 0 or "loss" not in e.failed:
        return None
    ranks = [
        str(rank)
        for rank, (want, got) in enumerate(zip(e.reference.losses, e.candidate.losses, strict=True))
        if want != got
    ]
    return Cause(
        name="forward_differs",
        evidence=f"the loss differs already at step 0 on rank(s) {', '.join(ranks)}, before any optimizer step",
        explanation=(
            "The forward pass itself differs: how the model is wrapped, the input dtype or its "
            "casting, or a module that behaves differently when sharded; the first diverging "
            "module says where"
        ),
        reference="torchtitan#734",
    )


def _low_dtype_of(losses: tuple[float, ...] | list[float]) -> torch.dtype | None:
    """The low dtype every finite loss of ``losses`` is a value of (float16, then bfloat16), else
    ``None``. A float32 loss is a float16 value by chance once in about 8000; whole numbers
    (a zero loss) are every dtype's values, so they say nothing."""
    finite = [loss for loss in losses if math.isfinite(loss)]
    if all(loss == int(loss) for loss in finite):
        return None
    for dtype in (torch.float16, torch.bfloat16):
        if all(torch.tensor(loss, dtype=torch.float64).to(dtype).item() == loss for loss in finite):
            return dtype
    return None


def _loss_dtype_differs(e: Evidence) -> Cause | None:
    if "loss" not in e.failed:
        return None
    want, got = _low_dtype_of(e.reference.losses), _low_dtype_of(e.candidate.losses)
    if want == got:
        return None
    low, side, other = (
        (got, "candidate", "reference") if got is not None else (want, "reference", "candidate")
    )
    return Cause(
        name="loss_dtype_differs",
        evidence=(
            f"at step {e.candidate.step} every loss of the {side} is a {short(low)} value and the "
            f"{other}'s are not (reference {_short_losses(e.reference.losses)}, candidate "
            f"{_short_losses(e.candidate.losses)})"
        ),
        explanation=(
            f"One run computes its loss in {short(low)} and the other in float32: torch.autocast "
            "runs a loss such as cross_entropy in float32 (its float32 list), so a run without "
            "autocast over low-precision logits keeps its loss low. The reference of an autocasting "
            "recipe must autocast its forward and loss as the candidate does (its unsharded twin)"
        ),
        reference="torch.amp autocast op reference (ops that autocast to float32)",
    )


def _short_losses(losses: tuple[float, ...] | list[float]) -> str:
    return "[" + ", ".join(f"{loss:.9g}" for loss in losses) + "]"


def _under(name: str, module: str | None) -> bool:
    """Whether tensor ``name`` belongs to ``module`` (a localized name: ``#k`` and ``[i]`` dropped)."""
    if module is None:
        return True
    owner = module.split("#")[0].split("[")[0]
    return not owner or name.startswith(owner + ".")


def dtype_differences(reference: StepRecord, candidate: StepRecord, module: str | None = None) -> list[str]:
    """``name is A in the candidate and B in the reference`` for every parameter and (rank 0's)
    buffer whose dtype differs between the runs, inside ``module`` when given, by name."""
    sides = [(reference.shapes("param"), candidate.shapes("param"))]
    rank0 = " [rank 0]"
    buffers = [
        {
            name.removesuffix(rank0): meta
            for name, meta in step.shapes("buffer").items()
            if name.endswith(rank0)
        }
        for step in (reference, candidate)
    ]
    if buffers[0] and buffers[1]:
        sides.append((buffers[0], buffers[1]))
    found = []
    for want, got in sides:
        for name in sorted(want.keys() & got.keys()):
            if want[name][1] != got[name][1] and _under(name, module):
                found.append(
                    f"{name} is {short(got[name][1])} in the candidate and {short(want[name][1])} in the reference"
                )
    return found


def _dtype_cause(found: list[str], step: int, module: str | None = None) -> Cause:
    where = f"in the first diverging module {module or '(the model)'}, " if module is not None else ""
    more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
    return Cause(
        name="dtype_differs",
        evidence=f"at step {step}, {where}{'; '.join(found[:3])}{more}",
        explanation=(
            "The two runs hold this tensor in different dtypes, so everything computed from it "
            "differs: one side cast it (a buffer cast by hand or by model.to(dtype), FSDP1's "
            "buffer_dtype where FSDP2 never casts buffers, a rotary inv_freq that must stay "
            "float32); keep it in the dtype the other side keeps it in"
        ),
        reference="transformers#25681",
    )


def _dtype_differs(e: Evidence) -> Cause | None:
    found = dtype_differences(e.reference, e.candidate)
    return _dtype_cause(found, e.candidate.step) if found else None


def localized(
    found: tuple[Cause, ...], reference: RunRecord, candidate: RunRecord, step: int, module: str
) -> tuple[Cause, ...]:
    """``found`` with its ``dtype_differs`` cause narrowed to the first diverging ``module`` (once
    localization named it), when that module holds a tensor whose dtype differs."""
    if step >= min(len(reference.steps), len(candidate.steps)):
        return found
    inside = dtype_differences(reference.steps[step], candidate.steps[step], module)
    if not inside:
        return found
    narrowed = _dtype_cause(inside, step, module)
    return tuple(narrowed if cause.name == "dtype_differs" else cause for cause in found)


def _optimizer_only(e: Evidence) -> Cause | None:
    moved = e.failed & {"param", "optim_state"}
    if not moved or not e.grads_compared or e.failed - {"param", "optim_state"}:
        return None
    which = " and ".join(sorted(kind.replace("optim_state", "optimizer state") for kind in moved))
    return Cause(
        name="optimizer_only",
        evidence=(f"at step {e.candidate.step} the losses and gradients match, only {which} differ"),
        explanation=(
            "The optimizer step itself differs: its kernel rounds differently (a fused optimizer "
            "updates one flat parameter in another element order than per-parameter tensors; "
            "foreach against for-loop kernels), or its state was not sharded like its parameters"
        ),
        reference="harness/parity/plan/profiles.py (fused optimizers)",
    )


def _buffers_only(e: Evidence) -> Cause | None:
    if e.failed != {"buffer"}:
        return None
    return Cause(
        name="buffers_only",
        evidence=f"at step {e.candidate.step} only module buffers differ",
        explanation=(
            "DDP broadcasts rank 0's buffers before every forward (broadcast_buffers=True), FSDP "
            "does not, so buffers such as normalization running statistics drift apart on the "
            "other ranks"
        ),
        reference="torch.nn.parallel.DistributedDataParallel(broadcast_buffers=...)",
    )


CATALOGUE: tuple[tuple[str, _Pattern], ...] = (
    *resume_causes.PATTERNS,
    ("skip_desync", _skip_desync),
    ("divide_factor", _divide_factor),
    ("forward_differs", _forward_differs),
    ("clip_norm_sharded", loop_causes.clip_norm_sharded),
    ("clip_unscale_order", loop_causes.clip_unscale_order),
    ("accumulation_dtype", loop_causes.accumulation_dtype),
    ("checkpoint_rng", loop_causes.checkpoint_rng),
    ("dtype_differs", _dtype_differs),
    ("loss_dtype_differs", _loss_dtype_differs),
    ("reduced_in_lower_dtype", reduce_causes.reduced_in_lower_dtype),
    ("reduce_order", rounding.reduce_order),
    ("noise_gradient", rounding.noise_gradient),
    ("optimizer_only", _optimizer_only),
    ("buffers_only", _buffers_only),
)
"""Every known cause, in the order the report lists matches."""


def match(
    reference: RunRecord,
    candidate: RunRecord,
    comparison: Comparison,
    *,
    poisoned_steps: frozenset[int] = frozenset(),
    reduce_dtype: torch.dtype | None = None,
) -> tuple[Cause, ...]:
    """The known causes that match the first diverging step (none when nothing diverged);
    ``reduce_dtype``: the dtype both runs sum their ranks' gradients in, when low precision."""
    first = comparison.first
    if first is None or first.step >= min(len(reference.steps), len(candidate.steps)):
        return ()
    origin = next(
        (
            (want, got)
            for want, got in zip(reference.steps[: first.step + 1], candidate.steps, strict=False)
            if want.step not in poisoned_steps
            and all(bool(value.isfinite().all()) for value in want.grads.values())  # not an overflow
            and any(
                name in got.grads and not torch.equal(value, got.grads[name])
                for name, value in want.grads.items()
            )
        ),
        None,
    )
    evidence = Evidence(
        reference=reference.steps[first.step],
        candidate=candidate.steps[first.step],
        failed=frozenset(d.what for d in comparison.divergences if d.step == first.step),
        world_size=len(candidate.steps[first.step].losses),
        grads_compared=first.step not in poisoned_steps,
        reduce_dtype=reduce_dtype,
        origin=origin,
    )
    found = (pattern(evidence) for _, pattern in CATALOGUE)
    return tuple(cause for cause in found if cause is not None)
