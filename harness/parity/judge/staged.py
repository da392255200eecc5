"""The staged check's verdict (controller side, pure): what every rank measured, stage by stage.

Why it decides a row: the straight-through comparison is a proof where it is bitwise; where it
is not (a candidate that reduces in another order than its reference; a clip norm summed
otherwise) a tolerance used to decide, wrong both ways. The staged check
(``ranks/staged.py``) re-anchors the reference each step and judges each stage by what is
*known*: local gradients and losses bitwise; each reduced element within the order-free bound of
the exact mean (``ranks/measure/bound.py``: a proof for any order); the clip norm within what any
order of summing its squares gives (``clip_norm.order_free_bound``); the update bitwise (a fused
optimizer's too: its reference steps the candidate's shards, ``ranks/sides/optim/step_pieces.py``);
each rank's buffers (running statistics) bitwise; the scale and growth tracker equal. A row whose
straight comparison was not bitwise passes when every stage holds at every step, and fails with
the first stage that does not, named.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from harness.parity.judge import clip_norm
from harness.parity.plan import profiles
from harness.parity.plan.config import ParityConfig
from harness.parity.ranks.wire import StagedRun, StagedStep
from harness.parity.workload import registry


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Finding:
    """One stage that did not hold: where, and by how much."""

    step: int
    stage: str
    """``local``, ``loss``, ``reduction``, ``clip``, ``update``, ``buffer`` or ``scale``."""
    what: str
    """The tensor (``param:blocks.0.weight``), or the scalar."""
    detail: str
    rank: int | None = None

    def line(self) -> str:
        where = f" on rank {self.rank}" if self.rank is not None else ""
        return f"step {self.step}, {self.stage} stage{where}: {self.what}: {self.detail}"

    def said(self) -> str:
        """What differed, without the step and stage (a sentence that names them already)."""
        where = f" on rank {self.rank}" if self.rank is not None else ""
        return f"{self.what}{where}: {self.detail}"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Staged:
    """The staged verdict on one configuration."""

    passed: bool
    steps: int = 0
    error: str = ""
    findings: tuple[Finding, ...] = ()
    """The first finding of each stage, in step order."""
    local_elements: int = 0
    """Local gradient elements compared bitwise (all ranks, all steps); 0: not observable (DDP)."""
    reduced_elements: int = 0
    """Reduced gradient elements judged against the order-free bound (all steps)."""
    worst_ratio: float = 0.0
    """The largest distance from the exact mean in units of the bound (< 1 everywhere to pass)."""
    reordered: int = 0
    """Reduced elements whose bits differ from the reference's mirror of the candidate's own
    reduction (another order of summation than the mirrored one: legitimate within the bound)."""
    update_max_ulp: float = 0.0
    reordering_drift: tuple[float, ...] = ()
    """On request (``--drift``): per step, the largest ulp distance of any parameter between the
    reference trained straight through twice, once summing its ranks in reverse order: the drift a
    legitimate reordering alone produces, to read the row's own straight-through drift against."""

    def summary(self) -> str:
        """One line for the report."""
        if self.error:
            return f"staged check could not run: {self.error.strip().splitlines()[-1]}"
        if not self.passed:
            return "staged check failed: " + self.findings[0].line()
        local = (
            f"{self.local_elements} local gradient elements bitwise"
            if self.local_elements
            else ("local gradients not observable (DDP's reducer)")
        )
        update = "bitwise" if self.update_max_ulp == 0 else f"{self.update_max_ulp:g} ulp apart"
        return (
            f"staged check passed over {self.steps} steps: {local}; {self.reduced_elements} reduced "
            f"elements within the order-free bound (worst {self.worst_ratio:.2g} of it; "
            f"{self.reordered} summed in another order than the mirror); updates {update}"
        )


def unjudged(config: ParityConfig) -> str | None:
    """Why the staged check cannot judge ``config`` (``None``: it can). A TP row's local gradients
    are TP shards of another layout than the captured reduction's, and its reference mirrors the
    split, so its straight comparison stays the verdict (``causes/two_d.py``); a DDP candidate's
    reducer runs in C++, where its local gradients cannot be captured; a resume row restarts its
    candidate mid-run; a sparse workload's reference runs every rank's batch at once. A user's
    function is judged unless its candidate, once built, refuses (DDP at the root, a TP plan:
    ``Engine.staged_refusal``), which the check records as the reason it could not run."""
    if config.mesh.tp is not None:
        return "the staged check does not judge tensor-parallel rows (their reference mirrors the split)"
    if config.mesh.pp is not None:
        return "the staged check does not judge pipeline rows (each stage holds its own part of the model)"
    if config.engine not in ("fsdp1", "fsdp2", "user") or config.reference != "ddp":
        return (
            "the staged check judges FSDP candidates against their DDP twin only (DDP's reducer runs in C++)"
        )
    if config.resume.at is not None:
        return "the staged check does not judge resume rows (the candidate restarts mid-run)"
    try:
        sparse = registry.get(config.workload).sparse
    except Exception:  # noqa: BLE001 - an unresolvable workload already has its own error
        return "the workload could not be resolved"
    if sparse:
        return "the staged check does not judge sparse workloads (their reference runs every rank's batch at once)"
    return None


def wanted(config: ParityConfig, status: str, max_ulp: float, expected_failure: str) -> bool:
    """Whether a row's straight verdict goes to the staged check: a passing or failing row that was
    not bitwise, that the check can judge (:func:`unjudged`) and that is not expected to fail."""
    if status not in ("pass", "fail") or (status == "pass" and max_ulp == 0) or expected_failure:
        return False
    return unjudged(config) is None


def judge(config: ParityConfig, parts: list[StagedRun]) -> Staged:
    """The verdict from every rank's ``staged.run_one`` record (rank order)."""
    errors = [p.error for p in parts if p.error]
    if errors:
        return Staged(passed=False, error=errors[0], steps=min(len(p.steps) for p in parts))
    findings: dict[str, Finding] = {}
    local_elements = reduced = reordered = 0
    worst = update_ulp = 0.0

    def found(finding: Finding) -> None:
        findings.setdefault(finding.stage, finding)

    for index in range(min(len(p.steps) for p in parts)):
        for rank, part in enumerate(parts):
            step = part.steps[index]
            local_elements += _local(index, rank, step, found)
        head = parts[0].steps[index]
        for name, bounded in head.reduction.items():
            reduced += bounded.elements
            worst = max(worst, bounded.worst_ratio)
            if bounded.violations:
                found(
                    Finding(
                        step=index,
                        stage="reduction",
                        what=name,
                        detail=_outside(bounded.elements, bounded.violations, bounded.worst_ratio),
                    )
                )
        missing, extra = head.reduction_names
        if missing or extra:
            found(
                Finding(
                    step=index,
                    stage="reduction",
                    what=", ".join((missing + extra)[:3]),
                    detail="reduced by one side only",
                )
            )
        reordered += head.reordered
        _clip(index, parts, found)
        update_ulp = max(update_ulp, _update(index, head, found))
        for rank, part in enumerate(parts):
            _scalars(index, rank, part.steps[index], found)
    ordered = tuple(sorted(findings.values(), key=lambda f: (f.step, _ORDER.index(f.stage))))
    return Staged(
        passed=not ordered,
        steps=min(len(p.steps) for p in parts),
        findings=ordered,
        local_elements=local_elements,
        reduced_elements=reduced,
        worst_ratio=worst,
        reordered=reordered,
        update_max_ulp=update_ulp,
        reordering_drift=tuple(parts[0].drift or ()),
    )


_ORDER = ("loss", "local", "reduction", "clip", "update", "buffer", "scale")


Found = Callable[[Finding], None]
"""Where a stage's finding goes (the first of each stage is kept)."""


def _outside(elements: int, violations: int, ratio: float) -> str:
    return (
        f"{int(violations)} of {int(elements)} reduced elements outside the order-free bound "
        f"(worst {ratio:.3g} times it): no order of summation gives these"
    )


def _local(index: int, rank: int, step: StagedStep, found: Found) -> int:
    cand_loss, ref_loss = step.loss
    if not (cand_loss == ref_loss or (math.isnan(cand_loss) and math.isnan(ref_loss))):
        found(
            Finding(
                step=index,
                stage="loss",
                what="loss",
                rank=rank,
                detail=f"candidate {cand_loss!r}, reference {ref_loss!r} from the same state",
            )
        )
    for name, buffer in step.buffers.items():
        if buffer.differing:
            detail = (
                f"{buffer.differing} of {buffer.elements} elements differ after the step "
                f"(max {buffer.max_ulp:g} ulp)"
            )
            found(Finding(step=index, stage="buffer", what=name, rank=rank, detail=detail))
    if step.local is None:
        return 0
    total = 0
    for name, local in step.local.items():
        total += local.elements
        if local.differing:
            found(
                Finding(
                    step=index,
                    stage="local",
                    what=name,
                    rank=rank,
                    detail=(
                        f"{local.differing} of {local.elements} local gradient elements differ "
                        f"(max {local.max_ulp:g} ulp) before any reduction: the candidate computes otherwise"
                    ),
                )
            )
    return total


def _clip(index: int, parts: list[StagedRun], found: Found) -> None:
    for rank, part in enumerate(parts):
        clip = part.steps[index].clip
        if clip is None:
            continue
        cand_norm, own = clip
        elements = sum(bounded.elements for bounded in parts[0].steps[index].reduction.values())
        if not clip_norm.agrees(own, cand_norm, profiles.EXACT, elements):
            found(
                Finding(
                    step=index,
                    stage="clip",
                    what="total norm",
                    rank=rank,
                    detail=(
                        f"candidate {cand_norm!r}, reference {own!r} from the same gradients (beyond what any "
                        f"order of summing {elements} squares gives)"
                    ),
                )
            )


def _update(index: int, head: StagedStep, found: Found) -> float:
    worst = 0.0
    for name, update in head.update.items():
        worst = max(worst, update.max_ulp)
        if update.differing:
            found(
                Finding(
                    step=index,
                    stage="update",
                    what=name,
                    detail=(
                        f"{update.differing} of {update.elements} elements differ after the optimizer step "
                        f"from the same state and gradients (max {update.max_ulp:g} ulp; held to bitwise)"
                    ),
                )
            )
    return worst


def _scalars(index: int, rank: int, head: StagedStep, found: Found) -> None:
    pairs: tuple[tuple[str, tuple[float, float]], ...] = (("scale", head.scale), ("tracker", head.tracker))
    for key, (cand, ref) in pairs:
        if cand != ref:
            found(
                Finding(
                    step=index,
                    stage="scale",
                    what=key,
                    rank=rank,
                    detail=f"candidate {cand!r}, reference {ref!r} from the same state and gradients",
                )
            )
