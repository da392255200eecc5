"""The parity engine: does a sharded setup train exactly like DDP under loss scaling?

Data flow (one folder per stage; ``docs/architecture.md`` draws it)::

    plan.config.ParityConfig --(runner, controller)--> entry.run_batch (ranks: engines, train, gather)
        --> record.RunRecord (reference, candidate) --> compare.compare_runs (ulp) --> result.ParityResult
            (causes; the expected gap from gap) --> failed? localize (ranks) --> pinpoint, ops
        --> report (parity.json, parity.md), plot (parity.png)

What is trained is a :class:`Workload` (``workload.py``): a model, its data and loss, and its FSDP
units, made by a module-level factory that ranks import by name (``workloads.py`` resolves names,
``checks.py`` rejects unusable ones, ``plan/matrices/workload.py`` lists the configurations that
check one). ``python -m harness.parity`` runs the embedded default matrix (``default_matrix``),
or ``--workload module:function``'s; the pytest suites under ``suites/parity`` expand the same
lists, and ``parity_test`` (``testing.py``) turns a user's workload into tests: ``Declared`` says
what the user trains with beyond the workload's own declaration, ``Scale`` the candidate's scaler,
``Mesh`` a 2-D mesh. A configuration is a small core and its parts (``Layout``, ``Mesh``,
``Precision``, ``Loop``, ``Resume``, ``Scale``, faults). Importing this package imports neither
torch nor the rank side.
"""

from harness.parity.doors.testing import parity_test
from harness.parity.plan.config import (
    Fault,
    Layout,
    Loop,
    Mesh,
    ParityConfig,
    Precision,
    Resume,
    Scale,
    unsupported_reason,
)
from harness.parity.plan.matrices.declared import Declared
from harness.parity.plan.matrices.default import default_matrix
from harness.parity.plan.select import select
from harness.parity.workload.spec import Workload, WorkloadError

__all__ = [
    "Declared",
    "Fault",
    "Layout",
    "Loop",
    "Mesh",
    "ParityConfig",
    "Precision",
    "Resume",
    "Scale",
    "Workload",
    "WorkloadError",
    "default_matrix",
    "parity_test",
    "select",
    "unsupported_reason",
]
