"""shardscale's multi-process test harness (docs/architecture.md, section 3; usage in docs/harness.md).

Public API::

    @harness.distributed(world_size=(2, 4), backend="gloo")   # runs on every rank
    def test_sum(rank, world_size): ...

    def test_x(ranks):                                          # the `ranks` fixture
        assert ranks.run(module_level_func, 3, world_size=2) == [...]

    harness.current()        # rank, world_size, backend, device, case store (inside a rank)
    harness.heartbeat()      # "still making progress": restarts the case's deadline (hang guard)
    harness.run_subtests(configs, body)
    harness.rank.faults.raise_on(1) / exit_on / signal_on / hang_on / delay_on / corrupt_grad

    class TestX(harness.DistributedTestCase):                  # unittest style (MultiProcessTestCase)
        world_size = 2
        def test_y(self): ...                                   # runs on every rank: self.rank, ...

This package imports neither pytest nor torch at import time; the plugin (``harness.frontends.plugin``) is
loaded by pytest through the ``shardscale`` entry point.
"""

from harness.frontends.testcase import DistributedTestCase, skip_if_lt_x_gpu
from harness.outcome import RankFailure
from harness.rank import faults
from harness.rank.context import RankContext, current, heartbeat, in_rank
from harness.rank.subtests import SubtestFailures, run_subtests
from harness.spec import DistConfig, distributed

__all__ = [
    "DistConfig",
    "DistributedTestCase",
    "RankContext",
    "RankFailure",
    "SubtestFailures",
    "current",
    "distributed",
    "faults",
    "heartbeat",
    "in_rank",
    "run_subtests",
    "skip_if_lt_x_gpu",
]
