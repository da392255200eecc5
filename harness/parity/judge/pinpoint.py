"""Localization, controller side: the first module whose values leave the tolerance.

``localize.run_batch`` sends, for every rank, each module's forward output (in the order modules
finish their forward) and the gradient of each module's output (in backward order) from both the
reference and the candidate at the first diverging step. This walks them in that order (forward
first, then backward, each in the reference's order) and names the first module whose values
differ beyond the configuration's tolerance profile, with the phase, rank, step and error. Pure.

When nothing differs, the forward and backward at that step are the same on every rank, and the
divergence arises after them: in the gradient reduction, the scaler or the optimizer step (the
known causes name which, when they can).
"""

from __future__ import annotations

import dataclasses

import torch

from harness.parity.plan.profiles import ToleranceProfile
from harness.parity.ranks.measure.distance import format_ulp, tensor_diff
from harness.parity.ranks.measure.ulp import short
from harness.parity.ranks.wire import Named, Probed, ProbedSide

PHASES = ("forward", "backward")
_PHASE_WORDS = {"forward": "forward output", "backward": "gradient of its output"}


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ModuleDiff:
    """How far one module's value on one rank is from the reference's."""

    phase: str
    """``forward`` (the module's output) or ``backward`` (the gradient of the loss w.r.t. it)."""
    module: str
    """Qualified name in the user's model (``blocks.1.attn``; ``""`` for the model itself), with
    ``#k`` for a later call and ``[i]`` for one of several outputs."""
    rank: int
    order: int
    """Position in execution order within its phase."""
    max_abs: float
    max_rel: float
    max_ulp: float
    mismatched: int
    numel: int
    dtypes: tuple[str, str] | None = None
    """``(reference, candidate)`` dtypes of the value where they differ (``float32``, ``float16``):
    what ``causes.autocast_differs`` reads."""

    @property
    def failed(self) -> bool:
        return self.mismatched > 0

    @property
    def display_name(self) -> str:
        return self.module or "(the model)"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class OpFinding:
    """One level deeper: the ops inside the first diverging module's forward, compared."""

    compared: int
    """Reference ops matched with a candidate op of the same name and shape."""
    first: str = ""
    """The first op whose output left the tolerance (``aten.addmm.default``), if any."""
    index: int = -1
    """Its position among the reference's ops."""
    max_abs: float = 0.0
    max_rel: float = 0.0
    max_ulp: float = 0.0
    missing: tuple[str, ...] = ()
    """Reference ops the candidate never ran (by name)."""
    extra: tuple[str, ...] = ()
    """Candidate ops the reference never ran (by name)."""

    def describe(self) -> str:
        if self.first:
            return (
                f"inside it, first diverging op: {self.first} (op {self.index + 1} of {self.compared + len(self.missing)}): "
                f"abs {self.max_abs:.3g}, rel {self.max_rel:.3g}, {format_ulp(self.max_ulp)}"
            )
        if self.missing:
            return f"inside it, the candidate never ran {', '.join(self.missing[:3])}"
        text = f"inside it, its {self.compared} op(s) match the reference's"
        if self.extra:
            return text + f"; the candidate also ran {', '.join(self.extra[:3])}"
        return text + "; its output changes after them (a forward hook, or the wrapper)"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Localization:
    """Where, inside the first diverging step, the candidate first left the reference."""

    step: int
    first: ModuleDiff | None = None
    modules: tuple[ModuleDiff, ...] = ()
    """Every module on every rank, forward then backward, each in execution order."""
    error: str = ""
    """Why the probe could not run (the ranks' text), when it could not."""
    duration_s: float = 0.0
    """Wall time of the re-runs on the ranks (both sides, through the probed step)."""
    op: OpFinding | None = None
    """Inside the first diverging module, when it diverged in its forward output."""
    anchored: bool = False
    """Both sides replayed the step from the candidate's state (the reference re-anchored to its
    parameters, optimizer state, buffers and scale first): what earlier steps drifted cannot show."""
    approximate: str = ""
    """Why the location may be drift and not the first divergence (empty: it began from a common
    state: step 0, a re-anchored replay, or a step the straight runs reached bitwise)."""

    def describe(self) -> str:
        if self.error:
            return f"not localized: {self.error.strip().splitlines()[0]}"
        how = " (replayed from the candidate's state)" if self.anchored else ""
        if self.approximate:
            how = f" (approximate: {self.approximate})"
        return self._located() + how

    def _located(self) -> str:
        first = self.first
        if first is None:
            count = len({(m.phase, m.module) for m in self.modules})
            return (
                f"no module diverges: the forward and backward of step {self.step} match on every rank "
                f"({count} module values compared); the difference arises after backward, in the "
                "gradient reduction, the scaler or the optimizer step"
            )
        text = (
            f"first diverging module: {first.display_name}, {_PHASE_WORDS[first.phase]}, step {self.step}, "
            f"rank {first.rank}: abs {first.max_abs:.3g}, rel {first.max_rel:.3g}, {format_ulp(first.max_ulp)}"
        )
        return text + (f"; {self.op.describe()}" if self.op is not None else "")

    def along(self, rank: int | None = None) -> list[ModuleDiff]:
        """The modules of one rank (the first diverging module's, else rank 0) in execution order."""
        if rank is None:
            rank = self.first.rank if self.first is not None else 0
        return [m for m in self.modules if m.rank == rank]


def _diff(
    phase: str,
    key: str,
    rank: int,
    order: int,
    want: torch.Tensor,
    got: torch.Tensor | None,
    profile: ToleranceProfile,
) -> ModuleDiff:
    if got is None or tuple(got.shape) != tuple(want.shape):  # structure differs: as far apart as can be
        inf = float("inf")
        return ModuleDiff(
            phase=phase,
            module=key,
            rank=rank,
            order=order,
            max_abs=inf,
            max_rel=inf,
            max_ulp=inf,
            mismatched=max(want.numel(), 1),
            numel=want.numel(),
        )
    diff = tensor_diff(want, got, profile, step=0, kind=phase, name=key)
    dtypes = None if want.dtype == got.dtype else (short(want.dtype), short(got.dtype))
    return ModuleDiff(
        phase=phase,
        module=key,
        rank=rank,
        order=order,
        max_abs=diff.max_abs,
        max_rel=diff.max_rel,
        max_ulp=diff.max_ulp,
        mismatched=diff.mismatched,
        numel=diff.numel,
        dtypes=dtypes,
    )


def _phase(side: ProbedSide, phase: str) -> Named:
    """One phase of a side's values (:data:`PHASES`)."""
    return side.forward if phase == "forward" else side.backward


def locate(
    step: int,
    parts: list[Probed],
    profile: ToleranceProfile,
    *,
    anchored: bool = False,
    approximate: str = "",
) -> Localization:
    """The localization from every rank's ``localize.run_one`` record (ordered by rank);
    ``anchored`` and ``approximate`` say how its replay began (:class:`Localization`)."""
    errors = [part.error for part in parts if part.error]
    duration = max((part.duration_s for part in parts), default=0.0)
    if errors:
        return Localization(step=step, error=errors[0], duration_s=duration, anchored=anchored)
    modules: list[ModuleDiff] = []
    for phase in PHASES:
        for rank, part in enumerate(parts):
            got = dict(_phase(part.candidate, phase))
            for order, (key, want) in enumerate(_phase(part.reference, phase)):
                modules.append(_diff(phase, key, rank, order, want, got.get(key), profile))
    failing = [m for m in modules if m.failed]
    first = min(failing, key=lambda m: (PHASES.index(m.phase), m.order, m.rank), default=None)
    op = None
    if first is not None and first.phase == "forward":
        found = parts[first.rank].ops
        if found is not None and found.module == first.module:
            op = locate_op(found.reference, found.candidate, profile)
    return Localization(
        step=step,
        first=first,
        modules=tuple(modules),
        duration_s=duration,
        op=op,
        anchored=anchored,
        approximate=approximate,
    )


def locate_op(reference: Named, candidate: Named, profile: ToleranceProfile) -> OpFinding:
    """The first reference op whose output the candidate's same op (next one of the same name and
    shape, in order) leaves the tolerance on; ops only one side ran are listed apart."""
    cursor, matched, missing = 0, set(), []
    compared = 0
    for index, (name, want) in enumerate(reference):
        found = next(
            (
                j
                for j in range(cursor, len(candidate))
                if candidate[j][0] == name and candidate[j][1].shape == want.shape
            ),
            None,
        )
        if found is None:
            missing.append(name)
            continue
        matched.add(found)
        cursor = found + 1
        compared += 1
        diff = tensor_diff(want, candidate[found][1], profile, step=0, kind="op", name=name)
        if diff.mismatched:
            return OpFinding(
                compared=compared,
                first=name,
                index=index,
                max_abs=diff.max_abs,
                max_rel=diff.max_rel,
                max_ulp=diff.max_ulp,
                missing=tuple(missing),
            )
    extra = tuple(dict.fromkeys(name for j, (name, _) in enumerate(candidate) if j not in matched))
    return OpFinding(compared=compared, missing=tuple(missing), extra=extra)
