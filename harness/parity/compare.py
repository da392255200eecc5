"""Compare a candidate run with its reference: the first diverging step and the worst tensor.

Pure (no processes, no collectives): it reads two :class:`RunRecord`s. Checks run step by step in
this order, and the first failing check of the earliest step is *the* divergence:

1. agreement: every rank of the candidate made the same skip decision, held the same found_inf,
   scale and growth tracker (a rank that disagrees is named);
2. scaler state against the reference: skip decisions, found_inf, scale, growth tracker (exact);
3. the loss of every rank (under the profile);
4. full tensors: names, shapes and dtypes first, then values of parameters, unscaled gradients
   and optimizer state (under the profile), gathered on rank 0 from both runs.

Messages read like ``pytest.approx``'s: ``step 3, grad inner.0.linear.weight (profile fp16):
12 / 1024 mismatched; max abs 3.1e-02, max rel 4.0e-01``.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from harness.parity.profiles import ToleranceProfile
from harness.parity.record import RunRecord, StepRecord

_TENSOR_KINDS = ("grad", "param", "optim_state")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class TensorDiff:
    """How far one candidate tensor is from the reference's, at one step."""

    step: int
    kind: str
    """``param``, ``grad`` or ``optim_state``."""
    name: str
    """Parameter name (``inner.0.linear.weight``), with the state key for optimizer state
    (``inner.0.linear.weight:exp_avg``)."""
    max_abs: float
    max_rel: float
    mismatched: int
    numel: int

    def describe(self) -> str:
        return (
            f"{self.kind} {self.name}: {self.mismatched} / {self.numel} mismatched; "
            f"max abs {self.max_abs:.3g}, max rel {self.max_rel:.3g}"
        )


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Divergence:
    """One failed check."""

    step: int
    what: str
    """``agreement``, ``skipped``, ``found_inf``, ``scale``, ``tracker``, ``loss``, ``names``,
    ``shape``, ``dtype``, ``param``, ``grad``, ``optim_state``, ``steps`` or ``crash``."""
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

    @property
    def first(self) -> Divergence | None:
        return self.divergences[0] if self.divergences else None

    @property
    def ok(self) -> bool:
        return not self.divergences


def tensor_diff(
    reference: torch.Tensor,
    candidate: torch.Tensor,
    profile: ToleranceProfile,
    *,
    step: int,
    kind: str,
    name: str,
) -> TensorDiff:
    """Elementwise comparison in float64 (``exact``: every element equal); NaN matches NaN."""
    ref = reference.detach().to("cpu")
    cand = candidate.detach().to("cpu")
    if ref.is_sparse:
        ref = ref.to_dense()
    if cand.is_sparse:
        cand = cand.to_dense()
    r = ref.double()
    c = cand.double()
    both_nan = r.isnan() & c.isnan()
    if profile.bitwise:
        same = (ref == cand) | both_nan
    else:  # a non-finite value must be matched exactly: inf - (-inf) is within no tolerance
        finite = r.isfinite() & c.isfinite()
        close = (c - r).abs() <= profile.atol + profile.rtol * r.abs()
        same = torch.where(finite, close, (c == r) | both_nan)
    equal = both_nan | (c == r)
    delta = torch.where(equal, torch.zeros_like(r), (c - r).abs())
    delta = torch.where(delta.isnan(), torch.full_like(delta, math.inf), delta)
    scale = r.abs()
    rel = torch.where(scale.isfinite() & (scale > 0), delta / scale, torch.where(delta > 0, math.inf, 0.0))
    return TensorDiff(
        step=step,
        kind=kind,
        name=name,
        max_abs=float(delta.max()) if delta.numel() else 0.0,
        max_rel=float(rel.max()) if rel.numel() else 0.0,
        mismatched=int((~same).sum()),
        numel=ref.numel(),
    )


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


def _loss_problems(ref: StepRecord, cand: StepRecord, profile: ToleranceProfile) -> tuple[list[str], float]:
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
        if diff.mismatched:
            problems.append(f"rank {rank} loss {got!r}, reference {want!r} (abs diff {diff.max_abs:.3g})")
    return problems, worst


def _flatten(step: StepRecord, kind: str) -> dict[str, torch.Tensor]:
    if kind == "param":
        return step.params
    if kind == "grad":
        return step.grads
    return {
        f"{name}:{key}": value for name, state in step.optim_state.items() for key, value in state.items()
    }


def _tensor_problems(
    ref: StepRecord, cand: StepRecord, profile: ToleranceProfile, kinds: tuple[str, ...]
) -> tuple[list[tuple[str, str]], list[TensorDiff]]:
    problems: list[tuple[str, str]] = []
    diffs: list[TensorDiff] = []
    for kind in kinds:
        want, got = _flatten(ref, kind), _flatten(cand, kind)
        if set(want) != set(got):
            missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
            problems.append(("names", f"{kind} names differ: missing {missing}, unexpected {extra}"))
        for name in sorted(set(want) & set(got)):
            w, g = want[name], got[name]
            if tuple(w.shape) != tuple(g.shape):
                problems.append(
                    ("shape", f"{kind} {name}: shape {tuple(g.shape)}, reference {tuple(w.shape)}")
                )
                continue
            if w.dtype != g.dtype:
                problems.append(("dtype", f"{kind} {name}: dtype {g.dtype}, reference {w.dtype}"))
                continue
            diff = tensor_diff(w, g, profile, step=cand.step, kind=kind, name=name)
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

    ``poisoned_steps`` are steps with a planted inf/NaN: their gradients are not compared (they
    hold the planted value, planted on one rank in the candidate and on every rank in the
    reference), but everything else is, the unchanged parameters and optimizer state above all.
    """
    divergences: list[Divergence] = []
    all_diffs: list[TensorDiff] = []
    worst_at_first: TensorDiff | None = None
    max_loss = 0.0
    for ref, cand in zip(reference.steps, candidate.steps, strict=False):
        found: list[tuple[str, str]] = [("agreement", text) for text in _same_on_every_rank(cand)]
        found += _scaler_state(ref, cand)
        losses, loss_diff = _loss_problems(ref, cand, profile)
        max_loss = max(max_loss, loss_diff)
        found += [("loss", text) for text in losses]
        kinds = tuple(k for k in _TENSOR_KINDS if not (k == "grad" and cand.step in poisoned_steps))
        tensor_found, diffs = _tensor_problems(ref, cand, profile, kinds)
        found += tensor_found
        all_diffs += diffs
        if found and worst_at_first is None and not divergences:
            failing = [d for d in diffs if d.mismatched]
            worst_at_first = max(failing, key=lambda d: (d.max_abs, d.mismatched), default=None)
        divergences += [
            Divergence(
                step=cand.step, what=what, message=f"step {cand.step}, {text} (profile {profile.name})"
            )
            for what, text in found
        ]
    shorter = min(len(reference.steps), len(candidate.steps))
    if candidate.error:
        first_line = candidate.error.strip().splitlines()[-1]
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
    )
