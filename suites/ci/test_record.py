"""The behaviour record holds (``ci/record.py``): every recorded matrix lists the recorded
configurations, in order, and each row keeps its recorded verdict, what it measured and its causes.

The ids are checked here (no rank runs); the verdicts in the tier that runs each matrix: the
default matrix at world sizes 2 and 4 and the user's workload in ``make world-sizes``, the 2-D
rows in ``make two-d``, the resharded rows in ``make reshard``.
"""

from __future__ import annotations

import pytest

from ci import record
from harness.parity.doors import runner
from suites.parity.support import ranks_executor


@pytest.mark.parametrize("name", sorted(record.MATRICES))
def test_every_recorded_matrix_lists_the_recorded_configurations_in_order(name):
    ids = [config.id for config in record.MATRICES[name]()]
    assert ids == [row[0] for row in record.read(name)]


def test_a_verdict_that_differs_from_the_record_is_named():
    recorded = [("a", "pass", "bitwise", "exact", ""), ("b", "pass", "staged", "exact", "")]
    found = [("a", "fail", "", "exact", "forward_differs"), ("b", "pass", "bitwise", "exact", "")]
    assert record.differences(recorded, found) == [
        "a: status 'fail', recorded 'pass'",
        "a: closeness '', recorded 'bitwise'",
        "a: causes 'forward_differs', recorded ''",
        "b: closeness 'bitwise', recorded 'staged'",  # a fused row's too: bitwise on every ISA
    ]


def test_a_configuration_missing_from_a_run_is_named():
    recorded = [("a", "pass", "bitwise", "exact", "")]
    assert record.differences(recorded, [])[0].startswith("the configurations differ: missing ['a']")


def _verdicts(module_ranks, name):
    configs = record.MATRICES[name]()
    outcomes = runner.run(configs, ranks_executor(module_ranks), keep_records=False)
    found = record.rows_of_results([o.result for o in outcomes])
    return record.differences(record.read(name), found)


@pytest.mark.world_sizes
@pytest.mark.parametrize("name", ["default-w2", "default-w4", "resmlp-w2"])
def test_every_row_keeps_its_recorded_verdict(module_ranks, name):
    found = _verdicts(module_ranks, name)
    assert not found, "\n".join(found)


@pytest.mark.two_d
def test_every_2d_row_keeps_its_recorded_verdict(module_ranks):
    found = _verdicts(module_ranks, "two-d-w4")
    assert not found, "\n".join(found)


@pytest.mark.world_sizes
@pytest.mark.reshard
def test_every_resharded_row_keeps_its_recorded_verdict(module_ranks):
    found = _verdicts(module_ranks, "reshard")
    assert not found, "\n".join(found)
