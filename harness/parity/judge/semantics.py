"""The ground truth's verdict: does the candidate's setup compute the whole batch's gradient?

Why a separate stage with its own status: every other verdict compares the candidate with a DDP
twin that splits the data exactly as it does, so a setup that means another thing than the whole
global batch (a per-microbatch mean over uneven counts, repeated samples, per-rank statistics)
passes them all. This stage compares the split with the whole batch in float64 on one process
(``ranks/truth/stage.py``) and says ``pass``, ``fail`` (a semantic difference: never blamed on
rounding, which float64 keeps some six orders of magnitude below :data:`BOUND`), ``skip`` (the
workload cannot be judged so, with why) or ``error`` (the stage could not run, or the model is
too ill-conditioned for the bound). The low-precision and sharded verdicts are unchanged.

One split is shared by every row that trains the same workload, seed and steps over the same
data-parallel size and microbatch count (:func:`key`): the runner measures each split once.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from harness.parity.judge.causes import semantics as causes
from harness.parity.judge.evidence import Cause, RuledOut
from harness.parity.plan.config import ParityConfig
from harness.parity.ranks.truth.gradients import BOUND, ROUNDING_ROOM
from harness.parity.ranks.wire import TruthRun
from harness.parity.workload import registry

STATUSES = ("pass", "fail", "skip", "error")


def key(config: ParityConfig) -> tuple[object, ...]:
    """What the ground truth of ``config`` depends on (rows with one key share one measurement)."""
    piped = config.mesh.pp is not None  # a pipeline's microbatches are cut from each batch
    return (
        config.workload,
        config.seed,
        config.steps,
        config.mesh.data_parallel_size(config.world_size),
        config.mesh.microbatches if piped else config.loop.accumulate,
        *(("cut",) if piped else ()),
    )


def name(config: ParityConfig) -> str:
    """The split's name in the report: ``mlp-dp2-acc2``, a pipeline's ``llama-dp1-mb4`` (the
    workload's own name)."""
    spec, _, _, ranks, microbatches, *cut = key(config)
    try:
        workload = registry.get(str(spec)).name
    except Exception:  # noqa: BLE001 - a name is only a label: the spec will do
        workload = str(spec)
    word = "mb" if cut else "acc"
    return f"{workload}-dp{ranks}" + (f"-{word}{microbatches}" if microbatches > 1 else "")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Semantics:
    """The ground truth's verdict on one split."""

    name: str
    status: str
    split: str = ""
    """How the candidate's setup splits a step, in words."""
    step: int | None = None
    """The first step whose split differs from the whole batch (``fail``)."""
    distance: float = 0.0
    """The largest distance measured (at :attr:`step` when it failed), relative to the whole batch's largest element."""
    rounding: float = 0.0
    """The largest distance a reordering of the whole batch alone moved."""
    bound: float = BOUND
    steps: int = 0
    """Steps measured."""
    cause: Cause | None = None
    ruled_out: tuple[RuledOut, ...] = ()
    module: str = ""
    """The first module whose outputs on the pieces differ (``fail``, when one does)."""
    reason: str = ""
    """Why it failed, was skipped or could not run, in one line."""
    detail: str = ""
    duration_s: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status in ("pass", "skip")

    def line(self) -> str:
        """One line for the terminal: the split, its status and :meth:`says`."""
        head = f"{self.name} ({self.split})" if self.split else self.name
        return f"{head}: {self.status}: {self.says()}"

    def says(self) -> str:
        """What the verdict says, without the split's name and status."""
        if self.status == "pass":
            return (
                f"{self.steps} steps within {self.distance:.2g} of the whole batch (bound "
                f"{self.bound:.0e}; a reordering alone: {self.rounding:.2g}), {self.duration_s:.2f}s"
            )
        return self.reason

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "split": self.split,
            "step": self.step,
            "distance": self.distance,
            "rounding": self.rounding,
            "bound": self.bound,
            "steps": self.steps,
            "cause": self.cause.name if self.cause is not None else None,
            "cause_text": self.cause.describe() if self.cause is not None else "",
            "ruled_out": [{"name": r.name, "why": r.why} for r in self.ruled_out],
            "module": self.module,
            "reason": self.reason,
            "seconds": round(self.duration_s, 3),
        }


def judge(config: ParityConfig, run: TruthRun) -> Semantics:
    """The verdict on ``config``'s split from what the stage measured."""
    base = {"name": name(config), "split": run.split, "duration_s": run.duration_s, "steps": len(run.steps)}
    if run.error:
        return Semantics(status="error", reason=run.error.strip().splitlines()[-1], detail=run.error, **base)
    if run.unsupported:
        return Semantics(status="skip", reason=run.unsupported, **base)
    rounding = max((step.rounding for step in run.steps), default=0.0)
    distance = max((step.distance for step in run.steps), default=0.0)
    base.update(rounding=rounding, distance=distance)
    if rounding > BOUND * ROUNDING_ROOM:
        return Semantics(
            status="error",
            reason=(
                f"the whole batch reversed moved the gradient by {rounding:.3g} (relative) in float64: this "
                f"model is too ill-conditioned for the bound {BOUND:.0e} to separate rounding from meaning"
            ),
            **base,
        )
    last = run.steps[-1] if run.steps else None
    if last is None or last.distance <= BOUND:
        return Semantics(status="pass", **base)
    ranks, microbatches = key(config)[3], key(config)[4]
    cause, ruled_out = causes.weigh(last, causes.Split(ranks=ranks, microbatches=microbatches))  # type: ignore[arg-type]
    module = f"{last.module[0]} ({last.module[1]})" if last.module is not None else ""
    reason = (
        f"step {last.step}: the split's gradient is {last.distance:.3g} (relative) from the whole batch's, "
        f"past float64's bound {BOUND:.0e}: the setup trains unlike the whole batch"
        + (f"; known cause ({cause.name})" if cause is not None else "; no known cause matches")
        + (f"; first module whose outputs differ: {module}" if module else "")
    )
    return Semantics(
        status="fail", step=last.step, cause=cause, ruled_out=ruled_out, module=module, reason=reason, **base
    )
