"""One verdict per configuration: merge what the ranks sent, compare, and say what it means.

Why apart from ``compare.py``: the comparison is about two runs; a result also knows the
configuration (its tolerance profile, whether it could run here, whether it is *expected* to fail,
as torch's scaler is on some paths) and keeps the curves the report plots. Pure: no processes.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from harness.failure_text import headline_of_text, without_rank_prefix
from harness.parity.judge import causes, compare, measured, pinpoint
from harness.parity.judge import semantics as semantics_check
from harness.parity.judge import staged as staged_check
from harness.parity.judge.causes import function, two_d
from harness.parity.judge.expected import expected_failure
from harness.parity.plan import profiles
from harness.parity.plan.config import ParityConfig, poisoned_steps
from harness.parity.ranks.measure import gap, ulp
from harness.parity.ranks.measure.distance import TensorDiff
from harness.parity.ranks.measure.record import RunRecord, joined, merge_rank_runs
from harness.parity.ranks.sides.twin import DTYPES
from harness.parity.ranks.wire import Gap, RankRow
from harness.torch_private import UnsupportedTorch

STATUSES = ("pass", "fail", "crash", "error", "skip")
"""``pass``: within the profile at every step; ``fail``: diverged; ``crash``: the candidate raised;
``error``: the reference (the harness's side) could not run; ``skip``: cannot run here (``reason``)."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Curves:
    """Per-step series of one run, for the report and the CI gate (rank 0's view unless named)."""

    loss: tuple[tuple[float, ...], ...] = ()
    """By step, by rank."""
    scale: tuple[float, ...] = ()
    grad_norm: tuple[float, ...] = ()
    """The 2-norm of all unscaled gradients (float64), ``inf``/``nan`` when they are."""
    skipped: tuple[bool, ...] = ()

    @classmethod
    def of(cls, run: RunRecord) -> Curves:
        norms = []
        for step in run.steps:
            if step.grad_norm is not None:  # from the ranks' sums of squares
                norms.append(step.grad_norm)
                continue
            total = 0.0
            for grad in step.grads.values():
                total += float(grad.double().pow(2).sum())
            norms.append(math.sqrt(total) if math.isfinite(total) else total)
        return cls(
            loss=tuple(step.losses for step in run.steps),
            scale=tuple(step.scales[0] for step in run.steps),
            grad_norm=tuple(norms),
            skipped=tuple(step.skipped_anywhere() for step in run.steps),
        )


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ParityResult:
    """The verdict on one configuration."""

    config: ParityConfig
    status: str
    profile: str
    reason: str = ""
    """Why it was skipped, or the first divergence / crash / error in one line."""
    expected_failure: str = ""
    """Non-empty when this row is expected to fail (torch's scaler on a path where it is wrong)."""
    detail: str = ""
    """The full text behind an ``error`` or ``crash``: the harness's report of a failed batch (every
    rank's traceback or exit, stacks at a deadline), or the candidate's traceback."""
    divergences: tuple[compare.Divergence, ...] = ()
    worst: TensorDiff | None = None
    max_loss_diff: float = 0.0
    skipped_steps: tuple[int, ...] = ()
    """Steps the candidate skipped (any optimizer, any rank)."""
    reference_skipped_steps: tuple[int, ...] = ()
    counters: tuple[dict[str, int], ...] = ()
    """The candidate scaler's counters, by rank (ours only)."""
    time_s: float = 0.0
    """Wall time of the candidate run, plus the reference's when it was not shared with an earlier one."""
    reference: str = ""
    """What the reference was, in words."""
    candidate: str = ""
    curves: dict[str, Curves] = dataclasses.field(default_factory=dict)
    """``reference`` and ``candidate`` curves."""
    max_ulp: float = 0.0
    """The largest distance in ULPs of any loss or tensor compared (0: bitwise everywhere)."""
    distances: tuple[compare.StepDistance, ...] = ()
    """Per step, the largest distances (ULP and relative) and whether a check failed."""
    at_first: tuple[TensorDiff, ...] = ()
    """Every loss and tensor compared at the first diverging step."""
    causes: tuple[causes.Cause, ...] = ()
    """Known causes whose pattern matches the first divergence and whose premise the row's evidence
    measured (``causes/``)."""
    ruled_out: tuple[causes.RuledOut, ...] = ()
    """Known causes whose pattern matched but whose premise the evidence refutes, with why."""
    expected_gap: Gap | None = None
    """Mixed precision only: how far the reference itself is from a plain float32 run of the same
    workload (the gap the precision is expected to cost), next to the candidate's distance."""
    localization: pinpoint.Localization | None = None
    """The first diverging module at the first diverging step (failed configurations only)."""
    staged: staged_check.Staged | None = None
    """The staged check's verdict, for a row whose straight comparison was not bitwise: it decided
    the status (``judge/staged.py``)."""
    semantics: semantics_check.Semantics | None = None
    """The ground truth of the row's split (``judge/semantics.py``), when asked for: whether the
    setup computes the whole batch's gradient, a verdict of its own beside :attr:`status`."""
    compile_s: dict[str, float] = dataclasses.field(default_factory=dict)
    """A compiled row (``config.compile``): what compiling cost each side that compiled
    (``reference``, ``candidate``), its first step's time beyond the median of the others, on its
    slowest rank. A reference shared with an earlier row keeps the cost it paid there."""

    def __post_init__(self) -> None:
        assert self.status in STATUSES, self.status

    @property
    def first_diverging_step(self) -> int | None:
        return self.divergences[0].step if self.divergences else None

    @property
    def closeness(self) -> str:
        """``bitwise``, ``≤ N ulp``, ``staged`` (the staged check decided: every stage held from a
        common state) or ``toleranced`` for a pass (what was measured), else empty."""
        if self.status == "pass" and self.staged is not None and self.staged.passed and self.max_ulp > 0:
            return "staged"
        return ulp.label(self.max_ulp, passed=self.status == "pass")

    @property
    def broken(self) -> bool:
        """Breaks its tolerance (or crashed, or could not be judged)."""
        return self.status in ("fail", "crash", "error")

    @property
    def as_expected(self) -> bool:
        """Passed, was skipped, or failed where a failure is expected."""
        return not self.broken or bool(self.expected_failure)


def localizable(result: ParityResult) -> int | None:
    """The step to probe module by module when ``result`` failed, else ``None``: where the staged
    check first found a stage differing from a common state, else the straight comparison's first
    diverging step (where the straight runs crossed their profile: later than the bug when the
    profile let its first steps through, or earlier when drift crossed it first), for
    configurations whose two sides run the same model per rank (not the single-process sparse
    reference, which runs every rank's batch at once, nor a pipeline, whose stages run apart)."""
    mesh = result.config.mesh
    if result.status != "fail" or result.config.reference != "ddp" or (mesh.pp or mesh.user_stages):
        return None  # a pipeline's modules run on the ranks of their stages only
    found = result.staged
    if found is not None and not found.error and found.findings:
        return found.findings[0].step
    return result.first_diverging_step


def skipped(config: ParityConfig, reason: str) -> ParityResult:
    return ParityResult(
        config=config, status="skip", profile=profiles.profile_for(config).name, reason=reason
    )


def failed_batch(config: ParityConfig, report: str) -> ParityResult:
    """``config`` was in a batch that did not come back from every rank (the harness's report):
    the reason names the root cause (which rank, which signal) and where each rank was."""
    from harness.parity.judge import crash_where

    first = report.strip().splitlines()[0] if report.strip() else "the ranks failed"
    where = crash_where.summary(report)
    return ParityResult(
        config=config,
        status="error",
        profile=profiles.profile_for(config).name,
        reason=f"the batch failed on the ranks: {first}" + (f"; {where}" if where else ""),
        expected_failure=expected_failure(config),
        detail=report,
    )


def judge(config: ParityConfig, parts: list[RankRow]) -> tuple[ParityResult, RunRecord, RunRecord | None]:
    """The verdict on ``config`` from every rank's ``entry.run_one`` record (ordered by rank),
    with the merged reference and candidate records."""
    reference, candidate = _merged(parts)
    gaps = [p.fp32_gap for p in parts]
    return verdict(config, reference, candidate, gaps=gaps, reused=parts[0].reference_reused)


def _merged(parts: list[RankRow], first_step: int = 0) -> tuple[RunRecord, RunRecord | None]:
    reference = merge_rank_runs(
        "reference", parts[0].reference_description, [p.reference for p in parts], first_step=first_step
    )
    candidates = [p.candidate for p in parts if p.candidate is not None]
    candidate = (
        None
        if len(candidates) < len(parts)
        else merge_rank_runs("candidate", parts[0].candidate_description, candidates, first_step=first_step)
    )
    return reference, candidate


def judge_halves(
    config: ParityConfig, first: list[RankRow], second: list[RankRow] | None
) -> tuple[ParityResult, RunRecord, RunRecord | None]:
    """The verdict on a resharded row from its two halves (``ranks/phases.py``: every rank's
    record at the saving world size, then at the resuming one; ``second`` is ``None`` when the
    first half failed and the second never ran), judged as one run of each side."""
    reference, candidate = _merged(first)
    if second is not None and candidate is not None:
        assert config.resume.at is not None and config.resume.world_size is not None
        later_reference, later_candidate = _merged(second, first_step=config.resume.at)
        sizes = f"at world size {config.world_size}, then {later_reference.description}"
        reference = joined(reference, later_reference, f"{reference.description} {sizes}")
        if later_candidate is None:  # the second half's reference failed: the row is an error
            candidate = None
        else:
            text = f"{candidate.description} at world size {config.world_size}, then {later_candidate.description}"
            candidate = joined(candidate, later_candidate, text)
    return verdict(config, reference, candidate, gaps=[None], reused=False)


_REFUSED = f"{UnsupportedTorch.__module__}.{UnsupportedTorch.__qualname__}: "


def torch_refusal(error: str | None) -> str | None:
    """The reason a run was refused by the installed torch (an adapter of ``harness/torch_private``
    raised :class:`UnsupportedTorch`: the row is a skip naming the version and what needs a newer
    one, never an error), or ``None``."""
    line = without_rank_prefix(headline_of_text(error or ""))
    return line.removeprefix(_REFUSED) if line.startswith(_REFUSED) else None


def verdict(
    config: ParityConfig,
    reference: RunRecord,
    candidate: RunRecord | None,
    *,
    gaps: list[Gap | None],
    reused: bool,
) -> tuple[ParityResult, RunRecord, RunRecord | None]:
    """The verdict on ``config`` from its two runs (``gaps``: each rank's expected gap, or
    ``None``s; ``reused``: the reference was shared with an earlier row, so its time is not this
    row's)."""
    profile = profiles.profile_for(config)
    common = {
        "config": config,
        "profile": profile.name,
        "expected_failure": expected_failure(config),
        "reference": reference.description,
    }
    refusal = torch_refusal(reference.error) or torch_refusal(candidate.error if candidate else None)
    if refusal is not None:
        return (
            ParityResult(status="skip", reason=refusal, detail=reference.error or "", **common),
            reference,
            candidate,
        )
    if reference.error or candidate is None:
        text = [headline_of_text(reference.error or "") or "reference failed"]
        return (
            ParityResult(
                status="error",
                reason=f"{_REFERENCE_FAILED.get(config.engine, 'the reference failed')}: {text[0]}",
                detail=reference.error or "",
                time_s=reference.duration_s,
                **common,
            ),
            reference,
            candidate,
        )
    comparison = compare.compare_runs(
        reference, candidate, profile=profile, poisoned_steps=poisoned_steps(config)
    )
    status = "pass" if comparison.ok else ("crash" if candidate.error else "fail")
    measured_gaps = [g for g in gaps if g is not None]
    expected_gap = gap.merge(measured_gaps) if gaps and len(measured_gaps) == len(gaps) else None
    first = comparison.first
    result = ParityResult(
        status=status,
        reason=first.message if first else "",
        divergences=comparison.divergences,
        worst=comparison.worst,
        max_loss_diff=comparison.max_loss_diff,
        skipped_steps=tuple(s.step for s in candidate.steps if s.skipped_anywhere()),
        reference_skipped_steps=tuple(s.step for s in reference.steps if s.skipped_anywhere()),
        counters=candidate.counters,
        detail=candidate.error or "",
        time_s=candidate.duration_s + (0.0 if reused else reference.duration_s),
        candidate=candidate.description,
        curves={"reference": Curves.of(reference), "candidate": Curves.of(candidate)},
        max_ulp=comparison.max_ulp,
        distances=comparison.steps,
        at_first=comparison.at_first,
        expected_gap=expected_gap,
        compile_s={
            role: run.compile_s
            for role, run in (("reference", reference), ("candidate", candidate))
            if run.compile_s is not None
        },
        **common,
    )
    return explained(result, reference, candidate), reference, candidate


def measured_of(result: ParityResult) -> measured.Measured:
    """Where ``result``'s first difference was measured to begin, from its strongest evidence
    (``measured.py``): the staged check when it ran, else the straight comparison, refined by a
    localization from the same common state."""
    found = result.staged
    if found is not None and not found.error:
        return measured.from_staged(((f.step, f.stage, f.said()) for f in found.findings), found.reordered)
    if found is not None:
        why_not = f"the staged check could not run ({found.summary()})"
    else:
        why_not = staged_check.unjudged(result.config) or "the staged check was not asked to judge it"
    straight = causes.straight_measured(_comparison(result), why_not)
    located = result.localization
    if straight.step is None or located is None or located.error or located.approximate:
        return straight
    return measured.refined(straight, located.step, located.first is None)


def _comparison(result: ParityResult) -> compare.Comparison:
    return compare.Comparison(
        profile=profiles.profile_for(result.config),
        divergences=result.divergences,
        worst=result.worst,
        max_loss_diff=result.max_loss_diff,
        max_ulp=result.max_ulp,
        steps=result.distances,
        at_first=result.at_first,
    )


def explained(result: ParityResult, reference: RunRecord, candidate: RunRecord | None) -> ParityResult:
    """``result`` with its known causes weighed against all of its evidence so far: the straight
    comparison, the staged check, the localization (``causes/``). A row that passed has none."""
    if result.status not in ("fail", "crash") or candidate is None:
        return dataclasses.replace(result, causes=(), ruled_out=())
    config = result.config
    weighed = causes.weigh(
        reference,
        candidate,
        _comparison(result),
        poisoned_steps=poisoned_steps(config),
        reduce_dtype=_low_reduce_dtype(config),
        measured=measured_of(result),
        localization=result.localization,
        config=config,
    )
    crashed = two_d.plan_incomplete(config, candidate.error) or function.never_reduced_crash(
        candidate.facts, candidate.error
    )
    named = weighed.named + ((crashed,) if crashed is not None else ())
    return dataclasses.replace(result, causes=named, ruled_out=weighed.ruled_out)


_REFERENCE_FAILED = {
    "user": "your function's unsharded twin failed (with your policies: yours may fail alike)"
}
"""How a failed reference is introduced, by candidate engine (a user's function: its twin)."""


def _low_reduce_dtype(config: ParityConfig) -> torch.dtype | None:
    """The float16/bfloat16 dtype both runs sum their ranks' gradients in (the candidate's policy,
    which its twin reference mirrors), else ``None``: what ``causes.rounding.reduce_order`` needs."""
    if config.policy is None or config.reference != "ddp":
        return None
    reduce = DTYPES[config.policy.reduce_dtype]
    return None if reduce == torch.float32 else reduce
