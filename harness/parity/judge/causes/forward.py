"""Known causes in what each rank computes before any reduction: the forward, the loss, dtypes.

* ``forward_differs`` blames the forward (or the local backward): from a common state, a rank's
  loss or local gradients differ. Its premise is that common state: step 0 (both sides built from
  one seed), a later step the straight runs reached bitwise, or the staged check's re-anchored
  step. Without it, a last bit of drift from earlier steps (a clip's norm summed otherwise, a
  reduction summed in another order) changes the loss too, and would be mistaken for a forward
  that differs.
* ``dtype_differs``, ``loss_dtype_differs`` and ``autocast_differs`` are facts of the records: a
  parameter, buffer, loss or module output held in another dtype on one side. Drift never changes
  a dtype, so their premise is the record itself, and each pattern checks it.

``autocast_differs`` reads the localization (the dtype of each module's output on both sides):
the first diverging module's forward output has another dtype in the two runs (float16 against
float32, say) while every parameter and buffer has the same dtype in both, so something around
the forward chose it: ``torch.autocast`` on one side only (or to another dtype). Measured
(``suites/parity/test_recipes.py``): an ``autocast-fp16`` row whose reference runs without
autocast fails at step 0 in the first ``Linear``; a ``mixed-bf16`` row fails where autocast
upcasts (a ``LayerNorm``, a softmax) instead.
"""

from __future__ import annotations

import math

import torch

from harness.parity.judge.evidence import Cause, Evidence, KnownCause
from harness.parity.ranks.measure.record import RunRecord, StepRecord
from harness.parity.ranks.measure.ulp import short


def forward_differs(e: Evidence) -> Cause | None:
    """The ``forward_differs`` pattern: a loss that differs, the staged check's loss or local stage
    failing first, or a module's output differing where a localization told the gradients apart."""
    measured = e.measured
    ranks = ", ".join(
        str(rank)
        for rank, (want, got) in enumerate(zip(e.reference.losses, e.candidate.losses, strict=True))
        if want != got
    )
    if "loss" in e.failed and e.candidate.step == 0:
        evidence = f"the loss differs already at step 0 on rank(s) {ranks}, before any optimizer step"
    elif measured.source == "staged" and measured.stage in ("loss", "local"):
        evidence = (
            f"at step {measured.step}, from the same parameters and state (the staged check re-anchored "
            f"the reference to the candidate's), the {measured.stage} stage differs first: {measured.detail}"
        )
    elif "loss" in e.failed and measured.source == "straight" and measured.step == e.candidate.step:
        evidence = (
            f"the loss differs at step {e.candidate.step} on rank(s) {ranks}, from the same parameters "
            "and state (the straight runs were bitwise at every earlier step)"
        )
    elif "loss" in e.failed:
        evidence = f"the loss differs at step {e.candidate.step} on rank(s) {ranks}"
    elif measured.stage == "local" and measured.localized:
        evidence = (
            f"at step {measured.step} the losses match but a module's output or gradient differs on some "
            "rank, localized from the same parameters and state"
        )
    else:
        return None
    return Cause(
        name="forward_differs",
        evidence=evidence,
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


def _short_losses(losses: tuple[float, ...] | list[float]) -> str:
    return "[" + ", ".join(f"{loss:.9g}" for loss in losses) + "]"


def loss_dtype_differs(e: Evidence) -> Cause | None:
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


def dtype_differs(e: Evidence) -> Cause | None:
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


_LOW = ("float16", "bfloat16")


def autocast_differs(e: Evidence) -> Cause | None:
    """The ``autocast_differs`` pattern (module docstring), from the localization."""
    found = e.localization
    first = found.first if found is not None else None
    if found is None or first is None or first.phase != "forward" or first.dtypes is None:
        return None
    want, got = first.dtypes
    if not ({want, got} & set(_LOW)):
        return None
    if dtype_differences(e.reference, e.candidate):
        return None  # a parameter or buffer in another dtype explains it: dtype_differs
    return Cause(
        name="autocast_differs",
        evidence=(
            f"{first.display_name}'s forward output at step {found.step} is {got} in the candidate and {want} "
            "in the reference, while every parameter and buffer has the same dtype in both runs"
        ),
        explanation=(
            "One run's forward is under torch.autocast and the other's is not (or autocasts to "
            "another dtype): autocast computes this module's ops in low precision from float32 "
            "parameters, or upcasts them to float32. The reference of an autocast recipe must run "
            "its forward under the same torch.autocast as the candidate (its unsharded twin), and "
            "a training loop must enter autocast around the forward on every engine it compares"
        ),
        reference="torch.amp autocast; pytorch test_fully_shard_mixed_precision.py",
    )


_A_FACT = "the records holding {} in another dtype on one side (a fact no drift changes)"

CAUSES = (
    KnownCause(
        name="forward_differs",
        premise=(
            "the loss or the local gradients differing first from a common state (step 0, a step "
            "the straight runs reached bitwise, or the staged check's re-anchored step)"
        ),
        blames=frozenset({"loss", "local"}),
        pattern=forward_differs,
    ),
    KnownCause(name="dtype_differs", premise=_A_FACT.format("a parameter or buffer"), pattern=dtype_differs),
    KnownCause(name="loss_dtype_differs", premise=_A_FACT.format("the loss"), pattern=loss_dtype_differs),
)
"""The forward's causes read from the step records, in the order the report lists them."""

FROM_LOCALIZATION = (
    KnownCause(
        name="autocast_differs",
        premise=_A_FACT.format("the first diverging module's output, every parameter and buffer alike"),
        pattern=autocast_differs,
    ),
)
"""The forward's causes read from a localization."""
