"""Where a failed row's first difference began, as far as it was *measured* from a common state.

Why: a known cause is a claim about where a difference began: in the forward, in the reduction,
in the clip, in the optimizer's update. That claim is true only if both sides began that step
from the same state; after a few steps of drift (a clip's norm summed otherwise, a reduction summed in
another order) everything differs a little, and the first check to fail says where the drift
crossed a tolerance, not where a bug is. So each cause's premise (``causes/``) is checked against
this record, made from the strongest evidence the row has:

1. ``staged``: the staged check re-anchored the reference to the candidate's state before every
   step (``ranks/staged.py``): its first finding names the stage (``loss``, ``local``,
   ``reduction``, ``clip``, ``update``, ``buffer``, ``scale``), from the same state by
   construction; no finding: every stage held.
2. ``straight``: the straight runs were bitwise at every step before the first failing one (step
   0 always is), so that step began from a common state; its first failing check names the stage,
   with ``gradients`` where the local computation and the reduction are not told apart (the
   straight records hold reduced gradients only). A localization from that common state tells
   them apart: every module equal on every rank means the reduction (``reduction``), a module
   that differs means the local computation (``local``).
3. nothing: the straight runs had drifted apart before the step and the staged check did not judge
   the row (``why_not`` says why): no stage was measured, and no cause that blames one is named.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

STAGES = ("structure", "loss", "local", "gradients", "reduction", "clip", "scale", "update", "buffer")
"""In the order a step runs them: the tensors' names, shapes and dtypes; the loss; each rank's
local gradients; the gradients where local and reduced are not told apart; the reduction; the
clip; the scaler's found_inf, skip decision, scale and tracker; the optimizer's update; buffers."""

_STRAIGHT = {
    "names": "structure",
    "shape": "structure",
    "dtype": "structure",
    "loss": "loss",
    "grad": "gradients",
    "clip_norm": "clip",
    "agreement": "scale",
    "skipped": "scale",
    "found_inf": "scale",
    "scale": "scale",
    "tracker": "scale",
    "param": "update",
    "optim_state": "update",
    "buffer": "buffer",
}
"""The stage each of the straight comparison's checks (``Divergence.what``) belongs to."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Measured:
    """What was measured about one row's first difference."""

    source: str
    """``staged``, ``straight``, or ``""`` (nothing was measured from a common state)."""
    step: int | None = None
    """The step the stage was measured at."""
    stage: str | None = None
    """The first stage that did not hold (one of :data:`STAGES`); ``None`` with a source: every
    stage held."""
    detail: str = ""
    """The finding that named the stage, in words."""
    reordered: int = 0
    """``staged``: reduced elements whose bits differ from the reference's mirror of the
    candidate's own reduction (summed in another order); 0: mirrored bitwise."""
    why_not: str = ""
    """With no source: why nothing was measured."""
    localized: bool = False
    """``gradients`` was told apart by a localization from the common state."""

    @property
    def held_everywhere(self) -> bool:
        """The staged check held at every stage of every step."""
        return self.source == "staged" and self.stage is None

    def words(self) -> str:
        """What was measured, for a sentence that rules a cause out."""
        if not self.source:
            return f"nothing was measured from a common state ({self.why_not})"
        if self.source == "staged":
            if self.stage is None:
                return "the staged check held at every stage"
            by = "the staged check found"
        else:
            by = "the straight runs, bitwise at every earlier step, show"
        return f"{by} the {self.stage} stage differing first, at step {self.step} ({self.detail})"


def from_staged(findings: Iterable[tuple[int, str, str]], reordered: int) -> Measured:
    """From the staged check's findings ``(step, stage, line)`` in step order (the first one is
    where it first did not hold)."""
    first = next(iter(findings), None)
    if first is None:
        return Measured(source="staged", reordered=reordered)
    step, stage, line = first
    return Measured(source="staged", step=step, stage=stage, detail=line, reordered=reordered)


def from_straight(
    divergences: Iterable[tuple[int, str, str]], bitwise_steps: Iterable[tuple[int, bool]], why_not: str
) -> Measured:
    """From the straight comparison: its divergences ``(step, what, message)`` in order, and per
    step whether it was bitwise (``StepDistance``: no ulp apart, no check failed). ``why_not``:
    what to say when the first failing step did not begin from a common state (the straight runs
    had drifted and the staged check did not judge the row)."""
    found = list(divergences)
    if not found:
        return Measured(source="", why_not="the straight runs did not diverge")
    step = found[0][0]
    drifted = [s for s, bitwise in bitwise_steps if s < step and not bitwise]
    if drifted:
        return Measured(
            source="",
            step=step,
            why_not=f"the straight runs already differed at step {drifted[0]}, before step {step}; {why_not}",
        )
    at_step = [(what, message) for s, what, message in found if s == step]
    stages = [(_STRAIGHT[what], message) for what, message in at_step if what in _STRAIGHT]
    if not stages:  # a crash, or a run that stopped early: no stage of a step
        return Measured(
            source="", step=step, why_not=f"the first difference is not a stage's: {at_step[0][1]}"
        )
    stage, message = min(stages, key=lambda s: STAGES.index(s[0]))
    return Measured(source="straight", step=step, stage=stage, detail=message.removeprefix(f"step {step}, "))


def refined(measured: Measured, step: int, modules_equal: bool | None) -> Measured:
    """``measured`` with ``gradients`` told apart by a localization from the common state at
    ``step`` (``modules_equal``: every module's output and output gradient equal on every rank;
    ``None``: no such localization)."""
    if measured.stage != "gradients" or modules_equal is None or step != measured.step:
        return measured
    if modules_equal:
        detail = f"{measured.detail}; every module's output and gradient matched on every rank"
        return dataclasses.replace(measured, stage="reduction", detail=detail, localized=True)
    return dataclasses.replace(measured, stage="local", localized=True)
