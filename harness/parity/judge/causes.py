"""Known causes: patterns over the recorded data that turn a divergence into a likely explanation.

Why a catalogue: the same few mistakes account for most sharded runs that drift from DDP, and
each leaves a recognisable trace in what the engine records anyway (per-rank skip decisions, the
losses, gradients, parameters, optimizer state and buffers of the first diverging step). Each
entry is a pure function of the two records and the comparison, a sentence saying what the
pattern usually means, and a reference to read further. It says *likely*: the evidence is quoted
so a reader can judge. Pure, controller side.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from harness.parity.judge.compare import Comparison
from harness.parity.ranks.record import RunRecord, StepRecord


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Cause:
    """A known cause that matches a divergence."""

    name: str
    """``skip_desync``, ``divide_factor``, ``forward_differs``, ``dtype_differs``, ``reduce_order``,
    ``noise_gradient``, ``optimizer_only`` or ``buffers_only``."""
    evidence: str
    """What in the records matched, with numbers."""
    explanation: str
    """What the pattern usually means."""
    reference: str
    """Where to read more (an issue, a document)."""

    def describe(self) -> str:
        return f"known cause ({self.name}): {self.evidence}. {self.explanation} ({self.reference})"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Evidence:
    """What a pattern sees: both runs at the first diverging step, and what failed there."""

    reference: StepRecord
    candidate: StepRecord
    failed: frozenset[str]
    """The ``what`` of every divergence at that step."""
    world_size: int
    grads_compared: bool
    """False at a step with a planted fault (its gradients hold the planted value)."""
    reduce_dtype: torch.dtype | None = None
    """The dtype both runs sum their ranks' gradients in (``None``: not known, or float32)."""


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


def _short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _under(name: str, module: str | None) -> bool:
    """Whether tensor ``name`` belongs to ``module`` (a localized name: ``#k`` and ``[i]`` dropped)."""
    if module is None:
        return True
    owner = module.split("#")[0].split("[")[0]
    return not owner or name.startswith(owner + ".")


def dtype_differences(reference: StepRecord, candidate: StepRecord, module: str | None = None) -> list[str]:
    """``name is A in the candidate and B in the reference`` for every parameter and (rank 0's)
    buffer whose dtype differs between the runs, inside ``module`` when given, by name."""
    sides = [(reference.params, candidate.params)]
    if reference.buffers and candidate.buffers:
        sides.append((reference.buffers[0], candidate.buffers[0]))
    found = []
    for want, got in sides:
        for name in sorted(want.keys() & got.keys()):
            if want[name].dtype != got[name].dtype and _under(name, module):
                found.append(
                    f"{name} is {_short(got[name].dtype)} in the candidate and {_short(want[name].dtype)} in the reference"
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


_MANTISSA = {torch.float16: 10, torch.bfloat16: 7}


def _ulps_of_largest(want: torch.Tensor, got: torch.Tensor, dtype: torch.dtype) -> float:
    """The largest ``|got - want|`` in units in the last place of ``dtype`` at the largest ``|want|``
    of the tensor: the scale a reduction's rounding error lives at."""
    largest = float(want.double().abs().max())
    if largest == 0 or not largest < float("inf"):
        return float("inf")
    exponent = torch.tensor(largest, dtype=torch.float64).frexp().exponent.item() - 1
    ulp = 2.0 ** (exponent - _MANTISSA[dtype])
    return float((got.double() - want.double()).abs().max()) / ulp


def _reduce_order(e: Evidence) -> Cause | None:
    """Gradients summed over more than two ranks in float16/bfloat16, differing by no more than a
    few of that dtype's ulps at each tensor's scale: the addends were summed in another order.

    Why it is no bug: on gloo each element is summed in an order set by its position in the
    reduced buffer (measured at world size 4: the element in the c-th quarter of the buffer adds
    ranks c+2, c+3, c+1, c), and FSDP reduces per unit flat parameter (FSDP1) or per interleaved
    dim-0 shard (FSDP2) where the reference reduces one flat buffer, so the same addends meet in
    another order; two addends commute, so world size 2 is exact. At step 0 of ``five_classes`` in
    bfloat16 on four ranks, before anything else differs, a quarter to a half of every gradient's
    elements differ by one bfloat16 ulp at the tensor's largest magnitude; an element that nearly
    cancels keeps that absolute error and fails the relative tolerance, and a momentum buffer
    summing such gradients over steps can leave it while each gradient stays inside."""
    if e.reduce_dtype not in _MANTISSA or e.world_size <= 2 or not e.grads_compared:
        return None
    bound = 2 * (e.world_size - 1)
    worst, worst_name = 0.0, ""
    for name, want in e.reference.grads.items():
        got = e.candidate.grads.get(name)
        if got is None or got.shape != want.shape or torch.equal(want, got):
            continue
        if not (want.isfinite().all() and got.isfinite().all()):
            return None
        ulps = _ulps_of_largest(want, got, e.reduce_dtype)
        if ulps > bound:
            return None
        if ulps > worst:
            worst, worst_name = ulps, name
    if not worst_name or not e.failed & {"grad", "param", "optim_state"}:
        return None
    dtype = _short(e.reduce_dtype)
    return Cause(
        name="reduce_order",
        evidence=(
            f"at step {e.candidate.step} every gradient is within {bound} {dtype} ulps of the reference "
            f"at its tensor's largest magnitude (worst {worst_name}: {worst:.3g}), summed over "
            f"{e.world_size} ranks in {dtype}"
        ),
        explanation=(
            f"Summation order, not sharding: {e.world_size} ranks' {dtype} gradients are summed in "
            "another order by FSDP's reduce-scatter (per flat parameter or shard) than by the "
            "reference's one all-reduce (gloo orders each element by its place in the buffer), and "
            f"each order rounds to its own {dtype} value; an element that nearly cancels keeps that "
            "absolute error and fails the relative tolerance, or the optimizer state that "
            "accumulates it drifts past the tolerance. Expect it at world size > 2 with a "
            "low-precision reduce dtype (reduce in float32 for a bitwise-comparable run)"
        ),
        reference="harness/parity/ranks/twin.py (reduction)",
    )


def _noise_gradient(e: Evidence) -> Cause | None:
    """Parameters that move apart although their gradient is rounding noise (at most 1e-6 of the
    step's largest gradient): Adam divides each gradient by its own running RMS, so noise-sized
    last-bit differences become learning-rate-sized moves.

    Measured on ``tiny_conv`` (a convolution bias before a per-channel GroupNorm, whose true
    gradient is zero: |g| ~ 1e-9): FSDP1 with ``use_orig_params=True`` and ``Adam(fused=True)``
    rounds one element one float32 ulp away from DDP at step 1 (plain torch, one thread, no
    scaler: ``docs/repro/fused_adam_orig_params.py``; foreach Adam is bitwise, so it is torch's
    fused kernel, not the engine), the bias gradients then differ by a relative 2.7, and Adam moves
    those biases by 3e-5 to 9e-5, exactly as the parity rows report."""
    if not e.grads_compared or "param" not in e.failed:
        return None
    norms = {name: float(g.double().abs().max()) for name, g in e.reference.grads.items() if g.numel()}
    if not norms:
        return None
    largest = max(norms.values())
    moved = []
    for name, want in e.reference.params.items():
        got = e.candidate.params.get(name)
        if got is None or got.shape != want.shape or not want.is_floating_point():
            continue
        scale = float(want.double().abs().max()) or 1.0
        if float((got.double() - want.double()).abs().max()) > 1e-5 * scale:
            moved.append(name)
    if not moved or largest == 0 or any(norms.get(name, largest) > 1e-6 * largest for name in moved):
        return None
    shown = ", ".join(f"{name} (|grad| <= {norms[name]:.2g})" for name in moved[:3])
    return Cause(
        name="noise_gradient",
        evidence=(
            f"at step {e.candidate.step} the parameters that moved apart have gradients of rounding "
            f"noise, at most 1e-6 of the largest gradient ({largest:.2g}): {shown}"
        ),
        explanation=(
            "These parameters have no true gradient (a bias followed by a normalization that "
            "removes it, such as a convolution bias before a per-channel GroupNorm), so their "
            "gradient is rounding noise, and Adam, dividing each gradient by its own running RMS, "
            "turns a last-bit difference elsewhere (a fused kernel, a reduction order) into a "
            "learning-rate-sized move. Not a sharding bug: remove or freeze such a bias, or check "
            "parity with a non-fused optimizer"
        ),
        reference="harness/parity/judge/causes.py (_noise_gradient)",
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
    ("skip_desync", _skip_desync),
    ("divide_factor", _divide_factor),
    ("forward_differs", _forward_differs),
    ("dtype_differs", _dtype_differs),
    ("reduce_order", _reduce_order),
    ("noise_gradient", _noise_gradient),
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
    evidence = Evidence(
        reference=reference.steps[first.step],
        candidate=candidate.steps[first.step],
        failed=frozenset(d.what for d in comparison.divergences if d.step == first.step),
        world_size=len(candidate.steps[first.step].losses),
        grads_compared=first.step not in poisoned_steps,
        reduce_dtype=reduce_dtype,
    )
    found = (pattern(evidence) for _, pattern in CATALOGUE)
    return tuple(cause for cause in found if cause is not None)
