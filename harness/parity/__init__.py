"""The parity engine: does a sharded setup train exactly like DDP under loss scaling?

Data flow (one module per stage; ``docs/architecture.md`` draws it)::

    matrix.ParityConfig --(runner, controller)--> rank_side.run_batch (ranks: engines, train, gather)
        --> record.RunRecord (reference, candidate) --> compare.compare_runs (ulp) --> result.ParityResult
            (causes; the expected gap from gap) --> failed? localize (ranks) --> pinpoint, ops
        --> report (parity.json, parity.md), plot (parity.png)

``python -m harness.parity`` runs the embedded default matrix (``matrix.default_matrix``); the
pytest suites under ``suites/parity`` expand the same lists. Importing this package imports neither
torch nor the rank side.
"""

from harness.parity.matrix import Fault, ParityConfig, default_matrix, unsupported_reason
from harness.parity.select import select

__all__ = ["Fault", "ParityConfig", "default_matrix", "select", "unsupported_reason"]
