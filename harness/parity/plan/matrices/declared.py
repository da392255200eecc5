"""What a user trains with beyond the model, as their workload declares it or a front door says.

Why apart: the workload's matrix (``workload.py``) and the loop's rows (``loop.py``) both read it,
and the three front doors (the CLI's flags, ``parity_test(declared=...)``, torchrun's) build it.
"""

from __future__ import annotations

import dataclasses

from harness.parity.plan import recipe as recipes
from harness.parity.workload import registry
from harness.parity.workload.spec import WorkloadError

DEFAULT_ACCUMULATE = 2
"""Microbatches per step in the loop rows when the user names none."""
DEFAULT_STEPS = 6
"""Steps per run when the workload declares none (``Workload.steps``)."""


def fault_steps(steps: int) -> tuple[int, ...]:
    """Where planted faults go in a run of ``steps``: step 2 (after the scale settled) and the last
    step, as far as the run is long enough (the scale then backs off twice)."""
    first = min(2, steps - 1)
    return (first,) if steps - 1 <= first + 1 else (first, steps - 1)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Declared:
    """What a user trains with beyond the model: the precision recipe, the loop's features and the
    step a resume row saves at. A workload declares its own (``Workload.recipe``, ``clip``,
    ``accumulate``, ``sync``, ``checkpoint``, ``save``/``load``); the CLI's flags
    (``--recipe``, ``--clip``, ...) and ``parity_test(declared=...)`` replace any of them
    (:meth:`over`). Not a configuration's ``Loop``: a declaration may leave a feature open
    (accumulation without a sync mode checks both modes), where a configuration runs one loop."""

    recipe: str | None = None
    """A name of ``recipe.RECIPES`` (``bf16-reduce32``); ``None``: the workload's own, if any."""
    clip: float | None = None
    """The max norm the user clips at after ``unscale_`` (every layout's rows clip at it; without
    it, four layouts clip at 1.0)."""
    accumulate: int | None = None
    """Microbatches per step (without it or :attr:`sync`, two, under four layouts)."""
    sync: str | None = None
    """``every`` or ``last`` (``None`` with :attr:`accumulate`: both modes)."""
    checkpoint: bool = False
    """The user checkpoints the units' activations (with RNG replay)."""
    resume_at: int | None = None
    """Resume rows saving after that step (a workload with ``save``/``load`` has them halfway)."""

    def over(self, workload: str) -> Declared:
        """These choices over ``workload``'s own declaration (a :class:`WorkloadError` naming the
        recipes for an unknown one)."""
        spec = registry.get(workload)
        recipe = self.recipe or spec.recipe
        if recipe is not None:
            try:
                recipes.parse(recipe)
            except ValueError as error:
                raise WorkloadError(f"workload {spec.name!r}: {error}") from None
        return Declared(
            recipe=recipe,
            clip=spec.clip if self.clip is None else self.clip,
            accumulate=spec.accumulate if self.accumulate is None else self.accumulate,
            sync=spec.sync if self.sync is None else self.sync,
            checkpoint=self.checkpoint or spec.checkpoint,
            resume_at=self.resume_at,
        )

    @property
    def accumulates(self) -> bool:
        """Gradient accumulation is declared (a count, or a sync mode)."""
        return self.accumulate is not None or self.sync is not None

    def loop_words(self) -> str | None:
        """The loop declared, in words (what ``--list`` and the report say); ``None`` when none is."""
        words = []
        if self.clip is not None:
            words.append(f"clip_grad_norm_ at {self.clip:g} after unscale_")
        if self.accumulates:
            count = DEFAULT_ACCUMULATE if self.accumulate is None else self.accumulate
            mode = {"last": ", syncing the last", "every": ", syncing every one"}.get(
                self.sync or "", ", both sync modes"
            )
            words.append(f"{count} microbatches per step{mode}")
        if self.checkpoint:
            words.append("units checkpointed")
        return "; ".join(words) or None
