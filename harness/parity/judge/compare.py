"""Compare a candidate run with its reference: the first diverging step and the worst tensor.

Pure (no processes, no collectives): it reads two :class:`RunRecord`s. Checks run step by step in
this order, and the first failing check of the earliest step is *the* divergence:

1. agreement: every rank of the candidate made the same skip decision, held the same found_inf,
   scale and growth tracker (a rank that disagrees is named);
2. scaler state against the reference: skip decisions, found_inf, scale, growth tracker (exact);
3. the loss of every rank (under the profile), then each rank's clip norm (path ``unscale_clip``:
   the total norm ``clip_grad_norm_`` returned, under ``clip_norm.py``'s measured tolerance);
4. tensors: names, shapes and dtypes first, then values of parameters, unscaled gradients and
   optimizer state (under the profile): the distances each rank measured on its own pieces
   (``StepRecord.diffs``, merged), or, for a record made whole, measured here;
5. module buffers (normalization statistics), every rank's own, as a kind of their own: DDP
   broadcasts rank 0's buffers before every forward, FSDP does not, so they may differ on rank 1
   only. Their values are compared (under the profile), not their dtypes: FSDP1's mixed precision
   casts buffers, FSDP2's does not.

Every distance is also measured in ULPs of the tensor's dtype (``ulp.py``): a passing
configuration is ``bitwise``, ``≤ N ulp`` or ``toleranced`` (``Comparison.closeness``).

Messages read like ``pytest.approx``'s: ``step 3, grad inner.0.linear.weight (profile fp16):
12 / 1024 mismatched; max abs 3.1e-02, max rel 4.0e-01``.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from harness.failure_text import headline_of_text
from harness.parity.judge import clip_norm
from harness.parity.plan.profiles import ToleranceProfile
from harness.parity.ranks.measure import ulp
from harness.parity.ranks.measure.distance import TensorDiff, equal_diff, tensor_diff
from harness.parity.ranks.measure.record import RunRecord, StepRecord

_TENSOR_KINDS = ("grad", "param", "optim_state")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class StepDistance:
    """How far the candidate was from the reference at one step, over everything compared."""

    step: int
    max_ulp: float
    max_rel: float
    failed: bool
    """A check failed at this step."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Divergence:
    """One failed check."""

    step: int
    what: str
    """``agreement``, ``skipped``, ``found_inf``, ``scale``, ``tracker``, ``loss``, ``clip_norm``, ``names``,
    ``shape``, ``dtype``, ``param``, ``grad``, ``optim_state``, ``buffer``, ``steps`` or ``crash``."""
    message: str


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Comparison:
    """Everything :func:`compare_runs` found."""

    profile: ToleranceProfile
    divergences: tuple[Divergence, ...]
    """Every failed check, in step order (at most ``max_divergences``)."""
    worst: TensorDiff | None
    """The worst tensor at the first diverging step; without divergence, the largest difference
    anywhere (``None`` when every tensor matched bitwise)."""
    max_loss_diff: float
    """Over every step and rank (``inf`` when a loss is non-finite in one run only)."""
    max_ulp: float = 0.0
    """The largest ULP distance of any loss or tensor compared, at any step."""
    steps: tuple[StepDistance, ...] = ()
    """Per step, the largest distances (the report's heatmap)."""
    at_first: tuple[TensorDiff, ...] = ()
    """Every tensor compared at the first diverging step (``parity.json``'s full comparison)."""

    @property
    def closeness(self) -> str:
        """``bitwise``, ``≤ N ulp`` or ``toleranced`` for a passing comparison, else empty."""
        return ulp.label(self.max_ulp, passed=self.ok)

    @property
    def first(self) -> Divergence | None:
        return self.divergences[0] if self.divergences else None

    @property
    def ok(self) -> bool:
        return not self.divergences


def _same_on_every_rank(step: StepRecord) -> list[str]:
    """Each scaler quantity on which the candidate's ranks disagree, described."""
    problems = []
    for label, values in (("scale", step.scales), ("growth tracker", step.trackers)):
        if len(set(values)) > 1:
            problems.append(f"{label} differs across ranks: {_by_rank(values)}")
    flags = [tuple(bool(f) for f in per_rank) for per_rank in step.found_inf]
    if len(set(flags)) > 1:
        problems.append(f"found_inf differs across ranks: {_by_rank(step.found_inf)}")
    for index in range(len(step.skipped[0]) if step.skipped else 0):
        decided = {rank: flags[index] for rank, flags in enumerate(step.skipped) if flags[index] is not None}
        if len(set(decided.values())) > 1:
            problems.append(f"optimizer {index} skipped on some ranks only: {_by_rank_map(decided)}")
    return problems


def _by_rank(values: tuple[object, ...]) -> str:
    return ", ".join(f"rank {rank}={value}" for rank, value in enumerate(values))


def _by_rank_map(values: dict[int, object]) -> str:
    return ", ".join(f"rank {rank}={value}" for rank, value in values.items())


def _decided(step: StepRecord, optimizer: int) -> bool | None:
    """The skip decision of ``optimizer`` as the first rank holding elements of it saw it."""
    for flags in step.skipped:
        if flags[optimizer] is not None:
            return flags[optimizer]
    return None


def _scaler_state(ref: StepRecord, cand: StepRecord) -> list[tuple[str, str]]:
    problems = []
    optimizers = len(ref.skipped[0])
    for index in range(optimizers):
        want, got = _decided(ref, index), _decided(cand, index)
        if want is not None and got is not None and want != got:
            verb = "skipped" if want else "stepped"
            problems.append(("skipped", f"optimizer {index}: the reference {verb}, the candidate did not"))
    want_inf = [bool(f) for f in ref.found_inf[0]]
    for rank, flags in enumerate(cand.found_inf):
        if [bool(f) for f in flags] != want_inf:
            problems.append(
                ("found_inf", f"rank {rank} found_inf {list(flags)}, reference {list(ref.found_inf[0])}")
            )
            break
    for label, key, want, values in (
        ("scale", "scale", ref.scales[0], cand.scales),
        ("growth tracker", "tracker", ref.trackers[0], cand.trackers),
    ):
        wrong = {rank: value for rank, value in enumerate(values) if value != want}
        if wrong:
            problems.append((key, f"{label} {_by_rank_map(wrong)}, reference {want}"))
    return problems


def _loss_problems(
    ref: StepRecord, cand: StepRecord, profile: ToleranceProfile, diffs: list[TensorDiff]
) -> tuple[list[str], float]:
    """Each rank's loss; its distance is appended to ``diffs`` (in ULPs of float32, the dtype of a
    workload's loss; the comparison itself is in float64)."""
    problems, worst = [], 0.0
    for rank, (want, got) in enumerate(zip(ref.losses, cand.losses, strict=True)):
        diff = tensor_diff(
            torch.tensor([want], dtype=torch.float64),
            torch.tensor([got], dtype=torch.float64),
            profile,
            step=cand.step,
            kind="loss",
            name=f"rank {rank}",
        )
        worst = max(worst, diff.max_abs)
        diffs.append(dataclasses.replace(diff, max_ulp=ulp.of_floats(want, got)))
        if diff.mismatched:
            problems.append(f"rank {rank} loss {got!r}, reference {want!r} (abs diff {diff.max_abs:.3g})")
    return problems, worst


def _aligned_dtypes(
    want: dict[str, torch.Tensor], got: dict[str, torch.Tensor]
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Both sides of each floating-point buffer in the coarser of their two dtypes."""
    want, got = dict(want), dict(got)
    for name in set(want) & set(got):
        w, g = want[name], got[name]
        if w.dtype != g.dtype and w.is_floating_point() and g.is_floating_point():
            dtype = ulp.coarser(w.dtype, g.dtype)
            want[name], got[name] = w.to(dtype), g.to(dtype)
    return want, got


def _values_dtypes(kind: str, want: torch.dtype, got: torch.dtype) -> tuple[torch.dtype, torch.dtype]:
    """Buffers are compared by value, not dtype (FSDP1 mixed precision casts buffers): two
    floating-point dtypes count as their coarser one."""
    if kind == "buffer" and want != got and want.is_floating_point and got.is_floating_point:
        return ulp.coarser(want, got), ulp.coarser(want, got)
    return want, got


def _tensor_problems(
    ref: StepRecord, cand: StepRecord, profile: ToleranceProfile, kinds: tuple[str, ...]
) -> tuple[list[tuple[str, str]], list[TensorDiff]]:
    """Names, shapes and dtypes of each kind, then each tensor's distance: as measured on the
    ranks (``cand.diffs``), or measured here on full tensors (a record made whole)."""
    problems: list[tuple[str, str]] = []
    diffs: list[TensorDiff] = []
    for kind in kinds:
        want, got = ref.shapes(kind), cand.shapes(kind)
        if set(want) != set(got):
            missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
            problems.append(("names", f"{kind} names differ: missing {missing}, unexpected {extra}"))
        measured = None if cand.diffs is None else cand.diffs.get(kind, {})
        if measured is None:
            whole = ref.tensors(kind), cand.tensors(kind)
            if kind == "buffer":
                whole = _aligned_dtypes(*whole)
        for name in sorted(set(want) & set(got)):
            (want_shape, want_dtype), (got_shape, got_dtype) = want[name], got[name]
            if tuple(want_shape) != tuple(got_shape):
                problems.append(
                    ("shape", f"{kind} {name}: shape {tuple(got_shape)}, reference {tuple(want_shape)}")
                )
                continue
            want_dtype, got_dtype = _values_dtypes(kind, want_dtype, got_dtype)
            if want_dtype != got_dtype:
                problems.append(("dtype", f"{kind} {name}: dtype {got_dtype}, reference {want_dtype}"))
                continue
            if measured is None:
                diff = tensor_diff(
                    whole[0][name], whole[1][name], profile, step=cand.step, kind=kind, name=name
                )
            else:
                # a tensor no rank holds an element of (empty): nothing differs
                diff = measured.get(name) or equal_diff(
                    math.prod(want_shape), step=cand.step, kind=kind, name=name
                )
            diffs.append(diff)
            if diff.mismatched:
                problems.append((kind, diff.describe()))
    return problems, diffs


def compare_runs(
    reference: RunRecord,
    candidate: RunRecord,
    *,
    profile: ToleranceProfile,
    poisoned_steps: frozenset[int] = frozenset(),
    max_divergences: int = 20,
) -> Comparison:
    """Check ``candidate`` against ``reference`` step by step (see the module docstring).

    ``poisoned_steps`` are steps with a planted inf/NaN: their gradients and clip norms are not
    compared (they hold the planted value, planted on one rank in the candidate and on every rank
    in the reference: DDP's rank 0 clips a finite norm where the reference's is infinite), but
    everything else is, the unchanged parameters and optimizer state above all.
    """
    divergences: list[Divergence] = []
    all_diffs: list[TensorDiff] = []
    distances: list[StepDistance] = []
    worst_at_first: TensorDiff | None = None
    at_first: list[TensorDiff] = []
    max_loss = 0.0
    for ref, cand in zip(reference.steps, candidate.steps, strict=False):
        found: list[tuple[str, str]] = [("agreement", text) for text in _same_on_every_rank(cand)]
        found += _scaler_state(ref, cand)
        loss_diffs: list[TensorDiff] = []
        losses, loss_diff = _loss_problems(ref, cand, profile, loss_diffs)
        max_loss = max(max_loss, loss_diff)
        found += [("loss", text) for text in losses]
        if cand.step not in poisoned_steps:  # a planted value reaches one rank's norm, or every rank's
            found += [("clip_norm", text) for text in clip_norm.problems(ref, cand, profile)]
        kinds = tuple(k for k in _TENSOR_KINDS if not (k == "grad" and cand.step in poisoned_steps))
        tensor_found, diffs = _tensor_problems(ref, cand, profile, (*kinds, "buffer"))
        found += tensor_found
        all_diffs += diffs
        step_diffs = loss_diffs + diffs
        distances.append(
            StepDistance(
                step=cand.step,
                max_ulp=max((d.max_ulp for d in step_diffs), default=0.0),
                max_rel=max((d.max_rel for d in step_diffs), default=0.0),
                failed=bool(found),
            )
        )
        if found and worst_at_first is None and not divergences:
            failing = [d for d in diffs if d.mismatched]
            worst_at_first = max(failing, key=lambda d: (d.max_abs, d.mismatched), default=None)
            at_first = step_diffs
        divergences += [
            Divergence(
                step=cand.step, what=what, message=f"step {cand.step}, {text} (profile {profile.name})"
            )
            for what, text in found
        ]
    shorter = min(len(reference.steps), len(candidate.steps))
    if candidate.error:
        first_line = headline_of_text(candidate.error)
        divergences.append(
            Divergence(
                step=shorter, what="crash", message=f"step {shorter}, the candidate raised: {first_line}"
            )
        )
    elif len(candidate.steps) != len(reference.steps):
        divergences.append(
            Divergence(
                step=shorter,
                what="steps",
                message=f"the candidate recorded {len(candidate.steps)} steps, the reference {len(reference.steps)}",
            )
        )
    worst = worst_at_first
    if worst is None:
        nonzero = [d for d in all_diffs if d.max_abs > 0]
        worst = max(nonzero, key=lambda d: (d.max_abs, -d.step), default=None)
    return Comparison(
        profile=profile,
        divergences=tuple(divergences[:max_divergences]),
        worst=worst,
        max_loss_diff=max_loss,
        max_ulp=max((d.max_ulp for d in distances), default=0.0),
        steps=tuple(distances),
        at_first=tuple(at_first),
    )
