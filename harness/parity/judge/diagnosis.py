"""Where a failed row's report says it began: the module, or the stage or state, and by what.

Why one function: the report prints it, the diagnosis matrix (``suites/parity/test_diagnosis.py``)
scores the report by it (a planted bug's place and cause, named), and both must read the same
thing. The place is, in order of precision: the state a resume cause names as lost (the audit
measured it); the first diverging module of a localization from a common state (a module that
drift moved is never named: an approximate localization gives way to the measured stage); the
stage the first difference was measured in (``measured.py``). Pure, controller side.
"""

from __future__ import annotations

import dataclasses

from harness.parity.judge.causes import resume, rounding
from harness.parity.judge.result import ParityResult, measured_of

ROUNDING = frozenset(known.name for known in rounding.CAUSES)
"""The causes that call a difference rounding: never on a row the staged check did not clear."""

_STATE = {
    "resume_weights_not_restored": "weights",
    "resume_weights_late": "weights",
    "resume_shard_misplaced": "weights",
    "resume_optimizer_not_restored": "optimizer",
    "resume_step_counter_reset": "optimizer",
    "resume_scaler_not_restored": "scaler",
    "resume_rng_not_restored": "rng",
    "resume_scheduler_not_restored": "scheduler",
}
"""The state each resume cause says was lost."""
assert set(_STATE) == {known.name for known in resume.CAUSES}, "every resume cause names its state"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Place:
    """Where the report says a failed row began."""

    where: str
    """A module's qualified name (``blocks.1``), a stage (``reduction``, ``clip``, ``update``,
    ``loss``, ...) or a lost state (``optimizer``, ``scaler``); empty: not measured."""
    how: str
    """By what: ``resume audit``, ``localization``, ``staged check``, ``straight runs``."""

    def describe(self) -> str:
        if not self.where:
            return "where it began was not measured from a common state"
        return f"it began in {self.where} (by the {self.how})"


def place(result: ParityResult) -> Place:
    """The place ``result``'s report names (module docstring)."""
    lost = [_STATE[c.name] for c in result.causes if c.name in _STATE]
    if lost:
        return Place(where=lost[0], how="resume audit")
    located = result.localization
    if located is not None and located.first is not None and not located.error and not located.approximate:
        return Place(where=located.first.module.split("#")[0].split("[")[0], how="localization")
    measured = measured_of(result)
    if not measured.source or measured.stage is None:
        return Place(where="", how="")
    return Place(where=measured.stage, how="staged check" if measured.source == "staged" else "straight runs")
