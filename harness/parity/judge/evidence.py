"""What a known cause is, what its pattern sees, and the premise that must hold before it is named.

Why its own module: the catalogue's patterns live in one module per family (``causes/``), and each
needs these types without importing the catalogue.

A known cause is a claim: "the gradients were summed in another order", "the divide factor is
off". Each :class:`KnownCause` states its premise, what must have been *measured* for the claim
to be true, and checks it against the row's own evidence before the cause is named
(:meth:`KnownCause.weigh`): a cause that blames a stage (the forward, the reduction, the clip, the
update) is named only when that stage is where the first difference was measured from a common
state (``measured.py``); a rounding explanation only when the staged check held at every stage.
A cause whose pattern matched but whose premise the evidence refutes is not named: the report
lists it as ruled out, with why.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from harness.parity.judge.measured import Measured
from harness.parity.ranks.measure.distance import TensorDiff
from harness.parity.ranks.measure.record import StepRecord
from harness.parity.ranks.wire import FunctionFacts

if TYPE_CHECKING:
    from harness.parity.judge.pinpoint import Localization
    from harness.parity.plan.config import ParityConfig


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Cause:
    """A known cause that matches a divergence, its premise measured."""

    name: str
    """The catalogue's name (``causes/__init__.py`` lists them all)."""
    evidence: str
    """What in the records matched, with numbers."""
    explanation: str
    """What the pattern usually means."""
    reference: str
    """Where to read more (an issue, a document)."""

    def describe(self) -> str:
        return f"known cause ({self.name}): {self.evidence}. {self.explanation} ({self.reference})"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RuledOut:
    """A known cause whose pattern matched the records but whose premise the evidence refutes."""

    name: str
    why: str
    """Its premise, and what was measured instead."""

    def describe(self) -> str:
        return f"ruled out ({self.name}): {self.why}"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Evidence:
    """What a pattern sees: both runs at the first diverging step, what failed there, and what was
    measured about where the difference began."""

    reference: StepRecord
    candidate: StepRecord
    failed: frozenset[str]
    """The ``what`` of every divergence at that step."""
    world_size: int
    grads_compared: bool
    """False at a step with a planted fault (its gradients hold the planted value)."""
    reduce_dtype: torch.dtype | None = None
    """The dtype both runs sum their ranks' gradients in (``None``: not known, or float32)."""
    origin: tuple[StepRecord, StepRecord] | None = None
    """Both runs at the earliest step, up to this one, whose gradients differ at all (steps with a
    planted fault or an overflow skipped): where a difference that grew began."""
    measured: Measured = Measured(source="", why_not="no measurement was given")
    """Where the first difference began, as measured from a common state (``measured.py``)."""
    localization: Localization | None = None
    """The first diverging module, once localized (the causes read from a localization)."""
    config: ParityConfig | None = None
    """The row's configuration (the 2-D causes read its mesh and plan)."""
    facts: FunctionFacts | None = None
    """A user's function: what was read off its modules (never-reduced parameters, split ties)."""
    at_first: tuple[TensorDiff, ...] = ()
    """Every loss and tensor compared at the first diverging step (the straight comparison's)."""


Pattern = Callable[[Evidence], "Cause | None"]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class KnownCause:
    """One entry of the catalogue: a pattern over the evidence and the premise it stands on."""

    name: str
    premise: str
    """What must have been measured for the cause to be true, in words (quoted when ruled out)."""
    pattern: Pattern
    blames: frozenset[str] = frozenset()
    """The stages (``measured.STAGES``) the cause says the difference began in: the row's measured
    first stage must be one of them. Empty: the cause claims nothing about a stage, and its
    premise is a fact of the records that its pattern checks itself (a dtype, a rank's flag)."""
    rounding: bool = False
    """A rounding explanation ("no bug: the last bits of a sum"): named only when the staged check
    held at every stage, which is the only measurement that shows a difference to be rounding."""
    also: Callable[[Measured], str | None] | None = None
    """A further premise on what was measured: why it fails (``None``: it holds)."""

    def refuted(self, measured: Measured) -> str | None:
        """Why ``measured`` refutes the premise (``None``: it holds)."""
        if self.rounding and not measured.held_everywhere:
            return f"needs {self.premise}; {measured.words()}"
        if self.blames and not (measured.source and measured.stage in self.blames):
            return f"needs {self.premise}; {measured.words()}"
        return self.also(measured) if self.also is not None else None

    def weigh(self, evidence: Evidence) -> Cause | RuledOut | None:
        """The cause when its pattern matches and its premise holds, a :class:`RuledOut` when the
        pattern matches but the premise does not, ``None`` when the pattern does not match."""
        found = self.pattern(evidence)
        if found is None:
            return None
        why = self.refuted(evidence.measured)
        return found if why is None else RuledOut(name=self.name, why=why)
